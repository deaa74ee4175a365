"""A first end-to-end look at the in-process API on both backends."""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient

BODY = {"portal": "suwon", "username": "20201234", "password": "pw-smoke"}


async def test_accepts_a_job_and_shows_it(api: TestClient[Any, Any]) -> None:
    """A new job answers 202 QUEUED with a PENDING outbox row and is readable by id."""
    resp = await api.post("/v1/portal-link-jobs", json=BODY, headers={"Idempotency-Key": "k1"})
    assert resp.status == 202, await resp.text()
    body = await resp.json()
    assert body["status"] == "QUEUED"
    assert body["dispatch"]["status"] == "PENDING"
    got = await api.get(f"/v1/jobs/{body['jobId']}")
    assert got.status == 200
    assert (await got.json())["status"] == "QUEUED"
