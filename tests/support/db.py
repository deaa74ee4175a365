"""The one way tests read (and, to set up a fault, write) the database raw.

A driver of our own — sqlite3 on a SQLite file, asyncpg on Postgres — so an assertion
about what the store, the API, /metrics or the CLI did never trusts the code under test.
Queries take `?` placeholders; on Postgres they become `$1`, `$2`, … (a query already
written with `$n` passes unchanged).

    async with raw_db(db_url) as db:         # one connection for many reads
        n = await db.scalar("SELECT COUNT(*) FROM jobs WHERE status = ?", "QUEUED")
    rows = await raw_rows(db_url, "SELECT * FROM jobs")   # one-off, its own connection
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg

from outboxd.storage.db import sqlite_path

COUNTED = ("jobs", "relay_outbox", "websites", "work_outbox", "task_runs")


def pg_placeholders(query: str) -> str:
    parts = query.split("?")
    return parts[0] + "".join(f"${i}{p}" for i, p in enumerate(parts[1:], start=1))


class RawDb:
    """One connection to the database at `db_url`; rows come back as dicts."""

    def __init__(self, db_url: str, base_dir: Path | None = None) -> None:
        self.url = db_url
        self._path = (
            sqlite_path(db_url, base_dir or Path.cwd()) if db_url.startswith("sqlite:///") else None
        )
        self._sqlite: sqlite3.Connection | None = None
        self._pg: Any = None

    async def open(self) -> RawDb:
        if self._path is not None:
            conn = sqlite3.connect(
                self._path, timeout=10, isolation_level=None, check_same_thread=False
            )
            conn.row_factory = sqlite3.Row
            self._sqlite = conn
        else:
            self._pg = await asyncpg.connect(self.url, timeout=5)
        return self

    async def close(self) -> None:
        if self._sqlite is not None:
            self._sqlite.close()
            self._sqlite = None
        if self._pg is not None:
            await self._pg.close()
            self._pg = None

    async def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        if self._sqlite is not None:
            conn = self._sqlite
            return await asyncio.to_thread(
                lambda: [dict(r) for r in conn.execute(query, args).fetchall()]
            )
        return [dict(r) for r in await self._pg.fetch(pg_placeholders(query), *args)]

    async def scalar(self, query: str, *args: Any) -> Any:
        rows = await self.rows(query, *args)
        return next(iter(rows[0].values())) if rows else None

    async def execute(self, query: str, *args: Any) -> int:
        """A write in a transaction of its own; the number of rows it touched."""
        if self._sqlite is not None:
            conn = self._sqlite
            return await asyncio.to_thread(lambda: conn.execute(query, args).rowcount)
        status = await self._pg.execute(pg_placeholders(query), *args)
        tail = str(status).rsplit(" ", 1)[-1]
        return int(tail) if tail.isdigit() else 0

    async def count(self, table: str) -> int:
        return int(await self.scalar(f"SELECT COUNT(*) AS n FROM {table}"))

    async def counts(self, tables: tuple[str, ...] = COUNTED) -> dict[str, int]:
        return {t: await self.count(t) for t in tables}


@contextlib.asynccontextmanager
async def raw_db(db_url: str) -> AsyncIterator[RawDb]:
    """A RawDb open for the block."""
    db = await RawDb(db_url).open()
    try:
        yield db
    finally:
        await db.close()


async def raw_rows(db_url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    async with raw_db(db_url) as db:
        return await db.rows(query, *args)


async def raw_scalar(db_url: str, query: str, *args: Any) -> Any:
    async with raw_db(db_url) as db:
        return await db.scalar(query, *args)


async def raw_execute(db_url: str, query: str, *args: Any) -> int:
    async with raw_db(db_url) as db:
        return await db.execute(query, *args)


async def raw_count(db_url: str, table: str) -> int:
    async with raw_db(db_url) as db:
        return await db.count(table)


async def assert_nothing_stored(db_url: str) -> None:
    """A refused intake left neither a job nor its relay row."""
    assert await raw_count(db_url, "jobs") == 0
    assert await raw_count(db_url, "relay_outbox") == 0


async def sql(db_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of `query` as tuples, for callers that unpack columns by position."""
    return [tuple(r.values()) for r in await raw_rows(db_url, query, *args)]


def sql_sync(db_url: str, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """`sql` from synchronous code (no event loop running in this thread)."""
    return asyncio.run(sql(db_url, query, *args))


async def raw_counts(db_url: str, tables: tuple[str, ...] = COUNTED) -> dict[str, int]:
    """Row counts of `tables` (by default every table a request can write)."""
    async with raw_db(db_url) as db:
        return await db.counts(tables)


# ---------------------------------------------------------------- a fault in the database

# The error every insert into relay_outbox raises while the fault is installed.
OUTBOX_FAULT = "injected-outbox-fault"


async def install_outbox_fault(db_url: str) -> None:
    """A trigger that makes every insert into relay_outbox fail inside the transaction."""
    async with raw_db(db_url) as db:
        if db.url.startswith("sqlite:///"):
            await db.execute(
                "CREATE TRIGGER fail_outbox BEFORE INSERT ON relay_outbox "
                f"BEGIN SELECT RAISE(ABORT, '{OUTBOX_FAULT}'); END"
            )
            return
        await db.execute(
            "CREATE OR REPLACE FUNCTION fail_outbox() RETURNS trigger LANGUAGE plpgsql AS "
            f"$$ BEGIN RAISE EXCEPTION '{OUTBOX_FAULT}'; END $$"
        )
        await db.execute(
            "CREATE TRIGGER fail_outbox BEFORE INSERT ON relay_outbox "
            "FOR EACH ROW EXECUTE FUNCTION fail_outbox()"
        )


async def remove_outbox_fault(db_url: str) -> None:
    async with raw_db(db_url) as db:
        if db.url.startswith("sqlite:///"):
            await db.execute("DROP TRIGGER fail_outbox")
            return
        await db.execute("DROP TRIGGER fail_outbox ON relay_outbox")
        await db.execute("DROP FUNCTION fail_outbox()")
