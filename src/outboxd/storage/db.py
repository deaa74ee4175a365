"""Database drivers: the only module that imports aiosqlite or asyncpg.

Both drivers offer the same small surface (`transaction()` for writes,
`reader()` for reads, rows as dicts) and turn driver errors into the project's
own exceptions, so everything above speaks one dialect of failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import sqlite3
import urllib.parse
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol

import aiosqlite
import asyncpg
import structlog

from outboxd.errors import StorageError, StorageUnavailable
from outboxd.observability import scrub_url

log = structlog.get_logger(__name__)

Backend = Literal["sqlite", "postgres"]
Row = dict[str, Any]
Params = Mapping[str, Any]

_BLOCK_RE = re.compile(r"^--\s*name:\s*(\w+)\s*$", re.MULTILINE)
_PARAM_RE = re.compile(r"(?<![:\w]):([a-zA-Z_]\w*)")


class IntegrityViolation(StorageError):
    """A constraint refused the write (the transaction was rolled back)."""


@dataclass(frozen=True)
class Query:
    """One named SQL statement, with `:name` parameters rewritten for the backend."""

    name: str
    sql: str
    param_names: tuple[str, ...]

    def positional(self, params: Params) -> list[Any]:
        try:
            return [params[n] for n in self.param_names]
        except KeyError as exc:  # a bug in the caller, not the database
            raise TypeError(f"query {self.name}: missing parameter {exc}") from None


def load_queries(backend: Backend) -> dict[str, Query]:
    """`sql/common.sql`, then `sql/<backend>.sql` overriding blocks of the same name."""
    blocks: dict[str, str] = {}
    pkg = resources.files("outboxd.storage") / "sql"
    for fname in ("common.sql", f"{backend}.sql"):
        text = (pkg / fname).read_text(encoding="utf-8")
        parts = _BLOCK_RE.split(text)
        for i in range(1, len(parts), 2):
            blocks[parts[i]] = parts[i + 1].strip().rstrip(";")
    queries: dict[str, Query] = {}
    for name, sql in blocks.items():
        if backend == "postgres":
            order: list[str] = []

            def number(m: re.Match[str], order: list[str] = order) -> str:
                if m.group(1) not in order:
                    order.append(m.group(1))
                return f"${order.index(m.group(1)) + 1}"

            pg_sql = _PARAM_RE.sub(number, sql)
            queries[name] = Query(name, pg_sql, tuple(order))
        else:
            names = tuple(dict.fromkeys(_PARAM_RE.findall(sql)))
            queries[name] = Query(name, sql, names)
    return queries


def load_migrations(backend: Backend) -> list[tuple[int, str, str]]:
    pkg = resources.files("outboxd.storage") / "migrations" / backend
    found = []
    for entry in pkg.iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            found.append((version, entry.name, entry.read_text(encoding="utf-8")))
    return sorted(found)


class Connection(Protocol):
    async def fetch(self, q: Query, params: Params) -> list[Row]: ...
    async def fetchrow(self, q: Query, params: Params) -> Row | None: ...
    async def execute(self, q: Query, params: Params) -> int: ...


class Database(Protocol):
    backend: Backend

    def transaction(self) -> contextlib.AbstractAsyncContextManager[Connection]: ...
    def reader(self) -> contextlib.AbstractAsyncContextManager[Connection]: ...
    async def migrate(self) -> list[str]: ...
    async def ping(self) -> None: ...
    async def close(self) -> None: ...


def _split_statements(script: str) -> list[str]:
    # Migration files hold no semicolons inside literals or bodies.
    return [s.strip() for s in script.split(";") if s.strip() and not _only_comments(s)]


def _only_comments(sql: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in sql.splitlines())


# ---------------------------------------------------------------------------
# SQLite


_SQLITE_UNAVAILABLE = ("locked", "busy", "unable to open", "disk i/o", "readonly", "full")


def _sqlite_error(exc: sqlite3.Error) -> StorageError:
    text = str(exc)
    if isinstance(exc, sqlite3.IntegrityError):
        return IntegrityViolation(f"sqlite: {text}")
    if isinstance(exc, sqlite3.OperationalError) and any(
        w in text.lower() for w in _SQLITE_UNAVAILABLE
    ):
        return StorageUnavailable(f"sqlite: {text}")
    if isinstance(exc, sqlite3.DatabaseError) and "raise" not in text.lower():
        return StorageError(f"sqlite: {text}")
    return StorageError(f"sqlite: {text}")


class _SqliteConn:
    def __init__(self, conn: aiosqlite.Connection) -> None:
        self._conn = conn

    async def fetch(self, q: Query, params: Params) -> list[Row]:
        try:
            async with self._conn.execute(q.sql, dict(params)) as cur:
                rows = await cur.fetchall()
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc
        return [dict(r) for r in rows]

    async def fetchrow(self, q: Query, params: Params) -> Row | None:
        rows = await self.fetch(q, params)
        return rows[0] if rows else None

    async def execute(self, q: Query, params: Params) -> int:
        try:
            async with self._conn.execute(q.sql, dict(params)) as cur:
                return int(cur.rowcount)
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc


class SqliteDatabase:
    """One writer connection (SQLite has one writer anyway) and one reader (WAL).

    Writes are serialised by an asyncio lock around `BEGIN IMMEDIATE … COMMIT`;
    waiting longer than `acquire_timeout_s` for it answers StorageUnavailable
    rather than letting requests pile up without bound.
    """

    backend: Backend = "sqlite"

    def __init__(self, path: Path, acquire_timeout_s: float) -> None:
        self.path = path
        self._acquire_timeout_s = acquire_timeout_s
        self._writer: aiosqlite.Connection | None = None
        self._reader: aiosqlite.Connection | None = None
        self._write_lock = asyncio.Lock()
        self._read_lock = asyncio.Lock()

    async def open(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._writer = await self._connect()
            self._reader = await self._connect()
        except sqlite3.Error as exc:
            raise _sqlite_error(exc) from exc

    async def _connect(self) -> aiosqlite.Connection:
        conn = await aiosqlite.connect(str(self.path), isolation_level=None)
        conn.row_factory = sqlite3.Row
        busy_ms = int(self._acquire_timeout_s * 1000)
        # WAL lets readers run beside the writer; FULL makes every COMMIT
        # durable before the API answers 202, also across a power cut.
        for pragma in (
            "PRAGMA journal_mode=WAL",
            f"PRAGMA busy_timeout={busy_ms}",
            "PRAGMA synchronous=FULL",
            "PRAGMA foreign_keys=ON",
        ):
            await conn.execute(pragma)
        return conn

    @contextlib.asynccontextmanager
    async def _locked(self, lock: asyncio.Lock) -> AsyncIterator[None]:
        try:
            await asyncio.wait_for(lock.acquire(), self._acquire_timeout_s)
        except TimeoutError:
            raise StorageUnavailable("sqlite: timed out waiting for the database") from None
        try:
            yield
        finally:
            lock.release()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        conn = self._writer
        if conn is None:
            raise StorageUnavailable("sqlite: database is closed")
        async with self._locked(self._write_lock):
            try:
                await conn.execute("BEGIN IMMEDIATE")
            except sqlite3.Error as exc:
                raise _sqlite_error(exc) from exc
            try:
                yield _SqliteConn(conn)
            except BaseException:
                # The shield: a cancelled request must not leave the shared
                # writer inside an open transaction.
                with contextlib.suppress(sqlite3.Error):
                    await asyncio.shield(conn.rollback())
                raise
            try:
                await asyncio.shield(conn.commit())
            except sqlite3.Error as exc:
                with contextlib.suppress(sqlite3.Error):
                    await conn.rollback()
                raise _sqlite_error(exc) from exc

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[Connection]:
        conn = self._reader
        if conn is None:
            raise StorageUnavailable("sqlite: database is closed")
        async with self._locked(self._read_lock):
            yield _SqliteConn(conn)

    async def migrate(self) -> list[str]:
        conn = self._writer
        assert conn is not None
        applied: list[str] = []
        async with self._locked(self._write_lock):
            try:
                await conn.execute("BEGIN IMMEDIATE")
                await conn.execute(
                    "CREATE TABLE IF NOT EXISTS schema_migrations ("
                    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at REAL NOT NULL)"
                )
                async with conn.execute("SELECT version FROM schema_migrations") as cur:
                    done = {r[0] for r in await cur.fetchall()}
                for version, name, script in load_migrations("sqlite"):
                    if version in done:
                        continue
                    for stmt in _split_statements(script):
                        await conn.execute(stmt)
                    await conn.execute(
                        "INSERT INTO schema_migrations VALUES (?, ?, strftime('%s','now'))",
                        (version, name),
                    )
                    applied.append(name)
                await conn.commit()
            except sqlite3.Error as exc:
                await conn.rollback()
                raise _sqlite_error(exc) from exc
        return applied

    async def ping(self) -> None:
        async with self.reader() as conn:
            await conn.fetch(Query("ping", "SELECT 1", ()), {})
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
        for conn in (self._writer, self._reader):
            if conn is not None:
                with contextlib.suppress(Exception):
                    await conn.close()
        self._writer = self._reader = None


# ---------------------------------------------------------------------------
# Postgres

_PG_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    TimeoutError,
    asyncpg.PostgresConnectionError,
    asyncpg.InterfaceError,
    asyncpg.CannotConnectNowError,
    asyncpg.TooManyConnectionsError,
    asyncpg.AdminShutdownError,
    asyncpg.ConnectionDoesNotExistError,
)
# Lock id for migrations: any constant agreed by every instance.
_MIGRATION_LOCK_ID = 0x6F7574626F7864  # "outboxd"


def _pg_error(exc: BaseException) -> StorageError:
    text = scrub_url(str(exc)) or type(exc).__name__
    if isinstance(exc, asyncpg.IntegrityConstraintViolationError):
        return IntegrityViolation(f"postgres: {text}")
    if isinstance(exc, _PG_UNAVAILABLE):
        return StorageUnavailable(f"postgres: {type(exc).__name__}: {text}")
    return StorageError(f"postgres: {text}")


def _pg_status_count(status: str) -> int:
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


class _PgConn:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, q: Query, params: Params) -> list[Row]:
        try:
            rows = await self._conn.fetch(q.sql, *q.positional(params))
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        return [dict(r) for r in rows]

    async def fetchrow(self, q: Query, params: Params) -> Row | None:
        rows = await self.fetch(q, params)
        return rows[0] if rows else None

    async def execute(self, q: Query, params: Params) -> int:
        try:
            status = await self._conn.execute(q.sql, *q.positional(params))
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        return _pg_status_count(str(status))


class PostgresDatabase:
    backend: Backend = "postgres"

    def __init__(self, dsn: str, pool_size: int, acquire_timeout_s: float) -> None:
        self._dsn = dsn
        self._pool_size = pool_size
        self._timeout_s = acquire_timeout_s
        self._pool: Any = None

    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=1,
                max_size=self._pool_size,
                # Bounded everywhere: connecting, and every statement, so a
                # database that stops answering becomes a 503, never a hang.
                timeout=self._timeout_s,
                command_timeout=max(self._timeout_s * 2, 10.0),
                max_inactive_connection_lifetime=60.0,
            )
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc

    @contextlib.asynccontextmanager
    async def _acquire(self) -> AsyncIterator[Any]:
        if self._pool is None:
            raise StorageUnavailable("postgres: pool is closed")
        try:
            conn = await self._pool.acquire(timeout=self._timeout_s)
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                await asyncio.shield(self._pool.release(conn))

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[Connection]:
        async with self._acquire() as conn:
            tx = conn.transaction()
            try:
                await tx.start()
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc
            try:
                yield _PgConn(conn)
            except BaseException:
                with contextlib.suppress(Exception):
                    await asyncio.shield(tx.rollback())
                raise
            try:
                await asyncio.shield(tx.commit())
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc

    @contextlib.asynccontextmanager
    async def reader(self) -> AsyncIterator[Connection]:
        async with self._acquire() as conn:
            yield _PgConn(conn)

    async def migrate(self) -> list[str]:
        applied: list[str] = []
        async with self._acquire() as conn:
            try:
                # Session-level advisory lock: a second instance starting at
                # the same moment waits here, then finds nothing left to do.
                await conn.execute("SELECT pg_advisory_lock($1)", _MIGRATION_LOCK_ID)
                try:
                    await conn.execute(
                        "CREATE TABLE IF NOT EXISTS schema_migrations ("
                        "version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
                        "applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
                    )
                    done = {r[0] for r in await conn.fetch("SELECT version FROM schema_migrations")}
                    for version, name, script in load_migrations("postgres"):
                        if version in done:
                            continue
                        async with conn.transaction():
                            await conn.execute(script)
                            await conn.execute(
                                "INSERT INTO schema_migrations (version, name) VALUES ($1, $2)",
                                version,
                                name,
                            )
                        applied.append(name)
                finally:
                    await conn.execute("SELECT pg_advisory_unlock($1)", _MIGRATION_LOCK_ID)
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc
        return applied

    async def ping(self) -> None:
        async with self._acquire() as conn:
            try:
                await conn.fetchval("SELECT 1")
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc

    async def close(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), 5.0)
            except (TimeoutError, Exception):
                pool.terminate()


def sqlite_path(url: str, base_dir: Path) -> Path:
    """`sqlite:///rel/path` is relative to base_dir; `sqlite:////abs/path` absolute."""
    rest = url[len("sqlite:///") :]
    path = Path(rest)
    return path if path.is_absolute() else base_dir / path


async def open_database(
    url: str, base_dir: Path, pool_size: int, acquire_timeout_s: float
) -> SqliteDatabase | PostgresDatabase:
    db: SqliteDatabase | PostgresDatabase
    if url.startswith("sqlite:///"):
        db = SqliteDatabase(sqlite_path(url, base_dir), acquire_timeout_s)
    else:
        db = PostgresDatabase(url, pool_size, acquire_timeout_s)
    await db.open()
    return db


def rows_to_ids(rows: Sequence[Row], key: str = "id") -> list[str]:
    return [str(r[key]) for r in rows]
