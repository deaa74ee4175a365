"""Waiting instead of polling, with `outboxd serve` subprocesses on both backends:

- a change made by another daemon on the same database ends a held request: within
  0.5 s on Postgres (LISTEN/NOTIFY), within 2 s on one SQLite file (the poll);
- 1,000 requests held on one job are all answered once it finishes, and /healthz keeps
  answering meanwhile;
- SIGTERM answers every held request at once, with the job as it is.
"""

from __future__ import annotations

import asyncio
import signal
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest

from tests.acceptance.conftest import (
    ConfigFactory,
    DaemonFactory,
    PortalThread,
    Response,
    http_request,
)
from tests.acceptance.jobs import get_job, post_job, wait_terminal
from tests.conftest import sqlite_only
from tests.support.held import listening
from tests.support.waits import consistently_sync, eventually

pytestmark = pytest.mark.slow

# Only the API: jobs published at once stay RUNNING on the queue, nobody consumes them.
API_ONLY = {"roles": ["api"], "shutdown_timeout_s": 5.0}


def etag_of(base: str, job_id: str) -> str:
    resp = http_request("GET", f"{base}/v1/jobs/{job_id}")
    assert resp.status == 200
    return resp.headers["ETag"]


def hold(base: str, job_id: str, wait: int, etag: str | None = None) -> tuple[Response, float]:
    """GET with Prefer: wait (from a thread): the answer and when it arrived (monotonic)."""
    headers = {"Prefer": f"wait={wait}"}
    if etag is not None:
        headers["If-None-Match"] = etag
    resp = http_request("GET", f"{base}/v1/jobs/{job_id}", headers=headers, timeout_s=wait + 30)
    return resp, time.monotonic()


@pytest.mark.real_clock  # a held request is seen held only by its not being answered
@pytest.mark.parametrize("changed_by", ["cancel", "consumer"])
def test_a_change_by_another_daemon_ends_the_wait(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    portal_thread: PortalThread,
    backend: str,
    db_url: str,
    changed_by: str,
) -> None:
    spawned = time.time()
    waiter = spawn_daemon(pipeline_config(daemon=API_ONLY), name="waiter")
    roles = ["api"] if changed_by == "cancel" else ["api", "relay"]
    changer = spawn_daemon(pipeline_config(daemon={"roles": roles}), name="changer")
    base_w, base_c = waiter.start(), changer.start()
    resp = post_job(base_c, f"w-{changed_by}")
    assert resp.status == 202
    job_id = resp.json()["jobId"]
    etag = etag_of(base_w, job_id)
    if backend == "postgres":  # both daemons' change feeds listen
        asyncio.run(listening(db_url, n=2, since=spawned))
    bound = 0.5 if backend == "postgres" else 2.0
    with ThreadPoolExecutor(1) as pool:
        held = pool.submit(hold, base_w, job_id, 30, etag)
        consistently_sync(lambda: not held.done(), 0.5)  # held, not answered at once
        if changed_by == "cancel":
            cancel = http_request("POST", f"{base_c}/v1/jobs/{job_id}/cancel")
            changed_at = time.monotonic()
            assert cancel.status == 202 and cancel.json()["status"] == "CANCELLED"
            answer, arrived = held.result(timeout=30)
        else:
            # The other daemon's consumer starts the job: its first change after the wait began.
            changer.terminate()
            consumer = spawn_daemon(
                pipeline_config(daemon={"roles": ["api", "consumer"]}), name="consumer"
            )
            consumer.start()
            answer, arrived = held.result(timeout=30)
            changed_at = arrived  # the time of the commit is not seen from here
    assert answer.status == 200 and answer.headers["Preference-Applied"] == "wait=30"
    assert answer.headers["ETag"] != etag
    body = answer.json()
    if changed_by == "cancel":
        assert body["status"] == "CANCELLED"
        assert arrived - changed_at < bound, (arrived - changed_at, backend)
    else:
        assert body["status"] in ("RUNNING", "SUCCEEDED") and body["attempts"] >= 1
    assert waiter.terminate() == 0


def test_a_thousand_held_requests_are_answered_when_the_job_finishes(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    portal_thread: PortalThread,
) -> None:
    # One user's thousand held requests: its share raised to all of them.
    daemon = spawn_daemon(
        pipeline_config(
            server={"port": 0, "max_connections": 1500}, api={"max_waiters_per_user": 1000}
        )
    )
    base = daemon.start()
    portal_thread.run(lambda: setattr(portal_thread.portal, "delay_s", 0.5))  # ~6 s a job
    resp = post_job(base, "thousand")
    assert resp.status == 202
    job_id = resp.json()["jobId"]
    out = asyncio.run(_thousand(base, job_id))
    statuses = {(status, body["status"]) for status, body, _ in out["answers"]}
    assert statuses == {(200, "SUCCEEDED")}, statuses
    assert len(out["answers"]) == 1000
    # Held, not answered at once: the job was still running once all of them had been sent.
    assert out["running_after_sending"], "the job finished before the requests were held"
    # /healthz answered throughout (a generous bound: this is no benchmark).
    assert out["healthz"] and max(out["healthz"]) < 2.0, out["healthz"]
    job = get_job(base, job_id)
    assert job["status"] == "SUCCEEDED"
    assert daemon.terminate() == 0


async def _thousand(base: str, job_id: str) -> dict[str, Any]:
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    timeout = aiohttp.ClientTimeout(total=90)
    sent = 0

    async def on_sent(*_: Any) -> None:
        nonlocal sent
        sent += 1

    tracing = aiohttp.TraceConfig()
    tracing.on_request_headers_sent.append(on_sent)
    async with aiohttp.ClientSession(
        connector=connector, timeout=timeout, trace_configs=[tracing]
    ) as session:

        async def held() -> tuple[int, dict[str, Any], float]:
            async with session.get(f"{base}/v1/jobs/{job_id}", headers={"Prefer": "wait=60"}) as r:
                return r.status, await r.json(), time.monotonic()

        tasks = [asyncio.ensure_future(held()) for _ in range(1000)]
        await eventually(lambda: sent >= 1000, 30, what="every request sent")
        async with session.get(f"{base}/v1/jobs/{job_id}") as r:
            running = (await r.json())["status"] == "RUNNING"
        healthz: list[float] = []
        while not all(t.done() for t in tasks):
            started = time.monotonic()
            async with session.get(f"{base}/healthz") as r:
                assert r.status == 200
            healthz.append(time.monotonic() - started)
            await asyncio.wait(tasks, timeout=0.25)
        return {
            "answers": [t.result() for t in tasks],
            "running_after_sending": running,
            "healthz": healthz,
        }


@pytest.mark.real_clock  # held: not answered for a while
def test_sigterm_answers_every_held_request_at_once(
    pipeline_config: ConfigFactory, spawn_daemon: DaemonFactory, portal_thread: PortalThread
) -> None:
    daemon = spawn_daemon(pipeline_config(daemon=API_ONLY))
    base = daemon.start()
    resp = post_job(base, "sigterm")
    job_id = resp.json()["jobId"]
    etag = etag_of(base, job_id)
    with ThreadPoolExecutor(20) as pool:
        held = [pool.submit(hold, base, job_id, 60, etag if i % 2 else None) for i in range(20)]
        consistently_sync(lambda: not any(f.done() for f in held), 1.0)
        daemon.proc.send_signal(signal.SIGTERM)  # type: ignore[union-attr]
        signalled = time.monotonic()
        answers = [f.result(timeout=30) for f in held]
    for answer, arrived in answers:
        assert answer.status == 200, answer.text
        assert answer.json()["jobId"] == job_id and answer.json()["status"] == "RUNNING"
        assert answer.headers["Preference-Applied"] == "wait=60"
        # At once: not at the end of the wait, nor at the shutdown deadline (5 s).
        assert arrived - signalled < 3.0
    assert daemon.wait_exit(30) == 0


@pytest.mark.real_clock  # held: not answered for a while
@sqlite_only  # the poll is what SQLite has instead of notifications
def test_the_sqlite_file_is_polled_for_another_daemons_changes(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    portal_thread: PortalThread,
) -> None:
    """Several holds on several jobs, all changed by another daemon on the file: the one
    poll per second serves them all, each answered within 2 s."""
    waiter = spawn_daemon(pipeline_config(daemon=API_ONLY), name="w")
    changer = spawn_daemon(pipeline_config(daemon=API_ONLY), name="c")
    base_w, base_c = waiter.start(), changer.start()
    ids = [post_job(base_c, f"poll-{i}").json()["jobId"] for i in range(3)]
    with ThreadPoolExecutor(9) as pool:
        # Three holds per job, nine in all.
        held = [
            pool.submit(hold, base_w, job_id, 30, etag_of(base_w, job_id))
            for job_id in ids
            for _ in range(3)
        ]
        consistently_sync(lambda: not any(f.done() for f in held), 0.5)
        for job_id in ids:
            assert http_request("POST", f"{base_c}/v1/jobs/{job_id}/cancel").status == 202
        changed_at = time.monotonic()
        answers = [f.result(timeout=30) for f in held]
    for answer, arrived in answers:
        assert answer.status == 200 and answer.json()["status"] == "CANCELLED"
        assert arrived - changed_at < 2.0
    for job_id in ids:
        assert wait_terminal(base_w, job_id)["status"] == "CANCELLED"
    assert waiter.terminate() == 0
