"""`outbox.prune` never deletes work that is still needed, and takes only finite ages.

Both backends. Rows are made through the store's real transitions (tests/support/ops).
"""

from __future__ import annotations

import math
import time
import uuid
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from tests.support.ops import fail, kill_in_processing, submit_job, succeed

Client = TestClient[Any, Any]
DAY = 86400.0


async def _running(store: SqlStore, keys: KeyRing) -> str:
    """A job whose relay row is SENT and whose consumer run has started."""
    job = await submit_job(store, keys, key=uuid.uuid4().hex)
    latest = await store.latest_relay_row_for_job(job.id)
    assert latest is not None
    now = time.time()
    claimed = await store.claim_relay_row(latest.id, now, 30.0)
    assert claimed is not None
    assert await store.mark_relay_sent([(claimed, "msg-1")], now)
    running = await store.start_job_run(job.id, now, 30.0)
    assert running is not None and running.status == "RUNNING"
    return job.id


async def _relay_status(store: SqlStore, job_id: str) -> str | None:
    row = await store.latest_relay_row_for_job(job_id)
    return row.status if row is not None else None


async def test_a_running_jobs_sent_row_survives_older_than_zero_days(
    store: SqlStore, keys: KeyRing
) -> None:
    running = await _running(store, keys)
    queued = (await submit_job(store, keys, key="q")).id
    done = (await succeed(store, (await submit_job(store, keys, key="s")).id)).id
    failed = (await fail(store, (await submit_job(store, keys, key="f")).id)).id
    dead = (await kill_in_processing(store, (await submit_job(store, keys, key="d")).id)).id

    now = time.time() + 1  # older_than_days = 0: every finished row is old enough
    counts = await store.prune(
        finished_before=now, dead_before=now - 90 * DAY, credentials_before=now - 7 * DAY, batch=2
    )

    assert await _relay_status(store, running) == "SENT", "a RUNNING job lost its relay row"
    job = await store.get_job(running)
    assert job is not None and job.status == "RUNNING"
    assert await _relay_status(store, queued) == "PENDING"
    # A DEAD job inside dead_retention_s keeps its row and its ciphertext (redrivable).
    assert await _relay_status(store, dead) == "SENT"
    assert counts["dead_credentials"] == 0
    # Finished work is history: gone.
    assert await store.get_job(done) is None and await store.get_job(failed) is None
    assert counts["finished_jobs"] == 2

    # Past dead_retention_s, the DEAD job's row goes and its ciphertext is erased.
    counts = await store.prune(
        finished_before=now, dead_before=now - 90 * DAY, credentials_before=now, batch=2
    )
    assert counts["relay_sent"] == 1 and counts["dead_credentials"] == 1
    assert await _relay_status(store, dead) is None
    assert await _relay_status(store, running) == "SENT"
    dead_job = await store.get_job(dead)
    assert dead_job is not None and dead_job.status == "DEAD", "a DEAD job went before dead_s"

    # Past retention.dead_s the DEAD job itself goes; the RUNNING one never does.
    counts = await store.prune(now, dead_before=now, credentials_before=now, batch=2)
    assert counts["finished_jobs"] == 1 and await store.get_job(dead) is None
    assert (await store.get_job(running)) is not None


async def test_a_running_tasks_sent_row_survives(store: SqlStore) -> None:
    run, _ = await store.enqueue_task(
        str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, uuid.uuid4().hex, time.time()
    )
    page = await store.list_relay_rows(None, 10, None)
    row = next(r for r in page.items if r.task_id == run.id)
    now = time.time()
    claimed = await store.claim_relay_row(row.id, now, 30.0)
    assert claimed is not None
    assert await store.mark_relay_sent([(claimed, "msg-t")], now)

    await store.prune(now + 60, now + 60, now + 60, batch=10)
    assert (await store.get_relay_row(row.id)) is not None, "an unfinished task lost its row"

    await store.finish_task(run.id, "SUCCEEDED", None, now)
    await store.prune(now + 60, now + 60, now + 60, batch=10)
    assert await store.get_task(run.id) is None


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
async def test_the_store_refuses_non_finite_cut_offs(
    store: SqlStore, keys: KeyRing, bad: float
) -> None:
    done = (await succeed(store, (await submit_job(store, keys)).id)).id
    with pytest.raises(ValueError, match="finite"):
        await store.prune(bad, time.time(), time.time(), batch=10)
    with pytest.raises(ValueError, match="finite"):
        await store.prune(time.time(), bad, time.time(), batch=10)
    with pytest.raises(ValueError, match="finite"):
        await store.prune(time.time(), time.time(), bad, batch=10)
    assert await store.get_job(done) is not None


@pytest.mark.parametrize(
    "payload",
    [
        b'{"older_than_days": NaN}',
        b'{"older_than_days": Infinity}',
        b'{"older_than_days": -Infinity}',
        b'{"older_than_days": 1e999}',
        b'{"older_than_days": -1}',
        b'{"older_than_days": "0"}',
        b'{"older_than_days": true}',
        b'{"older_than_days": null}',
        b'{"older_than_dayz": 3}',
    ],
)
async def test_the_admin_api_refuses_a_prune_age_that_is_not_finite_and_non_negative(
    api: Client, store: SqlStore, payload: bytes
) -> None:
    body = b'{"type": "outbox.prune", "payload": ' + payload + b"}"
    resp = await api.post(
        "/v1/admin/tasks", data=body, headers={"Content-Type": "application/json"}
    )
    assert resp.status == 400, await resp.text()
    assert resp.content_type == "application/problem+json"
    assert (await resp.json())["code"] == "C01"
    assert (await store.list_tasks(None, 10, None)).items == []


@pytest.mark.parametrize("days", [0, 0.5, 30])
async def test_the_admin_api_accepts_finite_non_negative_ages(
    api: Client, store: SqlStore, days: float
) -> None:
    resp = await api.post(
        "/v1/admin/tasks", json={"type": "outbox.prune", "payload": {"older_than_days": days}}
    )
    assert resp.status == 202, await resp.text()
    assert len((await store.list_tasks(None, 10, None)).items) == 1
