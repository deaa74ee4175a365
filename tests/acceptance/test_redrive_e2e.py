"""A DEAD job redriven (once through the admin API, once through the CLI) runs again and
succeeds, with `error: null` (docs/contract.md#administration, #cli), and the DLQ sweep
then deletes the dead messages: the DLQ holds exactly the DEAD work. Both backends.

The daemon runs as a subprocess on moto; the portal is the threaded FakePortal, which
answers 503 to everything until the test lets it work, so both jobs die the real way:
their SQS message reaches `sqs.max_receive_count` (2) and the consumer marks them DEAD.
Its /metrics shows what the roles it runs export (no claimer, a consumer).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.storage.db import backend_of, known_schema_version
from tests.acceptance.conftest import ConfigFactory, DaemonFactory, PortalThread
from tests.support.ops import run_cli
from tests.support.waits import eventually

pytestmark = pytest.mark.slow


async def job_of(http: aiohttp.ClientSession, base: str, job_id: str) -> dict[str, Any]:
    async with http.get(f"{base}/v1/jobs/{job_id}") as resp:
        assert resp.status == 200, await resp.text()
        body: dict[str, Any] = await resp.json()
        return body


async def wait_status(
    http: aiohttp.ClientSession, base: str, job_id: str, status: str, timeout_s: float = 40
) -> dict[str, Any]:

    async def reached() -> dict[str, Any] | None:
        body = await job_of(http, base, job_id)
        return body if body["status"] == status else None

    return await eventually(reached, timeout_s, what=f"job {job_id} {status}", interval=0.2)


async def test_dead_jobs_redriven_by_api_and_cli_succeed(
    pipeline_config: ConfigFactory, spawn_daemon: DaemonFactory, portal_thread: PortalThread
) -> None:
    portal = portal_thread.portal

    def portal_fails(fails: bool) -> None:
        portal_thread.run(lambda: setattr(portal, "always_fail_503", fails))

    portal_fails(True)
    config = pipeline_config(
        sqs={"max_receive_count": 2, "visibility_timeout_s": 10},
        consumer={"heartbeat_s": 2, "dlq_sweep_s": 0.5},
        daemon={"roles": ["api", "relay", "consumer"]},
    )
    daemon = spawn_daemon(config, name="d")
    base = await asyncio.to_thread(daemon.start)
    try:
        async with aiohttp.ClientSession() as http:
            ids = []
            for _ in range(2):
                async with http.post(
                    f"{base}/v1/portal-link-jobs",
                    json={
                        "portal": "suwon",
                        "username": SAMPLE_SNO,
                        "password": SAMPLE_PASSWORD,
                    },
                    headers={"Idempotency-Key": uuid.uuid4().hex},
                ) as resp:
                    assert resp.status == 202, await resp.text()
                    ids.append((await resp.json())["jobId"])
            by_api, by_cli = ids
            for job_id in ids:
                dead = await wait_status(http, base, job_id, "DEAD")
                assert dead["error"]["code"] == "RETRIES_EXHAUSTED"
                assert "PORTAL_UNAVAILABLE" in dead["error"]["message"]
                assert dead["attempts"] == 2
                assert dead["result"] is None

            portal_fails(False)

            async with http.post(f"{base}/v1/admin/jobs/{by_api}/redrive") as resp:
                assert resp.status == 202, await resp.text()
                body = await resp.json()
                assert body["status"] == "QUEUED" and body["error"] is None
            done = await asyncio.to_thread(
                run_cli, "jobs", "redrive", by_cli, "--config", str(daemon.config_path)
            )
            assert done.returncode == 0, done.stderr
            assert by_cli in done.stdout

            for job_id in ids:
                ok = await wait_status(http, base, job_id, "SUCCEEDED")
                assert ok["error"] is None
                assert ok["attempts"] == 3
                assert ok["finishedAt"] is not None
                assert ok["result"]["student"]["studentNumber"] == SAMPLE_SNO
                assert len(ok["result"]["semesters"]) == 3

            # Each job now has two relay rows: the spent one (SENT) and the redrive's.
            async with http.get(f"{base}/v1/admin/outbox", params={"limit": "50"}) as resp:
                items = (await resp.json())["items"]
            for job_id in ids:
                rows = [i for i in items if i.get("jobId") == job_id]
                assert [r["status"] for r in rows] == ["SENT", "SENT"], rows
            async with http.get(f"{base}/v1/admin/stats") as resp:
                stats = await resp.json()
            assert stats["tables"]["jobs"] == {"SUCCEEDED": 2}
            # The first messages went to the DLQ, as SQS intends; their jobs are not DEAD
            # any more, so the sweep deletes them.

            async def dlq_emptied() -> bool:
                async with http.get(f"{base}/v1/admin/stats") as resp:
                    return bool((await resp.json())["queues"]["jobs"]["dlq"] == 0)

            await eventually(dlq_emptied, 30, what="the DLQ swept", interval=0.3)

            async with http.get(f"{base}/metrics") as resp:
                assert resp.status == 200
                metrics = {
                    (s.name, tuple(sorted(s.labels.items()))): s.value
                    for f in text_string_to_metric_families(await resp.text())
                    for s in f.samples
                }
            names = {name for name, _ in metrics}
            assert "outboxd_claimer_last_tick_timestamp_seconds" not in names  # no claimer role
            received = metrics[
                ("outboxd_consumer_last_receive_timestamp_seconds", (("queue", "jobs"),))
            ]
            assert received > time.time() - 60
            assert metrics[("outboxd_dead_total", (("table", "jobs"),))] == 2
            assert metrics[("outboxd_rows", (("status", "DEAD"), ("table", "jobs")))] == 0
            assert "process_start_time_seconds" in names
            # The portal's requests by outcome: the first request of each of the four
            # failed runs answered 503; each of the two runs after the redrives made a
            # job's twelve requests.
            portal = {
                dict(labels)["outcome"]: value
                for (name, labels), value in metrics.items()
                if name == "outboxd_portal_requests_total"
            }
            assert portal == {
                "ok": 24,
                "unavailable": 4,
                "rejected": 0,
                "rate_limited": 0,
                "timeout": 0,
                "error": 0,
            }
            known = known_schema_version(backend_of(config["storage"]["url"]))
            schemas = {
                dict(labels)["schema"] for (name, labels) in metrics if name == "outboxd_build_info"
            }
            assert schemas == {str(known)}
    finally:
        code = await asyncio.to_thread(daemon.terminate)
    assert code == 0, daemon.all_output()[-3000:]
    events = daemon.events()
    dead_events = [e for e in events if e["event"] == "job_dead"]
    assert sorted(e["job_id"] for e in dead_events) == sorted(ids)
    assert [e["job_id"] for e in events if e["event"] == "job_redriven"] == [by_api]
    succeeded = [e["job_id"] for e in events if e["event"] == "job_succeeded"]
    assert sorted(succeeded) == sorted(ids)
    swept = [e for e in events if e["event"] == "dlq_message_deleted"]
    assert sorted((e["job_id"], e["reason"]) for e in swept) == sorted(
        (job_id, "job_redriven") for job_id in ids
    )
    assert SAMPLE_PASSWORD not in daemon.all_output()
