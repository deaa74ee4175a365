"""`SqlStore`: every storage Protocol, on either database driver.

The logic of each transaction is written once, as a generator body; the SQL it runs
comes from the named blocks of `sql/common.sql`, with per-backend overrides where the
dialects differ (claims: `FOR UPDATE SKIP LOCKED` on Postgres, `BEGIN IMMEDIATE` on
SQLite). Where a write is best done differently, the driver's `Features` say how; no
part of the store asks which backend it runs on. One module per concern of
storage/ports.py: jobs, relay, tasks, pace, stats (with pruning), of
storage/website_ports.py: the websites' classification (websites), of
storage/login_ports.py: the portal login lock (logins), and of storage/breaker_ports.py:
the dependency breakers (breakers), of storage/audit_ports.py: the audit log (audit), and
of storage/growth_ports.py: the tables' size, dead rows and oldest transaction (growth).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

from outboxd.config import Settings
from outboxd.storage import growth_ports, login_ports, ports, website_ports
from outboxd.storage.changes import JobChanges, default_instance
from outboxd.storage.db import Database, backend_of, load_queries, sqlite_path
from outboxd.storage.group import GroupCommitter
from outboxd.storage.notifier import ChangeNotifier, heard
from outboxd.storage.postgres import PostgresDatabase
from outboxd.storage.sqlite import SqliteDatabase
from outboxd.storage.store.audit import SqlAudit
from outboxd.storage.store.breakers import SqlBreakers
from outboxd.storage.store.growth import SqlGrowth
from outboxd.storage.store.jobs import SqlJobs
from outboxd.storage.store.logins import SqlLogins
from outboxd.storage.store.pace import SqlPace
from outboxd.storage.store.relay import SqlRelay
from outboxd.storage.store.stats import SqlStats
from outboxd.storage.store.tasks import SqlTasks
from outboxd.storage.store.websites import SqlWebsites

__all__ = [
    "JOB_CHANNEL",
    "SqlStore",
    "first_step",
    "open_configured",
    "open_database",
    "open_store",
]
T = TypeVar("T")

# The channel every process's committed job changes are notified on (storage/notifier.py).
JOB_CHANNEL = "outboxd_jobs"


class SqlStore(
    SqlJobs,
    SqlLogins,
    SqlBreakers,
    SqlAudit,
    SqlRelay,
    SqlTasks,
    SqlWebsites,
    SqlPace,
    SqlStats,
    SqlGrowth,
):
    """Every storage port. Each method is one transaction body (see `db.TxBody`),
    so SQLite runs it in one thread hop and Postgres on one connection."""

    def __init__(
        self,
        db: Database,
        group_commit: bool = True,
        patience_s: float | None = None,
        instance: str | None = None,
    ) -> None:
        self.db = db
        self.q = load_queries(db.backend)
        self.instance = instance or default_instance()
        # Where the database has notifications, the other processes hear of this one's
        # commits (after each commit, outside its transaction).
        self.notifier = (
            ChangeNotifier(db, self.q["notify_job_changes"]) if db.features.notifies else None
        )
        self.changes = JobChanges(self.notifier)
        # Intake and registration: concurrent calls share one commit (see storage/group.py).
        # Where the driver can, an intake group is first tried as one statement.
        bulk = self._intake_bulk if db.features.intake_in_one_statement else None
        self.group = GroupCommitter(db, bulk=bulk, patience_s=patience_s) if group_commit else None
        self.website_group = GroupCommitter(db, patience_s=patience_s) if group_commit else None

    @property
    def backend(self) -> str:
        return self.db.backend

    def listen_job_changes(
        self, on_change: Callable[[str], None]
    ) -> contextlib.AbstractAsyncContextManager[ports.Listening] | None:
        if not self.db.features.notifies:
            return None
        own = self.notifier.sender if self.notifier is not None else ""

        def on_payload(payload: str) -> None:
            for job_id in heard(payload, own):
                on_change(job_id)

        return self.db.listen(JOB_CHANNEL, on_payload)

    async def close(self) -> None:
        for group in (self.group, self.website_group):
            if group is not None:
                await group.drain()
        if self.notifier is not None:
            await self.notifier.drain()
        await self.db.close()


def _check(store: SqlStore) -> None:
    """mypy proves here that SqlStore satisfies every port."""
    _jobs: ports.JobStore = store
    _login_lock: login_ports.LoginLockStore = store
    _relay_store: ports.RelayStore = store
    _tasks: ports.TaskStore = store
    _websites: website_ports.WebsiteStore = store
    _stats: ports.StatsStore = store
    _prune: ports.PruneStore = store
    _pace: ports.PaceStore = store
    _changes: ports.JobChangeStore = store
    _growth: growth_ports.GrowthStore = store


async def open_database(
    url: str, base_dir: Path, pool_size: int, acquire_timeout_s: float
) -> SqliteDatabase | PostgresDatabase:
    """The driver for `url`, open: the one place a URL picks a driver, and with it the
    `Features` the store and group commit follow."""
    db: SqliteDatabase | PostgresDatabase
    if backend_of(url) == "sqlite":
        db = SqliteDatabase(sqlite_path(url, base_dir), acquire_timeout_s)
    else:
        db = PostgresDatabase(url, pool_size, acquire_timeout_s)
    await db.open()
    return db


async def open_store(
    url: str, base_dir: Path, pool_size: int, acquire_timeout_s: float
) -> SqlStore:
    db = await open_database(url, base_dir, pool_size, acquire_timeout_s)
    return SqlStore(db, patience_s=acquire_timeout_s)


async def open_configured(settings: Settings) -> SqlStore:
    """The store `settings` name: storage.url with its pool and acquire timeout, writing
    as daemon.instance_id when that is set. Migrates nothing."""
    s = settings.storage
    store = await open_store(s.url, settings.base_dir, s.pool_size, s.acquire_timeout_s)
    if settings.daemon.instance_id:
        store.instance = settings.daemon.instance_id
    return store


async def first_step(store: SqlStore, step: Awaitable[T]) -> T:
    """What `step` (the work right after opening `store`) returns; when it fails, the store
    is closed before the error goes on, so a failed start leaves no pool behind."""
    try:
        return await step
    except BaseException:
        await store.close()
        raise
