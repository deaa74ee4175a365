"""A daemon on a database a newer release migrated says so at start (`schema_newer_than_code`,
with both versions), whether it migrates or not; on its own schema it says nothing; on one
a newer release contracted past it, it refuses to start. Both backends: the newer
migration is a row of schema_migrations, as a newer release leaves it."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest
from structlog.testing import capture_logs

from outboxd.config_file import settings_from_mapping
from outboxd.daemon.startup import open_configured_store
from outboxd.metrics import Metrics
from outboxd.storage.db import backend_of, known_schema_version, load_migrations
from outboxd.storage.schema import (
    SchemaNotMigrated,
    SchemaStatus,
    SchemaTooNew,
    nothing_applied,
    schema_status,
)
from outboxd.storage.store import SqlStore, open_configured
from tests.conftest import SettingsFactory
from tests.support.db import raw_execute


async def future_migration(db_url: str, version: int) -> None:
    """What a newer release's migration leaves in schema_migrations."""
    if backend_of(db_url) == "sqlite":
        await raw_execute(
            db_url, "INSERT INTO schema_migrations VALUES (?, ?, 0)", version, "future.sql"
        )
    else:
        await raw_execute(
            db_url, "INSERT INTO schema_migrations (version, name) VALUES (?, ?)", version, "f.sql"
        )


async def start(make_settings: SettingsFactory, auto_migrate: bool) -> list[dict[str, object]]:
    """The store opened as `serve` opens it: the warnings it logged."""
    settings = make_settings(storage={"auto_migrate": auto_migrate})
    with capture_logs() as logs:
        store = await open_configured_store(settings)
    await store.close()
    return [e for e in logs if e["event"] == "schema_newer_than_code"]


@pytest.mark.parametrize("auto_migrate", [True, False])
async def test_a_newer_schema_is_warned_about_at_start(
    store: SqlStore, db_url: str, make_settings: SettingsFactory, auto_migrate: bool
) -> None:
    known = known_schema_version(store.db.backend)
    # On its own schema (the `store` fixture migrated it): nothing to say.
    assert await store.db.schema_version() == known
    assert await start(make_settings, auto_migrate) == []

    await future_migration(db_url, known + 3)
    try:
        assert await store.db.schema_version() == known + 3
        warned = await start(make_settings, auto_migrate)
        # Still nothing pending: the code's own migrations are all there.
        assert await store.db.pending_migrations() == []
    finally:
        # The Postgres test database is shared by the session's tests (emptied, not dropped).
        await raw_execute(db_url, "DELETE FROM schema_migrations WHERE version > ?", known)
    assert len(warned) == 1, warned
    assert warned[0]["log_level"] == "warning"
    assert warned[0]["database_schema"] == known + 3
    assert warned[0]["code_schema"] == known


async def test_an_empty_database_has_no_schema_version(tmp_path: Path) -> None:
    """Before the first migration there is no version to compare (and no warning); without
    `auto_migrate` such a database is refused with every migration pending (SQLite: a file
    that does not exist is not created). SQLite only: the session's Postgres database is
    migrated once for all its tests (tests/acceptance/test_schema_check.py has both)."""
    settings = settings_from_mapping(
        {"storage": {"url": "sqlite:///empty.db", "auto_migrate": False}},
        env={},
        base_dir=tmp_path,
    )
    with capture_logs() as logs, pytest.raises(SchemaNotMigrated) as refused:
        await open_configured_store(settings)
    assert refused.value.status == nothing_applied("sqlite")
    assert not (tmp_path / "empty.db").exists()
    store = await open_configured(settings)
    try:
        assert await store.db.schema_version() is None
        status = await schema_status(store.db)
    finally:
        await store.close()
    assert status.database is None and status.pending == nothing_applied("sqlite").pending
    assert [e for e in logs if e["event"] == "schema_newer_than_code"] == []


async def test_the_schema_status_of_each_kind_of_database(
    store: SqlStore, db_url: str, make_settings: SettingsFactory
) -> None:
    """Current, newer (runs, warned), contracted past this code (refused, migrating or not):
    what `migrate --check` prints and `serve` checks, read the same way on both backends."""
    known = known_schema_version(store.db.backend)
    assert await schema_status(store.db) == SchemaStatus(known, known, ())
    try:
        await future_migration(db_url, known + 1)
        newer = await schema_status(store.db)
        assert (newer.newer, newer.too_new, newer.pending) == (True, False, ())
        await raw_execute(
            db_url,
            "CREATE TABLE schema_floor (version INTEGER PRIMARY KEY, "
            "min_code_schema INTEGER NOT NULL)",
        )
        await raw_execute(db_url, "INSERT INTO schema_floor VALUES (?, ?)", known + 1, known)
        assert (await schema_status(store.db)).too_new is False  # this code is new enough
        await raw_execute(db_url, "INSERT INTO schema_floor VALUES (?, ?)", known + 2, known + 1)
        status = await schema_status(store.db)
        assert (status.floor, status.too_new) == (known + 1, True)
        for auto_migrate in (True, False):
            with pytest.raises(SchemaTooNew):
                await open_configured_store(make_settings(storage={"auto_migrate": auto_migrate}))
    finally:
        # The Postgres test database is shared by the session's tests (emptied, not dropped).
        await raw_execute(db_url, "DROP TABLE IF EXISTS schema_floor")
        await raw_execute(db_url, "DELETE FROM schema_migrations WHERE version > ?", known)


def test_build_info_names_the_schema_the_code_knows() -> None:
    """`outboxd_build_info{schema}`: each backend's newest migration, as the daemon passes it."""
    for backend in ("sqlite", "postgres"):
        newest = max(v for v, _, _ in load_migrations(backend))
        text = generate_latest(Metrics(schema=known_schema_version(backend)).registry).decode()
        assert f'schema="{newest}"' in text, backend
    assert known_schema_version("postgres") == max(v for v, _, _ in load_migrations("postgres"))
    assert backend_of("sqlite:///x.db") == "sqlite"
    assert backend_of("postgresql://127.0.0.1/test") == "postgres"
