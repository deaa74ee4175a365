"""Graceful shutdown with work in flight (a slow portal, a slow AI provider).

- SIGTERM while jobs and a classification are running and can finish within
  `daemon.shutdown_timeout_s`: they finish (SUCCEEDED / COMPLETED, no PROCESSING row, no
  job lease left), the process exits 0 within the timeout.
- SIGTERM while a job cannot finish in time: exit 0 right after the timeout, the job's
  lease released and its message visible again at once, so a restarted daemon picks it
  up well within a visibility timeout; it then succeeds. A classification cut short is
  finished after a restart too.
- A second SIGTERM exits at once; a restart still finishes everything.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Generator
from typing import Any

import pytest
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from outboxd.queue.sqs import QueueDepth
from outboxd.storage.db import Op, Query, fetch
from outboxd.storage.postgres import PostgresDatabase
from tests.conftest import sqlite_only
from tests.reliability.conftest import MakeDaemon
from tests.reliability.harness import (
    Db,
    Fakes,
    http,
    log_events,
    register_website,
    student_number,
)
from tests.support.sqs import queues_named
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow


def submit(base: str, n: int) -> str:
    resp = http(
        "POST",
        base,
        "/v1/portal-link-jobs",
        {"portal": "suwon", "username": student_number(n), "password": f"pw-{n}"},
        {"Idempotency-Key": f"shutdown-{n}"},
    )
    assert resp.status == 202, resp.text
    return str(resp.json()["jobId"])


def started(daemon: DaemonProcess, job_id: str) -> list[dict[str, Any]]:
    return [
        e for e in log_events([daemon]) if e["event"] == "job_started" and e["job_id"] == job_id
    ]


def work_in_flight(daemon: DaemonProcess, db: Db, jobs: range, domain: str) -> list[str]:
    """Starts `daemon`, submits the jobs numbered `jobs` and registers `domain`; returns
    the job ids once every job runs and the website is claimed."""
    base = daemon.start()
    job_ids = [submit(base, i) for i in jobs]
    register_website(base, domain)
    eventually_sync(lambda: all(started(daemon, j) for j in job_ids), 15, what="the jobs running")
    eventually_sync(
        lambda: db.scalar("SELECT status FROM work_outbox") == "PROCESSING",
        15,
        what="the website claimed",
    )
    return job_ids


def queue_depth(moto_server: MotoServer, queue_names: dict[str, str]) -> QueueDepth:
    """The jobs queue's depth, read with a client of the test's own."""

    async def read() -> QueueDepth:
        async with queues_named(moto_server.endpoint_url, queue_names) as q:
            return await q.depth("jobs")

    return asyncio.run(read())


def sigterm_and_time(daemon: DaemonProcess, timeout_s: float = 30) -> tuple[int, float]:
    t0 = time.monotonic()
    code = daemon.terminate(timeout_s=timeout_s)
    return code, time.monotonic() - t0


@pytest.mark.timeout(90)
def test_sigterm_lets_work_in_flight_finish(make_daemon: MakeDaemon, fakes: Fakes, db: Db) -> None:
    # A job is about ten portal requests: ~1.2 s each; a classification 1 s.
    fakes.set_portal(delay_s=0.12)
    fakes.set_ai(delay_s=1.0)
    daemon = make_daemon(
        sqs={"visibility_timeout_s": 10},
        consumer={"heartbeat_s": 2.0},
        scrapers={"classifier": {"timeout_s": 2.5}},
        claimer={"processing_timeout_s": 5.0},
        daemon={"shutdown_timeout_s": 6.0},
    )
    work_in_flight(daemon, db, range(2), "inflight.example")

    code, took = sigterm_and_time(daemon)
    print(f"\nshutdown with 2 jobs and 1 classification in flight: exit {code} in {took:.2f}s")

    assert code == 0
    assert took < 6.0 + 2.0
    events = {e["event"] for e in log_events([daemon])}
    assert "shutdown_deadline_cancel" not in events
    rows = db.rows("SELECT id, status, lease_until FROM jobs")
    assert {r["status"] for r in rows} == {"SUCCEEDED"}, rows
    assert all(r["lease_until"] is None for r in rows)
    assert db.rows("SELECT status FROM work_outbox") == [{"status": "COMPLETED"}]
    assert db.scalar("SELECT category FROM websites") is not None
    assert {r["status"] for r in db.rows("SELECT status FROM relay_outbox")} == {"SENT"}


@pytest.mark.timeout(120)
def test_sigterm_releases_what_cannot_finish_and_a_restart_picks_it_up(
    make_daemon: MakeDaemon,
    fakes: Fakes,
    db: Db,
    moto_server: MotoServer,
    queue_names: dict[str, str],
) -> None:
    visibility_s = 10
    processing_timeout_s = 5.0
    fakes.set_portal(delay_s=1.0)  # a job takes ~10 s: it cannot finish in 1.5 s
    fakes.set_ai(delay_s=3.0)
    daemon = make_daemon(
        sqs={"visibility_timeout_s": visibility_s},
        consumer={"heartbeat_s": 2.0},
        scrapers={"suwon": {"timeout_s": 3.0}, "classifier": {"timeout_s": 4.0}},
        claimer={"processing_timeout_s": processing_timeout_s},
        daemon={"shutdown_timeout_s": 1.5},
    )
    [job_id] = work_in_flight(daemon, db, range(1, 2), "slowai.example")

    code, took = sigterm_and_time(daemon)
    print(f"\nshutdown with unfinishable work: exit {code} in {took:.2f}s")
    assert code == 0
    # Postgres: +5 s while the pool waits for a connection that is never given back
    # (the test_closing_the_postgres_pool_waits_for_nothing below).
    assert took < 1.5 + 2.5 + (5.0 if db.url.startswith("postgres") else 0.0)
    job = db.rows("SELECT status, lease_until, attempts FROM jobs WHERE id = ?", job_id)[0]
    assert job["status"] == "RUNNING" and job["lease_until"] is None, job  # released
    assert any(e["event"] == "job_released" for e in log_events([daemon]))
    # The message is visible again right now, not after the visibility timeout.
    assert queue_depth(moto_server, queue_names) == QueueDepth(1, 0, 0)
    # The classification cut short went back to PENDING with its attempt counted.
    work_after_exit = db.rows("SELECT status, attempt_count FROM work_outbox")[0]
    assert work_after_exit == {"status": "PENDING", "attempt_count": 1}, work_after_exit

    # The outside world is fast again; a restart must pick the job up at once, not after
    # the 10 s visibility timeout nor the job lease (both given back at shutdown).
    fakes.set_portal(delay_s=0.0)
    fakes.set_ai(delay_s=0.0)
    restart = time.monotonic()
    base = daemon.start()
    t_start = eventually_sync(
        lambda: len(started(daemon, job_id)) >= 2 and time.monotonic(),
        visibility_s,
        what="the job picked up again",
    )
    print(f"picked up {t_start - restart:.2f}s after the restart (visibility {visibility_s}s)")
    eventually_sync(
        lambda: db.scalar("SELECT status FROM jobs WHERE id = ?", job_id) == "SUCCEEDED",
        20,
        what="the job to succeed",
    )
    # The classification cut short is finished too (after its processing timeout at most).
    eventually_sync(
        lambda: db.scalar("SELECT status FROM work_outbox") == "COMPLETED",
        processing_timeout_s + 10,
        what="the website classified",
    )
    assert db.scalar("SELECT version FROM websites") == 1
    assert http("GET", base, f"/v1/jobs/{job_id}").json()["error"] is None
    assert daemon.terminate() == 0


@pytest.mark.timeout(90)
@sqlite_only
def test_a_second_sigterm_exits_at_once_and_nothing_is_lost(
    make_daemon: MakeDaemon, fakes: Fakes, db: Db
) -> None:
    fakes.set_portal(delay_s=1.0)
    daemon = make_daemon(
        sqs={"visibility_timeout_s": 3},
        consumer={"heartbeat_s": 1.0},
        scrapers={"suwon": {"timeout_s": 3.0}},
        daemon={"shutdown_timeout_s": 20.0},
    )
    base = daemon.start()
    job_id = submit(base, 2)
    eventually_sync(lambda: started(daemon, job_id), 15, what="the job running")
    assert daemon.proc is not None
    daemon.proc.send_signal(signal.SIGTERM)
    eventually_sync(
        lambda: any(e["event"] == "shutdown_requested" for e in daemon.events()),
        10,
        what="the first SIGTERM handled",
    )
    t0 = time.monotonic()
    daemon.proc.send_signal(signal.SIGTERM)
    code = daemon.wait_exit(timeout_s=10)
    took = time.monotonic() - t0
    print(f"\nsecond SIGTERM: exit {code} after {took:.2f}s")
    assert took < 1.0
    assert code != -signal.SIGKILL
    assert any(e["event"] == "second_signal_exit" for e in log_events([daemon]))

    fakes.set_portal(delay_s=0.0)
    daemon.start()
    eventually_sync(
        lambda: db.scalar("SELECT status FROM jobs WHERE id = ?", job_id) == "SUCCEEDED",
        30,
        what="the job to succeed after a restart",
    )
    assert daemon.terminate() == 0


@pytest.mark.postgres
async def test_closing_the_postgres_pool_waits_for_nothing(pg_database: str) -> None:
    db = PostgresDatabase(pg_database, 5, 2.0)
    await db.open()
    done = asyncio.Event()
    begun = asyncio.Event()

    def body() -> Generator[Op, Any, Any]:
        begun.set()  # in the transaction, on its connection
        return (yield fetch(Query("slow", "SELECT pg_sleep(0.05)", ()), {}))

    async def short_transaction() -> None:
        await db.run(body)
        done.set()

    task = asyncio.create_task(short_transaction())
    await asyncio.wait_for(begun.wait(), 5)  # the transaction holds its connection now
    started = time.monotonic()
    await db.close()
    took = time.monotonic() - started
    await task
    assert done.is_set()
    assert took < 1.0, f"close() took {took:.2f}s for a transaction that ended after 0.05 s"
