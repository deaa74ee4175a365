"""The SQLite driver: one writer thread and one reader thread on a WAL file.

With `storage/postgres.py`, the only modules that import a database library.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypeVar

import structlog

from outboxd.errors import StorageError, StorageUnavailable
from outboxd.storage.db import (
    Backend,
    Done,
    Features,
    Op,
    Outcome,
    TxBody,
    load_migrations,
    next_step,
)
from outboxd.storage.ports import Listening

log = structlog.get_logger(__name__)

T = TypeVar("T")

_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk i/o", "readonly", "full")


def _sqlite_error(exc: sqlite3.Error) -> StorageError:
    text = str(exc)
    if isinstance(exc, sqlite3.OperationalError) and any(
        w in text.lower() for w in _SQLITE_UNAVAILABLE
    ):
        return StorageUnavailable(f"sqlite: {text}")
    return StorageError(f"sqlite: {text}")


def _sqlite_op(conn: sqlite3.Connection, op: Op) -> Any:
    if op.mode == "each":
        cur = conn.executemany(op.q.sql, op.each)
        try:
            return cur.rowcount
        finally:
            cur.close()
    cur = conn.execute(op.q.sql, dict(op.params))
    try:
        if op.mode == "fetch":
            # Plain tuples zipped with the column names: a third cheaper per row than
            # dict(sqlite3.Row), on the writer thread that the relay's rounds keep busy.
            rows = cur.fetchall()
            if not rows:
                return []
            names = [d[0] for d in cur.description]
            return [dict(zip(names, r, strict=True)) for r in rows]
        return cur.rowcount
    finally:
        cur.close()


def _drive_sync(conn: sqlite3.Connection, body: TxBody[T]) -> T:
    gen = body()
    step = next_step(gen, None)
    while not isinstance(step, Done):
        step = next_step(gen, _sqlite_op(conn, step))
    value: T = step.value
    return value


class _SqliteThread:
    """One sqlite3 connection owned by one thread; work reaches it as whole functions.

    aiosqlite hops to its thread once per call (execute, fetch, close, commit):
    a job's transaction would cost a dozen hops. Here a transaction is one hop.
    """

    def __init__(self, path: Path, busy_timeout_s: float, name: str) -> None:
        self._path = path
        self._busy_timeout_s = busy_timeout_s
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._conn: sqlite3.Connection | None = None

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        def job() -> T:
            if self._conn is None:
                raise StorageUnavailable("sqlite: database is closed")
            try:
                return fn(self._conn)
            except sqlite3.Error as exc:
                raise _sqlite_error(exc) from exc

        loop = asyncio.get_running_loop()
        # A cancelled caller does not stop the thread: the function runs to its
        # end (commit or rollback), so the connection is never left mid-transaction.
        return await loop.run_in_executor(self._executor, job)

    async def open(self) -> None:
        def connect() -> None:
            conn = sqlite3.connect(
                str(self._path),
                isolation_level=None,
                check_same_thread=False,
                timeout=self._busy_timeout_s,
            )
            # A new file frees pages it no longer needs on request (give_back_space); set
            # before anything is written to it, a no-op on an existing file (migrate
            # converts one that was made without it).
            conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
            # WAL lets readers run beside the writer; FULL makes every COMMIT
            # durable before the API answers 202, also across a power cut.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
            # Each member of a group commit runs in a savepoint, whose statement journal
            # otherwise spills to a temporary file once it outgrows a small buffer: two
            # writes per page a member touches (decision 0025 in docs/decisions/).
            conn.execute("PRAGMA temp_store=MEMORY")
            self._conn = conn

        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._executor, connect)
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc

    async def close(self) -> None:
        def shut() -> None:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

        loop = asyncio.get_running_loop()
        with contextlib.suppress(Exception):
            await loop.run_in_executor(self._executor, shut)
        self._executor.shutdown(wait=False)


def _write_tx(body: TxBody[T]) -> Callable[[sqlite3.Connection], T]:
    def tx(conn: sqlite3.Connection) -> T:
        conn.execute("BEGIN IMMEDIATE")
        try:
            value = _drive_sync(conn, body)
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return value

    return tx


def _group_tx(bodies: Sequence[TxBody[Any]]) -> Callable[[sqlite3.Connection], list[Outcome]]:
    """The whole group in one thread hop: one BEGIN, a savepoint per member, one COMMIT."""

    def tx(conn: sqlite3.Connection) -> list[Outcome]:
        conn.execute("BEGIN IMMEDIATE")
        try:
            out: list[Outcome] = []
            for body in bodies:
                conn.execute("SAVEPOINT member")
                try:
                    value = _drive_sync(conn, body)
                except Exception as exc:
                    err = _sqlite_error(exc) if isinstance(exc, sqlite3.Error) else exc
                    if isinstance(err, StorageUnavailable) or not conn.in_transaction:
                        raise  # the file, not the member: SQLite may have ended the transaction
                    conn.execute("ROLLBACK TO member")
                    conn.execute("RELEASE member")
                    out.append(Outcome(error=err))
                    continue
                conn.execute("RELEASE member")
                out.append(Outcome(value=value))
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        return out

    return tx


class SqliteDatabase:
    """One writer connection (SQLite has one writer anyway) and one reader (WAL).

    Writes are serialised by an asyncio lock; waiting longer than
    `acquire_timeout_s` for it answers StorageUnavailable rather than letting
    requests pile up without bound. Another process holding the file's write
    lock is waited for up to the same time (busy timeout).
    """

    backend: Backend = "sqlite"
    features = Features(
        intake_in_one_statement=False,
        sent_in_one_statement=False,
        # A commit is an fsync: a dispatch outcome waits to share one with the intakes.
        outcomes_share_commits=True,
        # One writer: one group in flight, the next gathering meanwhile.
        group_writers=1,
        # The file is locked, busy or failing: each member alone would wait the busy
        # timeout again for the same 503.
        rerun_unavailable=False,
    )

    def __init__(self, path: Path, acquire_timeout_s: float) -> None:
        self.path = path
        self._acquire_timeout_s = acquire_timeout_s
        # A statement waits at most the busy timeout for another process's lock.
        self.statement_timeout_s = acquire_timeout_s
        self._writer = _SqliteThread(path, acquire_timeout_s, "outboxd-sqlite-w")
        self._reader = _SqliteThread(path, acquire_timeout_s, "outboxd-sqlite-r")
        self._write_lock = asyncio.Lock()
        self._open = False

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _private_file(self.path)
        await self._writer.open()
        await self._reader.open()
        self._open = True

    @contextlib.asynccontextmanager
    async def _write_turn(self) -> AsyncIterator[None]:
        if not self._open:
            raise StorageUnavailable("sqlite: database is closed")
        try:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a
            # cancellation that arrives as the lock is granted, and the cancelled caller
            # (a job's heartbeat, say) would run on.
            async with asyncio.timeout(self._acquire_timeout_s):
                await self._write_lock.acquire()
        except TimeoutError:
            raise StorageUnavailable("sqlite: timed out waiting for the database") from None
        try:
            yield
        finally:
            self._write_lock.release()

    def listen(
        self, channel: str, on_payload: Callable[[str], None]
    ) -> contextlib.AbstractAsyncContextManager[Listening]:
        raise NotImplementedError("SQLite has no notifications: poll (features.notifies)")

    async def run(self, body: TxBody[T], *, one_statement: bool = False) -> T:
        async with self._write_turn():
            return await self._writer.call(_write_tx(body))

    async def read(self, body: TxBody[T]) -> T:
        if not self._open:
            raise StorageUnavailable("sqlite: database is closed")
        return await self._reader.call(lambda conn: _drive_sync(conn, body))

    async def run_group(self, bodies: Sequence[TxBody[Any]]) -> list[Outcome]:
        async with self._write_turn():
            return await self._writer.call(_group_tx(bodies))

    async def migrate(self) -> list[str]:
        def apply(conn: sqlite3.Connection) -> list[str]:
            _incremental_vacuum_on(conn)
            # Off for the migrations (a no-op inside a transaction, so before BEGIN): a
            # table rebuilt by copy-drop-rename must not take the rows referencing it
            # along when the old one is dropped. Checked before the commit instead.
            conn.execute("PRAGMA foreign_keys=OFF")
            try:
                return migrate_in_transaction(conn)
            finally:
                conn.execute("PRAGMA foreign_keys=ON")

        def migrate_in_transaction(conn: sqlite3.Connection) -> list[str]:
            applied: list[str] = []
            conn.execute("BEGIN IMMEDIATE")
            try:
                conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
                )
                done = {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
                for version, name, script in load_migrations("sqlite"):
                    if version in done:
                        continue
                    for stmt in _split_statements(script):
                        conn.execute(stmt)
                    conn.execute(
                        "INSERT INTO schema_migrations VALUES (?, ?, strftime('%s','now'))",
                        (version, name),
                    )
                    applied.append(name)
                broken = conn.execute("PRAGMA foreign_key_check").fetchall() if applied else []
                if broken:
                    raise sqlite3.IntegrityError(f"migrations broke foreign keys: {broken[:3]}")
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return applied

        async with self._write_turn():
            return await self._writer.call(apply)

    async def give_back_space(self) -> int:
        freed = 0
        while True:
            async with self._write_turn():
                n = await self._writer.call(_vacuum_some)
            freed += n
            if n < VACUUM_PAGES:
                return freed

    async def pending_migrations(self) -> list[str]:
        done = await self._applied_versions()
        return [name for version, name, _ in load_migrations("sqlite") if version not in done]

    async def schema_version(self) -> int | None:
        return max(await self._applied_versions(), default=None)

    async def _applied_versions(self) -> set[int]:
        """The versions in schema_migrations (none before the first migration)."""

        def read(conn: sqlite3.Connection) -> set[int]:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
            ).fetchone()
            if not found:
                return set()
            return {int(r[0]) for r in conn.execute("SELECT version FROM schema_migrations")}

        return await self._reader.call(read)

    async def ping(self) -> None:
        await self._reader.call(lambda c: c.execute("SELECT 1").fetchall())
        # In WAL mode reads succeed while another process holds the write lock,
        # yet then every write answers 503: ready means writes can start too.
        # A throwaway connection in a thread: a cancelled probe leaves no
        # transaction open on the shared connections.
        await asyncio.to_thread(self._probe_write)

    def _probe_write(self) -> None:
        uri = "file:" + urllib.parse.quote(str(self.path)) + "?mode=rw"
        try:
            conn = sqlite3.connect(
                uri, uri=True, timeout=min(self._acquire_timeout_s, 1.0), isolation_level=None
            )
            try:
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("ROLLBACK")
            finally:
                conn.close()
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc

    async def close(self) -> None:
        self._open = False
        await self._writer.close()
        await self._reader.close()


# Pages an incremental vacuum gives back in one write transaction (16 MiB of 4 KiB pages):
# the writer is held for milliseconds, not for the whole file.
VACUUM_PAGES = 4096


def _vacuum_some(conn: sqlite3.Connection) -> int:
    """Up to VACUUM_PAGES free pages given back; how many went."""
    before = conn.execute("PRAGMA freelist_count").fetchone()[0]
    if not before:
        return 0
    # executescript steps the pragma to its end: execute() would free one page only.
    conn.executescript(f"PRAGMA incremental_vacuum({VACUUM_PAGES})")
    after = conn.execute("PRAGMA freelist_count").fetchone()[0]
    return int(before - after)


def _incremental_vacuum_on(conn: sqlite3.Connection) -> None:
    """A file made before auto_vacuum was set (by release 0.1.0) is rewritten once with it,
    so that outbox.prune's deletes can give space back; a new file has it from the start."""
    if conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2:
        return
    started = time.monotonic()
    conn.execute("PRAGMA auto_vacuum=INCREMENTAL")
    conn.execute("VACUUM")
    log.info("sqlite_vacuumed", auto_vacuum="incremental", seconds=time.monotonic() - started)


def _split_statements(script: str) -> list[str]:
    """The script's statements: text up to a semicolon that ends a statement as SQLite
    reads it (not one inside a comment, a literal or a trigger's body)."""
    out: list[str] = []
    buf = ""
    for piece in script.split(";"):
        buf += piece + ";"
        if sqlite3.complete_statement(buf):
            if buf.strip(" \n\t;") and not _only_comments(buf.rstrip(";")):
                out.append(buf.strip())
            buf = ""
    return out


def _only_comments(sql: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in sql.splitlines())


def _private_file(path: Path) -> None:
    """The database file exists and is 0600, whatever the umask.

    It holds sealed credentials (and a ciphertext's length tells a password's).
    SQLite creates -wal and -shm with the database file's mode, so they follow.
    """
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        pass
    else:
        try:
            os.fchmod(fd, 0o600)  # the umask cannot widen it, but may narrow it
        finally:
            os.close(fd)
    # Tighten files an older version (or a 022 umask) left readable. Best effort: a
    # user who does not own them (an operator running `outboxd status`) cannot.
    for f in (path, *(path.with_name(path.name + s) for s in ("-wal", "-shm", "-journal"))):
        with contextlib.suppress(FileNotFoundError, PermissionError):
            if f.stat().st_mode & 0o077:
                os.chmod(f, 0o600)
