"""The job row and its outbox row commit together or not at all (a real database fault)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from outboxd.storage.store import SqlStore
from tests.support.db import (
    OUTBOX_FAULT,
    assert_nothing_stored,
    install_outbox_fault,
    raw_count,
    remove_outbox_fault,
)

URL = "/v1/portal-link-jobs"
SECRET = "pw-atomicity-7f3a9c"
BODY = {"portal": "suwon", "username": "20201234", "password": SECRET}


async def test_outbox_insert_failure_leaves_no_job(
    api: TestClient[Any, Any], store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """A failing outbox insert rolls back the job: 5xx problem+json, no row; later the key works."""
    await install_outbox_fault(db_url)
    try:
        resp = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-atomic"})
        text = await resp.text()
        assert 500 <= resp.status < 600, text
        assert resp.content_type == "application/problem+json"
        problem = json.loads(text)
        assert {"type", "title", "status", "detail", "code", "requestId"} <= set(problem)
        assert problem["status"] == resp.status
        assert SECRET not in text and "20201234" not in text
        assert OUTBOX_FAULT not in text  # driver messages stay in the logs
        await assert_nothing_stored(db_url)

        # The fault persists: a retry fails the same way and still leaves nothing.
        again = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-atomic"})
        assert 500 <= again.status < 600
        assert await raw_count(db_url, "jobs") == 0
    finally:
        await remove_outbox_fault(db_url)

    ok = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-atomic"})
    assert ok.status == 202, await ok.text()
    assert "Idempotent-Replayed" not in ok.headers
    body = await ok.json()
    job = await store.get_job(body["jobId"])
    assert job is not None and job.status == "QUEUED"
    outbox = await store.latest_relay_row_for_job(job.id)
    assert outbox is not None and outbox.id == body["dispatch"]["outboxId"]
    assert await raw_count(db_url, "jobs") == 1
    assert await raw_count(db_url, "relay_outbox") == 1
