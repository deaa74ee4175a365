"""Where a database's schema stands against this code: what `outboxd migrate --check`
prints, and what `serve` checks before it runs (docs/upgrades.md).

Three answers. Current: every migration this code carries is applied (perhaps more, by a
newer release: this code runs on those, since a release's migrations only expand what
the release before it uses). Behind: some are not applied; `serve` without
`storage.auto_migrate` refuses to run on it. Too new: a newer release's contract
migration (one that drops or tightens what older code still uses) has been applied and
says that code knowing fewer than `min_code_schema` migrations must not run on it.

A contract migration records that in `schema_floor`, a table no migration has created yet:
the first contract migration creates it (CREATE TABLE IF NOT EXISTS, then one row). Read
only: nothing here creates a table, a database or a file.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from outboxd.errors import OutboxdError
from outboxd.storage.db import (
    Backend,
    Database,
    Op,
    Query,
    TxBody,
    fetch,
    known_schema_version,
    load_migrations,
)

# A contract migration (docs/upgrades.md) writes here which code may still run after it:
#   CREATE TABLE IF NOT EXISTS schema_floor (
#       version INTEGER PRIMARY KEY,          -- the contract migration's number
#       min_code_schema INTEGER NOT NULL);    -- the newest migration code must know
#   INSERT INTO schema_floor VALUES (<its number>, <the first migration of the release
#       before it>);
FLOOR_TABLE = "schema_floor"
_FLOOR_PRESENT: dict[Backend, Query] = {
    "sqlite": Query(
        "schema_floor_present",
        f"SELECT COUNT(*) AS n FROM sqlite_master WHERE type = 'table' AND name = '{FLOOR_TABLE}'",
        (),
    ),
    "postgres": Query(
        "schema_floor_present",
        f"SELECT COUNT(*) AS n FROM (SELECT to_regclass('{FLOOR_TABLE}') AS t) f "
        "WHERE t IS NOT NULL",
        (),
    ),
}
_FLOOR = Query("schema_floor", f"SELECT MAX(min_code_schema) AS floor FROM {FLOOR_TABLE}", ())


@dataclass(frozen=True)
class SchemaStatus:
    """A database's schema against the migrations this code carries."""

    known: int  # the newest migration this code carries (`outboxd_build_info{schema}`)
    database: int | None  # the newest migration applied; None before the first
    pending: tuple[str, ...]  # this code's migrations not applied yet, oldest first
    floor: int | None = None  # the least `known` a newer release's contract allows

    @property
    def newer(self) -> bool:
        """A newer release migrated the database past what this code knows."""
        return self.database is not None and self.database > self.known

    @property
    def too_new(self) -> bool:
        """A newer release's contract migration rules this code out."""
        return self.floor is not None and self.known < self.floor


def nothing_applied(backend: Backend) -> SchemaStatus:
    """The status of a database that does not exist yet: every migration pending."""
    migrations = load_migrations(backend)
    return SchemaStatus(
        known=max(v for v, _, _ in migrations),
        database=None,
        pending=tuple(name for _, name, _ in migrations),
    )


async def schema_status(db: Database) -> SchemaStatus:
    """Where `db`'s schema stands against this code; reads only."""
    pending = tuple(await db.pending_migrations())
    database = await db.schema_version()
    floor = await db.read(_read_floor(db.backend)) if database is not None else None
    return SchemaStatus(known_schema_version(db.backend), database, pending, floor)


def _read_floor(backend: Backend) -> TxBody[int | None]:
    def body() -> Generator[Op, Any, int | None]:
        (present,) = yield fetch(_FLOOR_PRESENT[backend], {})
        if not present["n"]:
            return None
        (row,) = yield fetch(_FLOOR, {})
        return None if row["floor"] is None else int(row["floor"])

    return body


class SchemaMismatch(OutboxdError):
    """The database's schema is not one this code may run on: `serve` exits 2."""

    event = "schema_mismatch"

    def __init__(self, message: str, status: SchemaStatus) -> None:
        super().__init__(message)
        self.status = status


class SchemaNotMigrated(SchemaMismatch):
    """Migrations this code needs are not applied, and `storage.auto_migrate` is off."""

    event = "schema_not_migrated"

    def __init__(self, status: SchemaStatus) -> None:
        super().__init__(
            f"the database schema is older than this release needs: {len(status.pending)} "
            f"migration(s) pending ({', '.join(status.pending)}); run `outboxd migrate`, or set "
            "storage.auto_migrate = true",
            status,
        )


class SchemaTooNew(SchemaMismatch):
    """A newer release's contract migration rules this code out."""

    event = "schema_too_new"

    def __init__(self, status: SchemaStatus) -> None:
        super().__init__(
            f"the database schema ({status.database}) was contracted by a newer release past "
            f"what this one can run on (it knows {status.known}, the schema needs code that "
            f"knows {status.floor}): run a newer release, or restore a backup taken before "
            "the upgrade",
            status,
        )


def refuse_unless_runnable(status: SchemaStatus) -> None:
    """Raise the mismatch `status` is, if any: a newer contract first, then pending ones."""
    if status.too_new:
        raise SchemaTooNew(status)
    if status.pending:
        raise SchemaNotMigrated(status)
