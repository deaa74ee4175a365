"""The Postgres driver: an asyncpg pool, each body on one connection.

With `storage/sqlite.py`, the only modules that import a database library.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
import structlog

from outboxd.errors import StorageError, StorageUnavailable
from outboxd.observability import detached, scrub_url
from outboxd.storage.db import (
    Backend,
    Connection,
    Features,
    OneStatement,
    Outcome,
    Params,
    Query,
    Row,
    TxBody,
    drive_async,
    load_migrations,
)

log = structlog.get_logger(__name__)
# The pool reconnects its floor connection itself and warns, traceback included, at each
# failed try while the database is down: the loops already log that outage, once.
logging.getLogger("asyncpg.pool").setLevel(logging.ERROR)

T = TypeVar("T")

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


class _Listening:
    """The listening connection of `PostgresDatabase.listen`."""

    def __init__(self, conn: Any, timeout_s: float) -> None:
        self._conn = conn
        self._timeout_s = timeout_s
        self.lost = asyncio.Event()

    async def ping(self) -> None:
        try:
            await self._conn.fetchval("SELECT 1", timeout=self._timeout_s)
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            self.lost.set()
            raise _pg_error(exc) from exc


class PostgresDatabase:
    backend: Backend = "postgres"
    features = Features(
        intake_in_one_statement=True,
        sent_in_one_statement=True,
        outcomes_share_commits=False,
        # Writes run side by side, but two groups at a time, so that groups form: more
        # writers made smaller groups and cost CPU per request
        # (docs/decisions/0003-group-commit.md).
        group_writers=2,
        rerun_unavailable=True,
        events_in_statement=True,
        notifies=True,
        concurrent_writes=True,
    )

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
        self._analyzing = detached(self.analyze_young_tables())

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
            # Autocommit: the statement is its own transaction (one whose prepared form a
            # migration outdated, asyncpg prepares again and reruns itself).
            async with self._acquire() as raw:
                return await drive_async(OneStatement(_PgConn(raw)), body)
        try:
            async with self._transaction() as conn:
                return await drive_async(conn, body)
        except StorageError as exc:
            if not isinstance(exc.__cause__, asyncpg.InvalidCachedStatementError):
                raise
        # A migration changed the rows of a table this pool had prepared statements on (a
        # newer release's, during a rolling upgrade: docs/upgrades.md): asyncpg has dropped
        # them, and the transaction was rolled back. Once more, on statements prepared anew.
        log.info("prepared_statements_outdated", detail="a migration changed a table; rerun")
        async with self._transaction() as conn:
            return await drive_async(conn, body)

    async def read(self, body: TxBody[T]) -> T:
        async with self._acquire() as conn:
            return await drive_async(_PgConn(conn), body)

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
                        value = await drive_async(conn, body)
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

    @contextlib.asynccontextmanager
    async def listen(
        self, channel: str, on_payload: Callable[[str], None]
    ) -> AsyncIterator[_Listening]:
        """A connection of its own, outside the pool (a LISTEN is session state, and the
        pool's reset of a connection given back would drop it), with `on_payload` called per
        notification on `channel`."""
        try:
            conn = await asyncpg.connect(
                self._dsn, timeout=self._timeout_s, command_timeout=self._timeout_s
            )
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            raise _pg_error(exc) from exc
        listening = _Listening(conn, self._timeout_s)

        def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
            on_payload(payload)

        try:
            conn.add_termination_listener(lambda _conn: listening.lost.set())
            await conn.add_listener(channel, notified)
        except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
            conn.terminate()
            raise _pg_error(exc) from exc
        try:
            yield listening
        finally:
            listening.lost.set()
            try:
                await asyncio.wait_for(asyncio.shield(conn.close()), 2.0)
            except (TimeoutError, Exception):
                conn.terminate()

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
        done = await self._applied_versions()
        return [name for version, name, _ in load_migrations("postgres") if version not in done]

    async def schema_version(self) -> int | None:
        return max(await self._applied_versions(), default=None)

    async def _applied_versions(self) -> set[int]:
        """The versions in schema_migrations (none before the first migration)."""
        async with self._acquire() as conn:
            try:
                if not await conn.fetchval("SELECT to_regclass('schema_migrations') IS NOT NULL"):
                    return set()
                rows = await conn.fetch("SELECT version FROM schema_migrations")
                return {int(r[0]) for r in rows}
            except (asyncpg.PostgresError, *_PG_UNAVAILABLE) as exc:
                raise _pg_error(exc) from exc

    async def give_back_space(self) -> int:
        return 0  # autovacuum marks the space free for reuse (migration 0013 tunes it)

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
