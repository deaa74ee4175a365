"""What the growth gauges ask of storage: how much room outboxd's tables take, how many dead
rows wait for vacuum, and how long the oldest open transaction has held it back.

Beside storage/ports.py (one concern per Protocol, as there). Cluster-wide values read from
the database, the same on every instance (docs/operations.md, "Growth in sight").
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final, Protocol

# outboxd's own tables, by the names its migrations give them: on Postgres only these are
# reported (the schema may hold other applications' tables). A migration that adds a table
# adds it here (tests/integration/test_growth.py compares this with the migrated schema).
# On SQLite the file is outboxd's alone, and every table of it is reported.
OUTBOXD_TABLES: Final = (
    "audit_log",
    "dependencies",
    "job_events",
    "jobs",
    "pace",
    "pace_leases",
    "portal_login_failures",
    "portal_login_throttle",
    "relay_outbox",
    "schema_migrations",
    "task_runs",
    "website_registrations",
    "websites",
    "work_outbox",
)
# The `table` labels of SQLite that are not tables: the whole file's tables together, when
# the file is not split table by table, and the file's free pages (which VACUUM would give
# back to the filesystem). Every page of the file is in exactly one label.
ALL_TABLES: Final = "*"
FREE_PAGES: Final = "*free"


@dataclass(frozen=True)
class Growth:
    """`table_bytes`: table -> bytes on disk, its indexes and TOAST included; `dead_rows`
    and `live_rows` (Postgres only: pg_stat_user_tables' estimates): table -> rows;
    `oldest_transaction_age_s`: seconds the oldest transaction open in the database has run
    (None: none is open, or the database cannot tell, as SQLite cannot)."""

    table_bytes: dict[str, int]
    dead_rows: dict[str, int] = field(default_factory=dict)
    live_rows: dict[str, int] = field(default_factory=dict)
    oldest_transaction_age_s: float | None = None


class GrowthStore(Protocol):
    async def growth(self) -> Growth:
        """The database's growth now, in one short read."""
        ...
