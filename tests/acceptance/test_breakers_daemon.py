"""The portal's bad day against a real daemon (docs/contract.md#outside-systems-bad-days),
both backends: the portal answering 503 opens the breaker, the jobs wait (none DEAD, their
attempts unspent) and say why; /metrics, /v1/admin/dependencies and one `dependency_down`
line show it; the portal back, one probe closes it and every job succeeds with one
`dependency_up`. Then an operator's pause made with the CLI outlives a restart of the
daemon, holds a new job, and `outboxd resume` lets it run."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import aiohttp
import pytest
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from tests.acceptance.conftest import ConfigFactory, DaemonFactory, PortalThread
from tests.support.ops import run_cli
from tests.support.waits import eventually

pytestmark = pytest.mark.slow


async def _submit(http: aiohttp.ClientSession, base: str) -> str:
    async with http.post(
        f"{base}/v1/portal-link-jobs",
        json={"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD},
        headers={"Idempotency-Key": uuid.uuid4().hex},
    ) as resp:
        assert resp.status == 202, await resp.text()
        return str((await resp.json())["jobId"])


async def _job(http: aiohttp.ClientSession, base: str, job_id: str) -> dict[str, Any]:
    async with http.get(f"{base}/v1/jobs/{job_id}") as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def _all(
    http: aiohttp.ClientSession, base: str, ids: list[str], ok: Any, what: str, timeout_s: float
) -> list[dict[str, Any]]:
    async def reached() -> list[dict[str, Any]] | None:
        jobs = [await _job(http, base, j) for j in ids]
        return jobs if all(ok(j) for j in jobs) else None

    return await eventually(reached, timeout_s, what=what, interval=0.2)


async def test_an_outage_waited_out_and_a_pause_that_outlives_a_restart(
    pipeline_config: ConfigFactory, spawn_daemon: DaemonFactory, portal_thread: PortalThread
) -> None:
    portal = portal_thread.portal
    portal_thread.run(lambda: setattr(portal, "always_fail_503", True))
    config = pipeline_config(
        sqs={"max_receive_count": 2, "visibility_timeout_s": 10},
        consumer={"heartbeat_s": 2},
        breakers={"portal": {"open_after": 2, "probe_s": 1}},
        daemon={"roles": ["api", "relay", "consumer"]},
    )
    daemon = spawn_daemon(config, name="d")
    base = await asyncio.to_thread(daemon.start)
    async with aiohttp.ClientSession() as http:
        ids = [await _submit(http, base) for _ in range(4)]
        waiting = await _all(
            http,
            base,
            ids,
            lambda j: (j["waitingFor"] or {}).get("state") == "down",
            "every job waiting for the portal",
            60,
        )
        assert all(j["status"] in ("QUEUED", "RUNNING") for j in waiting)
        assert sum(j["attempts"] for j in waiting) == 1
        async with http.get(f"{base}/v1/admin/dependencies") as resp:
            portal_dep = next(i for i in (await resp.json())["items"] if i["name"] == "portal")
        assert portal_dep["state"] == "down" and "503" in portal_dep["lastError"]
        async with http.get(f"{base}/metrics") as resp:
            text = await resp.text()
        assert 'outboxd_dependency_state{dependency="portal",state="down"} 1.0' in text

        portal_thread.run(lambda: setattr(portal, "always_fail_503", False))
        done = await _all(
            http, base, ids, lambda j: j["status"] == "SUCCEEDED", "every job to succeed", 90
        )
        assert sum(j["attempts"] for j in done) == 4 + 1
        assert all(j["waitingFor"] is None for j in done)
        events = [e["event"] for e in daemon.events()]
        assert events.count("dependency_down") == 1 and events.count("dependency_up") == 1
        assert "job_dead" not in events

        paused = await asyncio.to_thread(
            run_cli, "pause", "portal", "--reason", "drill", "--config", str(daemon.config_path)
        )
        assert paused.returncode == 0, paused.stderr
    assert daemon.terminate() == 0, daemon.all_output()[-3000:]
    base = await asyncio.to_thread(daemon.start)
    async with aiohttp.ClientSession() as http:
        requests_before = await asyncio.to_thread(portal_thread.run, lambda: len(portal.requests))
        job_id = await _submit(http, base)
        await _all(
            http,
            base,
            [job_id],
            lambda j: (j["waitingFor"] or {}).get("state") == "paused",
            "the new job to wait for the paused portal",
            60,
        )
        assert await asyncio.to_thread(portal_thread.run, lambda: len(portal.requests)) == (
            requests_before
        )
        resumed = await asyncio.to_thread(
            run_cli, "resume", "portal", "--config", str(daemon.config_path)
        )
        assert resumed.returncode == 0, resumed.stderr
        await _all(http, base, [job_id], lambda j: j["status"] == "SUCCEEDED", "the job", 60)
    assert daemon.terminate() == 0, daemon.all_output()[-3000:]
