"""Start-up: the store opened once its database answers, its schema checked, the keys.

`serve` binds its port first, then waits here for the database (a capped backoff,
systemd's start timeout pushed back meanwhile), migrates when `storage.auto_migrate`,
refuses a schema it must not run on (migrations pending, or contracted by a newer
release), warns of one a newer release migrated, and loads the encryption keys before
anything is built (daemon/components.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Mapping
from typing import Any

import structlog

from outboxd.config import Settings
from outboxd.daemon.sdnotify import SystemdNotifier
from outboxd.errors import OutboxdError, StorageUnavailable
from outboxd.security import KeyRing
from outboxd.storage.db import backend_of, sqlite_path
from outboxd.storage.schema import (
    SchemaMismatch,
    SchemaNotMigrated,
    nothing_applied,
    refuse_unless_runnable,
    schema_status,
)
from outboxd.storage.store import SqlStore, first_step, open_configured
from outboxd.workers.loops import DB_RETRY_BASE_S, DB_RETRY_CAP_S, backoff, sleep_or_stop

log = structlog.get_logger(__name__)


async def open_configured_store(settings: Settings) -> SqlStore:
    """The store, migrated when `storage.auto_migrate`; refused (SchemaMismatch, `serve`
    exits 2) when its schema is one this code must not run on: migrations pending with
    `auto_migrate` off, or a newer release's contract migration (storage/schema.py)."""
    if not settings.storage.auto_migrate:
        refuse_a_missing_sqlite_file(settings)
    store = await open_configured(settings)
    if settings.storage.auto_migrate:
        applied = await first_step(store, store.db.migrate())
        if applied:
            log.info("migrations_applied", migrations=applied)
    status = await first_step(store, schema_status(store.db))
    try:
        refuse_unless_runnable(status)
    except SchemaMismatch:
        await store.close()
        raise
    if status.newer:
        # This code runs on it, blind to what the newer migrations added: a release's
        # migrations keep the release before it working (docs/upgrades.md).
        log.warning(
            "schema_newer_than_code",
            database_schema=status.database,
            code_schema=status.known,
            hint="a newer outboxd migrated this database: run that release, or one as new",
        )
    return store


def refuse_a_missing_sqlite_file(settings: Settings) -> None:
    """Without `auto_migrate`, a SQLite file that does not exist is a schema with every
    migration pending: refused before opening it would create an empty file."""
    url = settings.storage.url
    if backend_of(url) == "sqlite" and not sqlite_path(url, settings.base_dir).exists():
        raise SchemaNotMigrated(nothing_applied("sqlite"))


# While `serve` waits for its database or migrates: a `storage_waiting` line at most this
# often, and systemd's start timeout pushed back by START_EXTEND_S every START_EXTEND_EVERY_S.
STORAGE_WAITING_LOG_S = 10.0
START_EXTEND_S = 30.0
START_EXTEND_EVERY_S = 10.0


async def open_when_reachable(
    settings: Settings, stop: asyncio.Event, notifier: SystemdNotifier
) -> SqlStore | None:
    """The store, opened (and migrated) once the database answers; None when `stop` is set
    first. A database that cannot be reached is waited for with a capped backoff, for
    ever or `storage.start_timeout_s` (then StorageUnavailable naming the key and the
    cause); any other failure (a wrong password, a failed migration) is raised at once.
    Meanwhile systemd's start timeout is extended, so neither the wait nor a long
    migration is killed as a start that hangs."""
    limit_s = settings.storage.start_timeout_s
    started = time.monotonic()
    last_line = -STORAGE_WAITING_LOG_S
    attempts = 0

    async def extend() -> None:
        while True:
            notifier.extend_start(START_EXTEND_S)
            await asyncio.sleep(START_EXTEND_EVERY_S)

    extender = asyncio.create_task(extend())
    try:
        while not stop.is_set():
            attempts += 1
            try:
                store = await _unless_stopped(open_configured_store(settings), stop)
            except StorageUnavailable as exc:
                waited = time.monotonic() - started
                if limit_s and waited >= limit_s:
                    raise StorageUnavailable(
                        f"the database did not answer within storage.start_timeout_s "
                        f"({limit_s:g} s): {exc}"
                    ) from None
                if time.monotonic() - last_line >= STORAGE_WAITING_LOG_S:
                    last_line = time.monotonic()
                    log.warning(
                        "storage_waiting",
                        error=exc,
                        waited_s=round(waited, 1),
                        attempts=attempts,
                        start_timeout_s=limit_s or None,
                    )
                notifier.status(f"waiting for the database ({attempts} tries): {exc}")
                delay = backoff(attempts, DB_RETRY_BASE_S, DB_RETRY_CAP_S, jitter=False)
                if limit_s:
                    delay = min(delay, max(0.0, started + limit_s - time.monotonic()))
                await sleep_or_stop(stop, delay)
                continue
            if store is not None and attempts > 1:
                log.info(
                    "storage_ready",
                    waited_s=round(time.monotonic() - started, 1),
                    attempts=attempts,
                )
            return store
        return None
    finally:
        extender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await extender


async def _unless_stopped(work: Awaitable[SqlStore], stop: asyncio.Event) -> SqlStore | None:
    """`work`'s store, or None (the work cancelled, a store it opened closed) once `stop` is set."""
    task = asyncio.ensure_future(work)
    await first_done(stop.wait(), task)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, OutboxdError):
        store = await task
        await store.close()
    return None


def load_keys(settings: Settings, env: Mapping[str, str]) -> KeyRing:
    keys_file = (
        settings.resolve_path(settings.security.keys_file) if settings.security.keys_file else None
    )
    default_file = None
    if settings.storage.url.startswith("sqlite:///"):
        # The embedded default keeps its key beside the database it protects.
        db_path = sqlite_path(settings.storage.url, settings.base_dir)
        default_file = db_path.with_name(db_path.name + ".keys")
    keys, created = KeyRing.load(keys_file, env, default_file)
    if created and default_file is not None:
        log.warning(
            "encryption_key_created",
            path=str(default_file),
            hint="back this file up with the database; set security.keys_file in production",
        )
    return keys


async def first_done(aw: Awaitable[Any], other: asyncio.Task[Any]) -> None:
    """Wait until `aw` or `other` is done; `aw` is cancelled either way."""
    waiter = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({waiter, other}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()
