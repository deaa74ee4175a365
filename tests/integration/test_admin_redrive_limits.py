"""The bulk redrive (POST /v1/admin/jobs/redrive) at its limits, on both backends: exactly
the most job ids a request may name (500) and the largest `limit` (10,000) are accepted,
and every named DEAD job is redriven, those at the edges of the service's batches too.
One past either limit is 400 C01 (tests/integration/test_admin_api.py)."""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp.test_utils import TestClient

from outboxd.http.bulk_models import REDRIVE_MAX_IDS, REDRIVE_MAX_LIMIT
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from tests.support.ops import kill_at_publish, submit_job

Client = TestClient[Any, Any]
URL = "/v1/admin/jobs/redrive"


async def test_exactly_the_most_job_ids_are_accepted_and_each_dead_one_redriven(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    ids = [str(uuid.uuid4()) for _ in range(REDRIVE_MAX_IDS)]
    # DEAD jobs first and last, and on both sides of the service's batch edges (100).
    dead_at = (0, 99, 100, 199, 200, REDRIVE_MAX_IDS - 1)
    for i in dead_at:
        job = await submit_job(store, keys, key=f"edge-{i}")
        await kill_at_publish(store, job.id)
        ids[i] = job.id

    resp = await api.post(URL, json={"status": "DEAD", "jobIds": ids})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["jobIds"] == [ids[i] for i in dead_at]
    assert body["redriven"] == len(dead_at)
    refused = {r["jobId"] for r in body["refused"]}
    assert refused == set(ids) - {ids[i] for i in dead_at}
    assert {r["reason"] for r in body["refused"]} == {"no such job"}
    for i in dead_at:
        job = await store.get_job(ids[i])
        assert job is not None and job.status == "QUEUED", (i, job)


async def test_the_largest_limit_is_accepted(api: Client, store: SqlStore, keys: KeyRing) -> None:
    dead = await submit_job(store, keys, key="limit")
    await kill_at_publish(store, dead.id)
    resp = await api.post(URL, json={"status": "DEAD", "limit": REDRIVE_MAX_LIMIT})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert (body["jobIds"], body["more"]) == ([dead.id], False)


async def test_a_redrive_of_the_ids_shown_touches_those_only(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    """`{"jobIds": [...]}` alone: the DEAD ones named go back to QUEUED, the others are
    skipped with a code, and a DEAD job not named stays DEAD (it died after the listing)."""
    dead = await submit_job(store, keys, key="shown-dead")
    await kill_at_publish(store, dead.id)
    alive = await submit_job(store, keys, key="shown-queued")
    later = await submit_job(store, keys, key="died-later")
    await kill_at_publish(store, later.id)
    unknown = str(uuid.uuid4())
    resp = await api.post(URL, json={"jobIds": [dead.id, alive.id, unknown]})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {
        "redriven": [dead.id],
        "skipped": [
            {"jobId": alive.id, "code": "NOT_DEAD"},
            {"jobId": unknown, "code": "NOT_FOUND"},
        ],
    }
    still = await store.get_job(later.id)
    assert still is not None and still.status == "DEAD"
    too_many = [str(uuid.uuid4()) for _ in range(REDRIVE_MAX_IDS + 1)]
    refused = await api.post(URL, json={"jobIds": too_many})
    assert refused.status == 400
