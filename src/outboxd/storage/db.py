"""Database drivers: the only module that imports sqlite3 or asyncpg.

Both drivers offer the same small surface — `run(body)` for a write
transaction, `read(body)` for reads, rows as dicts — and turn driver errors into
the project's own exceptions, so everything above speaks one dialect of failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import sqlite3
import urllib.parse
from collections.abc import AsyncIterator, Callable, Generator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

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
# `{name}` in a block stands for the named block's text: SQL written once, used twice.
_INCLUDE_RE = re.compile(r"\{(\w+)\}")
# Written once in common.sql as a comment; Postgres claims run it (see load_queries).
_SKIP_LOCKED = "/* FOR UPDATE SKIP LOCKED */"


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
    """`sql/common.sql`, then `sql/<backend>.sql` overriding blocks of the same name; a
    `{name}` in a block is replaced by the block `name` (one level deep)."""
    blocks: dict[str, str] = {}
    pkg = resources.files("outboxd.storage") / "sql"
    for fname in ("common.sql", f"{backend}.sql"):
        text = (pkg / fname).read_text(encoding="utf-8")
        parts = _BLOCK_RE.split(text)
        for i in range(1, len(parts), 2):
            blocks[parts[i]] = parts[i + 1].strip().rstrip(";")
    queries: dict[str, Query] = {}
    for name, text in blocks.items():
        sql = _INCLUDE_RE.sub(lambda m: blocks[m.group(1)], text)
        if backend == "postgres":
            sql = sql.replace(_SKIP_LOCKED, _SKIP_LOCKED[3:-3])
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
    async def execute(self, q: Query, params: Params) -> int: ...
    async def execute_each(self, q: Query, each: Sequence[Params]) -> int: ...


@dataclass(frozen=True)
class Op:
    """One statement of a transaction body: `fetch` answers rows, `execute` a row count,
    `each` runs the statement once per parameter set in `each` and answers the total
    row count."""

    mode: Literal["fetch", "execute", "each"]
    q: Query
    params: Params
    each: Sequence[Params] = ()


def fetch(q: Query, params: Params) -> Op:
    return Op("fetch", q, params)


def execute(q: Query, params: Params) -> Op:
    return Op("execute", q, params)


def execute_each(q: Query, each: Sequence[Params]) -> Op:
    """`q` once per parameter set, in order (SQLite: `executemany`, one call into the
    library with no JSON to build or parse); the rows changed in all."""
    return Op("each", q, {}, each)


T = TypeVar("T")
# A transaction body is a generator: it yields the statements it needs, gets
# each one's result back, and returns the transaction's value. The logic is
# written once; SQLite runs the whole body in its thread in one hop, Postgres
# awaits each statement on one connection.
TxBody = Callable[[], Generator[Op, Any, T]]


@dataclass(frozen=True)
class Outcome:
    """One member of a group transaction: its body's value, or what it raised.

    A member that raised was rolled back to its savepoint; the others committed.
    """

    value: Any = None
    error: Exception | None = None


@dataclass(frozen=True)
class _Done:
    value: Any


def _step(gen: Generator[Op, Any, Any], result: Any) -> Op | _Done:
    """Send a body the previous statement's result: its next statement, or its value."""
    try:
        return gen.send(result)
    except StopIteration as stop:
        return _Done(stop.value)


class Database(Protocol):
    backend: Backend
    # The longest a statement may take before the caller gives up on it (StorageUnavailable).
    statement_timeout_s: float

    async def run(self, body: TxBody[T], *, one_statement: bool = False) -> T:
        """Run `body` in one write transaction (committed, or rolled back on error).

        `one_statement`: the body yields a single statement, atomic by itself, so Postgres
        may run it without BEGIN and COMMIT (two round trips fewer); a second statement
        is refused before it runs (a bug in the caller).
        """
        ...

    async def read(self, body: TxBody[T]) -> T:
        """Run `body` outside a write transaction (reads only)."""
        ...

    async def run_group(self, bodies: Sequence[TxBody[Any]]) -> list[Outcome]:
        """Run `bodies` in one write transaction, a savepoint each, and commit once.

        A member that raises is rolled back to its savepoint and its error returned in
        its Outcome; the others commit. Raises (nothing committed, as far as the caller
        can tell) when the group as a whole fails: begin, commit, a lost connection.
        """
        ...

    async def migrate(self) -> list[str]: ...
    async def pending_migrations(self) -> list[str]:
        """Names of the migrations not applied yet; reads only (no table is created)."""
        ...

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
    step = _step(gen, None)
    while not isinstance(step, _Done):
        step = _step(gen, _sqlite_op(conn, step))
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
            # WAL lets readers run beside the writer; FULL makes every COMMIT
            # durable before the API answers 202, also across a power cut.
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute("PRAGMA foreign_keys=ON")
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
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return applied

        async with self._write_turn():
            return await self._writer.call(apply)

    async def pending_migrations(self) -> list[str]:
        def check(conn: sqlite3.Connection) -> list[str]:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_migrations'"
            ).fetchone()
            done = (
                {r[0] for r in conn.execute("SELECT version FROM schema_migrations")}
                if found
                else set()
            )
            return [name for version, name, _ in load_migrations("sqlite") if version not in done]

        return await self._reader.call(check)

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
    # A connection whose backend died while it sat idle in the pool is left mid-error:
    # its next statement raises this ("cannot switch to state ...").
    asyncpg.InternalClientError,
)
# Lock id for migrations: any constant agreed by every instance.
_MIGRATION_LOCK_ID = 0x6F7574626F7864  # "outboxd"


def _pg_error(exc: BaseException) -> StorageError:
    text = scrub_url(str(exc)) or type(exc).__name__
    if isinstance(exc, _PG_UNAVAILABLE):
        return StorageUnavailable(f"postgres: {type(exc).__name__}: {text}")
    return StorageError(f"postgres: {text}")


def _pg_status_count(status: str) -> int:
    tail = status.rsplit(" ", 1)[-1]
    return int(tail) if tail.isdigit() else 0


async def _drive_async(conn: Connection, body: TxBody[T]) -> T:
    gen = body()
    step = _step(gen, None)
    while not isinstance(step, _Done):
        if step.mode == "each":
            step = _step(gen, await conn.execute_each(step.q, step.each))
            continue
        run = conn.fetch if step.mode == "fetch" else conn.execute
        step = _step(gen, await run(step.q, step.params))
    value: T = step.value
    return value


class _PgConn:
    def __init__(self, conn: Any) -> None:
        self._conn = conn

    async def fetch(self, q: Query, params: Params) -> list[Row]:
        try:
            rows = await self._conn.fetch(q.sql, *q.positional(params))
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        return [dict(r) for r in rows]

    async def execute(self, q: Query, params: Params) -> int:
        try:
            status = await self._conn.execute(q.sql, *q.positional(params))
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        return _pg_status_count(str(status))

    async def execute_each(self, q: Query, each: Sequence[Params]) -> int:
        # One statement per set: asyncpg's executemany does not say how many rows changed.
        # (Only SQLite's SENT path uses `each` today.)
        return sum([await self.execute(q, params) for params in each])


class _OneStatement:
    """A connection for a body declared to be one statement: a second one is refused."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._used = False

    def _turn(self, q: Query) -> None:
        if self._used:
            raise RuntimeError(f"query {q.name}: a second statement in a one-statement body")
        self._used = True

    async def fetch(self, q: Query, params: Params) -> list[Row]:
        self._turn(q)
        return await self._conn.fetch(q, params)

    async def execute(self, q: Query, params: Params) -> int:
        self._turn(q)
        return await self._conn.execute(q, params)

    async def execute_each(self, q: Query, each: Sequence[Params]) -> int:
        self._turn(q)
        if len(each) > 1:
            raise RuntimeError(f"query {q.name}: {len(each)} statements in a one-statement body")
        return await self._conn.execute_each(q, each)


async def _keep_session(conn: Any) -> None:
    """The pool's reset of a connection given back, instead of asyncpg's default query
    (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`), a round trip on every
    release. Nothing here leaves session state behind: no SET, LISTEN or cursor outside a
    transaction, and the one session advisory lock (migrate) is released in a finally.
    asyncpg still rolls back a transaction left open before calling this."""


# A database whose tables have no statistics yet (new, with autovacuum off or its first
# ANALYZE still to come) is planned as if they were empty, and a prepared statement keeps
# the generic plan it settles on: a dispatch outcome planned on a young outbox scanned the
# whole table for every batch as it grew (docs/architecture.md, "A young database"). So
# after this many write transactions since the pool opened, the tables that changed by
# more than their size since their last ANALYZE (and by at least YOUNG_TABLE_CHANGES rows)
# are analyzed, which also drops the plans made on them. Past the last one, their plans
# are made on a table of real size, and autovacuum keeps statistics fresh.
ANALYZE_AFTER_WRITES = (500, 5_000, 50_000)
YOUNG_TABLE_CHANGES = 100
_OWN_TABLES = ["jobs", "relay_outbox", "task_runs", "websites", "work_outbox"]


class PostgresDatabase:
    backend: Backend = "postgres"

    def __init__(self, dsn: str, pool_size: int, acquire_timeout_s: float) -> None:
        self._dsn = dsn
        self._pool_size = pool_size
        self._timeout_s = acquire_timeout_s
        self.statement_timeout_s = max(acquire_timeout_s * 2, 10.0)
        self._pool: Any = None
        self._writes = 0
        self._analyze_after = list(ANALYZE_AFTER_WRITES)
        self._analyzing: asyncio.Task[list[str]] | None = None

    def _wrote(self) -> None:
        """Count a write transaction; at each of ANALYZE_AFTER_WRITES, analyze the young
        tables in the background (never in the writer's way)."""
        self._writes += 1
        if not self._analyze_after or self._writes < self._analyze_after[0]:
            return
        if self._analyzing is not None and not self._analyzing.done():
            return
        self._analyze_after.pop(0)
        self._analyzing = asyncio.ensure_future(self.analyze_young_tables())

    async def analyze_young_tables(self) -> list[str]:
        """ANALYZE each of our tables that changed by more than its size (and by at least
        YOUNG_TABLE_CHANGES rows) since its last ANALYZE; the names analyzed. A failure is
        logged, never raised: statistics are an optimisation.

        Only tables this role may analyze (it owns them, or the database; a superuser may
        all): ANALYZE skips the others with a mere warning, and the log line would name
        tables that were not analyzed. Those are left to autovacuum."""
        try:
            async with self._acquire() as conn:
                young = await conn.fetch(
                    "SELECT s.relname FROM pg_stat_user_tables s"
                    " JOIN pg_class c ON c.oid = s.relid"
                    " WHERE s.schemaname = current_schema() AND s.relname = ANY($1::text[])"
                    " AND s.n_mod_since_analyze >= greatest($2, c.reltuples)"
                    " AND (pg_has_role(c.relowner, 'USAGE') OR pg_has_role("
                    "(SELECT datdba FROM pg_database WHERE datname = current_database()),"
                    " 'USAGE'))",
                    _OWN_TABLES,
                    YOUNG_TABLE_CHANGES,
                )
                names = sorted(str(r["relname"]) for r in young)
                if names:
                    await conn.execute("ANALYZE " + ", ".join(names))
                    log.info("young_tables_analyzed", tables=names, writes=self._writes)
                return names
        except Exception as exc:
            log.warning("young_tables_analyze_failed", error=exc)
            return []

    async def open(self) -> None:
        try:
            self._pool = await asyncpg.create_pool(
                self._dsn,
                min_size=1,
                max_size=self._pool_size,
                # Bounded everywhere: connecting, and every statement, so a
                # database that stops answering becomes a 503, never a hang.
                timeout=self._timeout_s,
                command_timeout=self.statement_timeout_s,
                max_inactive_connection_lifetime=60.0,
                reset=_keep_session,
            )
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc

    @contextlib.asynccontextmanager
    async def _acquire(self) -> AsyncIterator[Any]:
        pool = self._pool
        if pool is None:
            raise StorageUnavailable("postgres: pool is closed")
        try:
            conn = await pool.acquire(timeout=self._timeout_s)
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        try:
            yield conn
        finally:
            with contextlib.suppress(Exception):
                # To the pool that lent it: close() drops self._pool first, and a
                # connection never given back holds pool.close() for its full timeout.
                await asyncio.shield(pool.release(conn))

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[Connection]:
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

    async def run(self, body: TxBody[T], *, one_statement: bool = False) -> T:
        self._wrote()
        if one_statement:
            # Autocommit: the statement is its own transaction.
            async with self._acquire() as raw:
                return await _drive_async(_OneStatement(_PgConn(raw)), body)
        async with self._transaction() as conn:
            return await _drive_async(conn, body)

    async def read(self, body: TxBody[T]) -> T:
        async with self._acquire() as conn:
            return await _drive_async(_PgConn(conn), body)

    async def run_group(self, bodies: Sequence[TxBody[Any]]) -> list[Outcome]:
        self._wrote()
        async with self._acquire() as raw:
            conn = _PgConn(raw)
            tx = raw.transaction()
            try:
                await tx.start()
                out: list[Outcome] = []
                for i, body in enumerate(bodies):
                    # One round trip between members; COMMIT releases the last savepoint.
                    await raw.execute(
                        "SAVEPOINT member"
                        if i == 0
                        else "RELEASE SAVEPOINT member; SAVEPOINT member"
                    )
                    try:
                        value = await _drive_async(conn, body)
                    except StorageUnavailable:
                        raise
                    except Exception as exc:
                        await raw.execute("ROLLBACK TO SAVEPOINT member")
                        out.append(Outcome(error=exc))
                        continue
                    out.append(Outcome(value=value))
            except BaseException as exc:
                with contextlib.suppress(Exception):
                    await asyncio.shield(tx.rollback())
                if isinstance(exc, (asyncpg.PostgresError, *_PG_UNAVAILABLE)):
                    raise _pg_error(exc) from exc
                raise
            try:
                await asyncio.shield(tx.commit())
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc
            return out

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

    async def pending_migrations(self) -> list[str]:
        async with self._acquire() as conn:
            try:
                done: set[int] = set()
                if await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
                    done = {r[0] for r in await conn.fetch("SELECT version FROM schema_migrations")}
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc
        return [name for version, name, _ in load_migrations("postgres") if version not in done]

    async def ping(self) -> None:
        async with self._acquire() as conn:
            try:
                await conn.fetchval("SELECT 1")
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc

    async def close(self) -> None:
        if self._analyzing is not None and not self._analyzing.done():
            self._analyzing.cancel()
            await asyncio.wait({self._analyzing}, timeout=1.0)
        pool, self._pool = self._pool, None
        if pool is not None:
            try:
                await asyncio.wait_for(pool.close(), 5.0)
            except (TimeoutError, Exception):
                pool.terminate()


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
