"""Retention: `outbox.prune` removes history past `retention.*`, in transactions of at most
`retention.batch_rows` rows, and the space comes back.

Both backends. Rows are made through the store's real transitions (tests/support/ops); the
task runs through its registered controller with a clock moved forward, as the consumer
runs it.
"""

from __future__ import annotations

import sqlite3
import time
import uuid
from functools import partial
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from outboxd.security import KeyRing
from outboxd.services.tasks import TASK_TYPES, Retention, TaskContext
from outboxd.storage.store import SqlStore, open_store
from tests.support.db import raw_rows, sql
from tests.support.ops import kill_in_processing, submit_job, succeed

Client = TestClient[Any, Any]
DAY = 86400.0
RETENTION = Retention(finished_s=30 * DAY, dead_s=90 * DAY, batch_rows=3, credentials_s=7 * DAY)


async def _prune_at(store: SqlStore, at: float, retention: Retention = RETENTION) -> str:
    """outbox.prune run as the consumer runs it, with the clock at `at`; its final status."""
    run, _ = await store.enqueue_task(
        str(uuid.uuid4()), str(uuid.uuid4()), "outbox.prune", {}, uuid.uuid4().hex, time.time()
    )
    await TASK_TYPES["outbox.prune"](TaskContext(store, lambda: at, retention), run)
    done = await store.get_task(run.id)
    assert done is not None
    return done.status


async def test_history_goes_by_state_after_its_retention(
    store: SqlStore, keys: KeyRing, api: Client, db_url: str
) -> None:
    done = [(await succeed(store, (await submit_job(store, keys)).id)).id for _ in range(4)]
    dead = (await kill_in_processing(store, (await submit_job(store, keys)).id)).id
    queued = (await submit_job(store, keys, key="still-queued")).id
    now = time.time()

    # 29 days on: nothing is old enough.
    assert await _prune_at(store, now + 29 * DAY) == "SUCCEEDED"
    assert all([await store.get_job(j) for j in done])

    # 31 days on: the finished jobs go, timelines and outbox rows with them, a few rows a
    # transaction; the DEAD job stays (its credentials went at 7 days); the queued one stays.
    assert await _prune_at(store, now + 31 * DAY) == "SUCCEEDED"
    for job_id in done:
        assert await store.get_job(job_id) is None
        resp = await api.get(f"/v1/admin/jobs/{job_id}")
        assert resp.status == 404 and (await resp.json())["code"] == "C04"
    left = await raw_rows(db_url, "SELECT DISTINCT job_id FROM job_events")
    assert {r["job_id"] for r in left} == {dead, queued}
    dead_job = await store.get_job(dead)
    assert dead_job is not None and dead_job.status == "DEAD" and dead_job.sealed is None
    assert await store.get_job(queued) is not None

    # 91 days on: the DEAD job goes too; unfinished work never does.
    assert await _prune_at(store, now + 91 * DAY) == "SUCCEEDED"
    assert await store.get_job(dead) is None
    queued_job = await store.get_job(queued)
    assert queued_job is not None and queued_job.status == "QUEUED"
    relay = await store.latest_relay_row_for_job(queued)
    assert relay is not None and relay.status == "PENDING"


async def test_a_pruned_jobs_idempotency_key_starts_a_new_job(
    store: SqlStore, keys: KeyRing
) -> None:
    first = await succeed(store, (await submit_job(store, keys, key="k-1")).id)
    assert (await submit_job(store, keys, key="k-1")).id == first.id  # a replay, while kept
    assert await _prune_at(store, time.time() + 31 * DAY) == "SUCCEEDED"
    again = await submit_job(store, keys, key="k-1")
    assert again.id != first.id and again.status == "QUEUED"


async def test_one_transaction_deletes_at_most_batch_rows(
    store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    jobs = [(await succeed(store, (await submit_job(store, keys)).id)).id for _ in range(3)]
    per_job = {
        r["job_id"]: r["n"]
        for r in await raw_rows(
            db_url, "SELECT job_id, COUNT(*) AS n FROM job_events GROUP BY job_id"
        )
    }
    relay_rows = (await sql(db_url, "SELECT COUNT(*) FROM relay_outbox"))[0][0]
    assert relay_rows == 3
    cost = 1 + per_job[jobs[0]] + 1  # the job, its events, its relay row
    later = time.time() + 60
    params = {"before": later, "dead_before": later, "limit": 2 * cost - 1, "candidates": 10}
    # Room for one job and most of a second: one job goes, and the prune knows more are left.
    n, more = await store.db.run(partial(store._prune_jobs, params))
    assert (n, more) == (1, True)
    # A batch smaller than one job still moves: one job a transaction.
    n, more = await store.db.run(partial(store._prune_jobs, {**params, "limit": 1}))
    assert (n, more) == (1, True)
    n, more = await store.db.run(partial(store._prune_jobs, {**params, "limit": 100}))
    assert (n, more) == (1, False)
    assert (await sql(db_url, "SELECT COUNT(*) FROM jobs"))[0][0] == 0


async def test_the_space_comes_back(
    store: SqlStore, keys: KeyRing, backend: str, db_url: str
) -> None:
    """SQLite: freed pages go back to the file system. Postgres: the tables every job writes
    are vacuumed after 2% of them changed (migration 0013), not the default 20%."""
    if backend == "postgres":
        rows = await raw_rows(
            db_url,
            "SELECT relname, reloptions FROM pg_class WHERE relname IN "
            "('jobs', 'job_events', 'relay_outbox', 'work_outbox')",
        )
        assert len(rows) == 4
        for r in rows:
            assert "autovacuum_vacuum_scale_factor=0.02" in (r["reloptions"] or []), r
        assert await store.give_back_space() == 0
        return
    big = {"blob": "x" * 40_000}
    for _ in range(60):
        job = await submit_job(store, keys)
        running = await _running(store, job.id)
        assert await store.finish_job(running, "SUCCEEDED", time.time(), result=big)
    grown = _pages(store)
    assert await _prune_at(store, time.time() + 31 * DAY) == "SUCCEEDED"
    shrunk = _pages(store)
    assert shrunk["freelist"] == 0
    assert shrunk["pages"] < grown["pages"] / 3, (grown, shrunk)


async def test_a_file_made_before_auto_vacuum_is_converted_once(
    tmp_path: Path, backend: str
) -> None:
    """Release 0.1.0 made its files without auto_vacuum: the first migration rewrites one."""
    if backend == "postgres":
        return  # the space is Postgres's own (see test_the_space_comes_back)
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE keep (x)")
    conn.execute("INSERT INTO keep VALUES (42)")
    conn.commit()
    assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 0
    conn.close()
    store = await open_store(f"sqlite:///{path}", tmp_path, 2, 2.0)
    try:
        await store.db.migrate()
        await store.db.migrate()  # once: a second migrate finds it converted
    finally:
        await store.close()
    conn = sqlite3.connect(path)
    try:
        assert conn.execute("PRAGMA auto_vacuum").fetchone()[0] == 2
        assert conn.execute("SELECT x FROM keep").fetchall() == [(42,)]
    finally:
        conn.close()


async def _running(store: SqlStore, job_id: str) -> Any:
    now = time.time()
    latest = await store.latest_relay_row_for_job(job_id)
    assert latest is not None
    claimed = await store.claim_relay_row(latest.id, now, 30.0)
    assert claimed is not None and await store.mark_relay_sent([(claimed, "m")], now)
    running = await store.start_job_run(job_id, now, 30.0)
    assert running is not None
    return running


def _pages(store: SqlStore) -> dict[str, int]:
    path = store.db.path  # type: ignore[attr-defined]
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return {
            "pages": conn.execute("PRAGMA page_count").fetchone()[0],
            "freelist": conn.execute("PRAGMA freelist_count").fetchone()[0],
        }
    finally:
        conn.close()
