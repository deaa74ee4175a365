"""Migration 0005 on a database that already holds rows, both backends: the relay outbox
takes the SUPERSEDED status, the dead letters a redrive already answered are closed, and
everything else (rows, indexes, the other checks) is as it was."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import asyncpg
import pytest

from outboxd.storage.db import load_migrations, sqlite_path
from outboxd.storage.store import open_store
from tests.support import postgres as pg
from tests.support.db import pg_placeholders, raw_execute, raw_rows

JOB = (
    "INSERT INTO jobs (id, kind, portal, user_id, idempotency_key, fingerprint, status, "
    "key_id, sealed, created_at, updated_at) "
    "VALUES (?, 'portal_link', 'suwon', 'u', ?, 'fp', ?, 'k1', ?, 1, 1)"
)
ROW = (
    "INSERT INTO relay_outbox (id, kind, job_id, task_id, status, next_attempt_at, dedup_id, "
    "created_at, queue_message_id, attempt_count) VALUES (?, ?, ?, ?, ?, 0, ?, ?, ?, 10)"
)
# job a: a DEAD row, then a newer one (redriven before 0005) -> the DEAD one is closed;
# job b: its only row DEAD -> still a dead letter; job c: SENT; task t: its row DEAD.
SEED: list[tuple[str, tuple[object, ...]]] = [
    (JOB, ("a", "ka", "QUEUED", b"sealed")),
    (JOB, ("b", "kb", "DEAD", b"sealed")),
    (JOB, ("c", "kc", "SUCCEEDED", None)),
    (
        "INSERT INTO task_runs (id, type, payload, dedup_id, status, enqueued_at) "
        "VALUES ('t', 'noop', '{}', 'dt', 'DEAD', 1)",
        (),
    ),
    (ROW, ("a1", "job", "a", None, "DEAD", "a", 10.0, None)),
    (ROW, ("a2", "job", "a", None, "PENDING", "a", 20.0, None)),
    (ROW, ("b1", "job", "b", None, "DEAD", "b", 10.0, None)),
    (ROW, ("c1", "job", "c", None, "SENT", "c", 10.0, "m-c")),
    (ROW, ("t1", "task", None, "t", "DEAD", "dt", 10.0, None)),
]


@pytest.fixture
def at_version_4(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database migrated up to (not including) 0005 by the scripts themselves, seeded."""
    before = [m for m in load_migrations(backend) if m[0] < 5]
    if backend == "sqlite":
        url = f"sqlite:///{tmp_path / 'old.db'}"
        conn = sqlite3.connect(sqlite_path(url, tmp_path), isolation_level=None)
        conn.execute(
            "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at REAL NOT NULL)"
        )
        for version, name, script in before:
            conn.executescript(script)
            conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (version, name))
        for sql, args in SEED:
            conn.execute(sql, args)
        conn.close()
        yield url
        return
    request.getfixturevalue("pg_database")
    name, dsn = pg.create_database()

    async def prepare() -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT "
                "NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            for version, mname, script in before:
                await conn.execute(script)
                await conn.execute("INSERT INTO schema_migrations VALUES ($1, $2)", version, mname)
            for sql, args in SEED:
                await conn.execute(pg_placeholders(sql), *args)
        finally:
            await conn.close()

    asyncio.run(prepare())
    try:
        yield dsn
    finally:
        pg.drop_database(name)


async def test_0005_closes_answered_dead_letters_and_keeps_the_rest(
    at_version_4: str, tmp_path: Path
) -> None:
    url = at_version_4
    store = await open_store(url, tmp_path, 2, 5.0)
    try:
        assert (await store.db.pending_migrations())[0] == "0005_superseded_relay_rows.sql"
        assert (await store.db.migrate())[0] == "0005_superseded_relay_rows.sql"
        rows = {
            r["id"]: (r["status"], r["version"], r["attempt_count"])
            for r in await raw_rows(url, "SELECT * FROM relay_outbox")
        }
        assert rows == {
            "a1": ("SUPERSEDED", 1, 10),
            "a2": ("PENDING", 0, 10),
            "b1": ("DEAD", 0, 10),
            "c1": ("SENT", 0, 10),
            "t1": ("DEAD", 0, 10),
        }
        # The store reads and writes the rebuilt table as before: the new status counts,
        # the old checks hold, and the job's DEAD row is superseded by its redrive.
        redriven = await store.redrive_job("b", "b2", 30.0)
        assert redriven.status == "QUEUED"
        counts = {
            (c.table, c.status): c.count
            for c in await store.status_counts()
            if c.table == "relay_outbox"
        }
        assert counts == {
            ("relay_outbox", "SUPERSEDED"): 2,
            ("relay_outbox", "PENDING"): 2,
            ("relay_outbox", "SENT"): 1,
            ("relay_outbox", "DEAD"): 1,
        }
        assert [r.id for r in await store.claim_relay_due(40.0, 10, 30.0)] == ["a2", "b2"]
    finally:
        await store.close()
    bad = "UPDATE relay_outbox SET status = 'LOST' WHERE id = 'c1'"
    with pytest.raises((sqlite3.IntegrityError, asyncpg.CheckViolationError)):
        await raw_execute(url, bad)
    sent_without_message = "UPDATE relay_outbox SET queue_message_id = NULL WHERE id = 'c1'"
    with pytest.raises((sqlite3.IntegrityError, asyncpg.CheckViolationError)):
        await raw_execute(url, sent_without_message)
    if url.startswith("sqlite"):
        indexes = await raw_rows(
            url, "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'relay_outbox'"
        )
        assert {i["name"] for i in indexes} >= {
            "relay_outbox_eligible",
            "relay_outbox_job",
            "relay_outbox_task",
            "relay_outbox_created",
            "relay_outbox_unsent",
        }
    else:
        checks = await raw_rows(
            url,
            "SELECT convalidated FROM pg_constraint WHERE conname = 'relay_outbox_status_check'",
        )
        assert [c["convalidated"] for c in checks] == [True]
