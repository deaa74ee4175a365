"""What both database drivers share: named queries, transaction bodies, the `Database`
surface and the `Features` a driver declares.

The drivers, `storage/sqlite.py` and `storage/postgres.py`, are the only modules that
import sqlite3 or asyncpg. Both offer the same small surface: `run(body)` for a write
transaction, `read(body)` for reads, rows as dicts; and turn driver errors into the
project's own exceptions, so everything above speaks one dialect of failure. Where the
databases differ in what they do best, the driver says so in its `Features`, and the
store reads those, never the backend's name.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Literal, Protocol, TypeVar

from outboxd.storage.ports import Listening

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


def known_schema_version(backend: Backend) -> int:
    """The newest migration this code carries for `backend` (the schema it knows)."""
    return max(version for version, _, _ in load_migrations(backend))


def backend_of(url: str) -> Backend:
    """The backend a `storage.url` names: the one rule the driver is picked by."""
    return "sqlite" if url.startswith("sqlite:///") else "postgres"


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
class Done:
    value: Any


def next_step(gen: Generator[Op, Any, Any], result: Any) -> Op | Done:
    """Send a body the previous statement's result: its next statement, or its value."""
    try:
        return gen.send(result)
    except StopIteration as stop:
        return Done(stop.value)


async def drive_async(conn: Connection, body: TxBody[T]) -> T:
    """Run `body` on an async connection, awaiting each statement in turn."""
    gen = body()
    step = next_step(gen, None)
    while not isinstance(step, Done):
        if step.mode == "each":
            step = next_step(gen, await conn.execute_each(step.q, step.each))
            continue
        run = conn.fetch if step.mode == "fetch" else conn.execute
        step = next_step(gen, await run(step.q, step.params))
    value: T = step.value
    return value


class OneStatement:
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


@dataclass(frozen=True)
class Features:
    """Where the databases differ in how a write is best done, declared once by each
    driver; the store and group commit read these, never the backend's name."""

    # A group of intakes is first tried as one set-based statement (`insert_jobs_many`),
    # which commits by itself.
    intake_in_one_statement: bool
    # A round's SENT marks, their jobs RUNNING and their tasks SENT are one statement
    # (`relay_sent_many`; with the next claim, `relay_sent_and_claim_due`), atomic without
    # BEGIN and COMMIT. Otherwise each row is marked by its own execution of
    # `relay_sent_one`, and the jobs and tasks by a statement each.
    sent_in_one_statement: bool
    # A dispatch outcome shares the next intake group's commit when writes are in flight:
    # worth a wait where a commit is an fsync. Never with `intake_in_one_statement`: that
    # statement commits by itself, and an outcome cannot ride along in it.
    outcomes_share_commits: bool
    # Write groups in flight at once (storage/group.py).
    group_writers: int
    # A group that failed as unavailable runs again member by member (a lost connection
    # says nothing of the next one); otherwise every member is answered with its error.
    rerun_unavailable: bool
    # A job change and its timeline event are one statement (`<name>_ev`, a WITH around the
    # change); otherwise the event is a second statement in the change's transaction.
    events_in_statement: bool = False
    # The database pushes notifications to a listening connection (`Database.listen`);
    # otherwise other processes' changes are found by polling.
    notifies: bool = False
    # Write transactions run side by side: a check a body makes before it writes (a
    # per-user cap's count) takes the user's lock first (`cap_lock`), or two transactions
    # could pass it together. Otherwise one write runs at a time, and the check holds as is.
    concurrent_writes: bool = False

    def __post_init__(self) -> None:
        if self.outcomes_share_commits and self.intake_in_one_statement:
            raise ValueError("an outcome cannot share the commit of a one-statement intake")


class Database(Protocol):
    backend: Backend
    features: Features
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

    def listen(
        self, channel: str, on_payload: Callable[[str], None]
    ) -> contextlib.AbstractAsyncContextManager[Listening]:
        """A connection of its own LISTENing on `channel` (where `features.notifies`)."""
        ...

    async def migrate(self) -> list[str]: ...
    async def pending_migrations(self) -> list[str]:
        """Names of the migrations not applied yet; reads only (no table is created)."""
        ...

    async def schema_version(self) -> int | None:
        """The newest migration applied to the database (None before any); reads only.
        Higher than `known_schema_version` when a newer release migrated it."""
        ...

    async def give_back_space(self) -> int:
        """Free pages returned to the file system, a bounded number a transaction (SQLite's
        incremental vacuum); how many. Postgres: 0 (autovacuum reuses the space in place)."""
        ...

    async def ping(self) -> None: ...
    async def close(self) -> None: ...


def sqlite_path(url: str, base_dir: Path) -> Path:
    """`sqlite:///rel/path` is relative to base_dir; `sqlite:////abs/path` absolute."""
    rest = url[len("sqlite:///") :]
    path = Path(rest)
    return path if path.is_absolute() else base_dir / path
