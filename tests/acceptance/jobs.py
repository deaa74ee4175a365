"""A portal job over the daemon's HTTP API, for the acceptance tests: submit it, read it,
wait for its end, and what the admin API says of its outbox row and queue."""

from __future__ import annotations

from typing import Any

from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from tests.acceptance.conftest import Response, http_request
from tests.support.waits import eventually_sync


def post_job(base: str, key: str, password: str = SAMPLE_PASSWORD) -> Response:
    return http_request(
        "POST",
        f"{base}/v1/portal-link-jobs",
        {"portal": "suwon", "username": SAMPLE_SNO, "password": password},
        headers={"Idempotency-Key": key},
    )


def get_job(base: str, job_id: str) -> dict[str, Any]:
    resp = http_request("GET", f"{base}/v1/jobs/{job_id}")
    assert resp.status == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def wait_terminal(base: str, job_id: str, timeout_s: float = 30.0) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        job = get_job(base, job_id)
        return job if job["status"] in ("SUCCEEDED", "FAILED", "DEAD", "CANCELLED") else None

    return eventually_sync(done, timeout_s, what=f"job {job_id} to finish")


def outbox_rows_of(base: str, job_id: str) -> list[dict[str, Any]]:
    resp = http_request("GET", f"{base}/v1/admin/outbox?limit=100")
    assert resp.status == 200, resp.text
    return [i for i in resp.json()["items"] if i.get("jobId") == job_id]


def queue_depth(base: str) -> dict[str, int]:
    resp = http_request("GET", f"{base}/v1/admin/stats")
    assert resp.status == 200, resp.text
    depth: dict[str, int] = resp.json()["queues"]["jobs"]
    return depth
