"""A private Postgres database per test session (per xdist worker), emptied per test."""

from __future__ import annotations

import asyncio
import os
import uuid

import asyncpg

from tests.support.db import raw_db

ADMIN_DSN = os.environ.get("OUTBOXD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test")
TABLES = (
    "relay_outbox",
    "work_outbox",
    "websites",
    "task_runs",
    "jobs",
    "job_events",
    "pace",
    "pace_leases",
    "portal_login_failures",
    "portal_login_throttle",
    "website_registrations",
    "audit_log",
)


def required() -> bool:
    return os.environ.get("OUTBOXD_REQUIRE_POSTGRES", "") not in ("", "0", "false")


def dsn_for(db_name: str) -> str:
    base, _, _ = ADMIN_DSN.rpartition("/")
    return f"{base}/{db_name}"


async def _reachable() -> str | None:
    try:
        conn = await asyncpg.connect(ADMIN_DSN, timeout=3)
    except (OSError, asyncpg.PostgresError, TimeoutError) as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


def unreachable_reason() -> str | None:
    return asyncio.run(_reachable())


async def _admin(statement: str) -> None:
    conn = await asyncpg.connect(ADMIN_DSN, timeout=5)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def create_database() -> tuple[str, str]:
    name = f"outboxd_test_{os.getpid()}_{uuid.uuid4().hex[:8]}"
    asyncio.run(_admin(f'CREATE DATABASE "{name}"'))
    return name, dsn_for(name)


def drop_database(name: str) -> None:
    asyncio.run(_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _truncate(dsn: str) -> None:
    conn = await asyncpg.connect(dsn, timeout=5)
    try:
        rows = await conn.fetch("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        present = [t for t in TABLES if t in {r["tablename"] for r in rows}]
        # Only the tables with rows: a TRUNCATE costs a new file per table, rows or not.
        written = present and await conn.fetch(
            " UNION ALL ".join(
                f"SELECT '{t}' AS t WHERE EXISTS (SELECT 1 FROM {t})" for t in present
            )
        )
        if written:
            await conn.execute(f"TRUNCATE {', '.join(r['t'] for r in written)} CASCADE")
        if "dependencies" in {r["tablename"] for r in rows}:
            # Its three rows are the schema's (migration 0011): put back as migrated.
            await conn.execute(
                "UPDATE dependencies SET failures_in_a_row = 0, down_since = NULL,"
                " last_error = NULL, last_failure_at = NULL, last_probe_at = NULL,"
                " probe_job = NULL, probe_until = NULL, paused_at = NULL, paused_until = NULL,"
                " pause_reason = NULL, paused_by = NULL, updated_at = 0, version = 0"
                " WHERE version > 0"
            )
    finally:
        await conn.close()


def truncate(dsn: str) -> None:
    asyncio.run(_truncate(dsn))


async def dump_all(dsn: str) -> str:
    """Every row of every table as text: a pg_dump-style view to grep for secrets."""
    out = []
    async with raw_db(dsn) as db:
        tables = await db.rows(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
        )
        for t in tables:
            for r in await db.rows(f'SELECT * FROM "{t["tablename"]}"'):
                out.append(repr(r))
                for v in r.values():
                    if isinstance(v, bytes | bytearray | memoryview):
                        out.append(bytes(v).decode("latin-1"))
    return "\n".join(out)
