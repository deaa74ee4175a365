"""Helpers for the administration and operations tests: real DEAD rows, the CLI, and
status counts read raw.

Counts come from tests/support/db.py (a driver of our own), so assertions about what the
API, /metrics or the CLI report never trust the code under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from outboxd.security import KeyRing
from outboxd.services.portal_jobs import LinkCredentials, PortalJobService
from outboxd.services.retries import publish_failure
from outboxd.services.websites import WebsiteService
from outboxd.storage.ports import JobRecord, NewPortalJob, RelayRow
from outboxd.storage.store import SqlStore
from tests.support.db import sql

TABLES = ("jobs", "relay_outbox", "work_outbox", "task_runs")


def sealing_key_id(keys: KeyRing) -> str:
    """The id of the key that seals now (the ring's first), as a sealed value names it."""
    return keys.seal(b"", b"").key_id


async def db_counts(db_url: str) -> dict[str, dict[str, int]]:
    """{table: {status: count}} straight from the database."""
    out: dict[str, dict[str, int]] = {}
    for table in TABLES:
        rows = await sql(db_url, f"SELECT status, COUNT(*) FROM {table} GROUP BY status")
        out[table] = {str(s): int(n) for s, n in rows}
    return out


def placeholder_job(
    job_id: str,
    outbox_id: str,
    key: str,
    user: str = "alice",
    claimed_until: float | None = None,
) -> NewPortalJob:
    """A portal job as the storage layer takes it, with placeholder credentials and
    fingerprint (for tests of the rows alone)."""
    return NewPortalJob(
        job_id=job_id,
        outbox_id=outbox_id,
        user_id=user,
        idempotency_key=key,
        fingerprint="fp",
        portal="suwon",
        key_id="k1",
        sealed=b"sealed-bytes",
        claimed_until=claimed_until,
    )


async def insert_portal_job(
    store: SqlStore,
    now: float,
    keys: KeyRing | None = None,
    password: str = "",
    claimed_until: float | None = None,
) -> tuple[str, str]:
    """A QUEUED portal job committed with its PENDING outbox row, straight through the
    store: (job id, outbox id). Sealed and fingerprinted with `keys` as the API would;
    without keys the credentials are placeholder bytes (for tests of the rows alone)."""
    job_id, outbox_id = str(uuid.uuid4()), str(uuid.uuid4())
    job = placeholder_job(job_id, outbox_id, f"key-{job_id}", claimed_until=claimed_until)
    if keys is not None:
        canonical = {"portal": "suwon", "username": "20201234", "password": password}
        box = keys.seal_json({"username": "20201234", "password": password}, associated_data=job_id)
        fingerprint = keys.fingerprint(canonical)
        job = replace(job, key_id=box.key_id, sealed=box.ciphertext, fingerprint=fingerprint)
    intake = await store.create_portal_job(job, now=now)
    assert intake.created
    return job_id, outbox_id


async def submit_job(
    store: SqlStore, keys: KeyRing, user: str = "alice", key: str | None = None
) -> JobRecord:
    """A QUEUED job with a PENDING relay row, made the way the API makes it (no queue)."""
    service = PortalJobService(store, keys, None)
    sub = await service.submit(
        user, key or uuid.uuid4().hex, LinkCredentials("suwon", "20201234", "pw-" + user)
    )
    return sub.job


async def kill_at_publish(store: SqlStore, job_id: str, error: str = "sqs down") -> RelayRow:
    """The job's relay row exhausts its publish attempts: row DEAD, job DEAD."""
    latest = await store.latest_relay_row_for_job(job_id)
    assert latest is not None
    now = time.time()
    claimed = await store.claim_relay_row(latest.id, now, 30.0)
    assert claimed is not None
    await store.mark_relay_failed([publish_failure(claimed, error, now + 1, dead=True)], now)
    row = await store.get_relay_row(latest.id)
    assert row is not None and row.status == "DEAD"
    job = await store.get_job(job_id)
    assert job is not None and job.status == "DEAD"
    return row


async def kill_task_at_publish(store: SqlStore, task_id: str) -> RelayRow:
    page = await store.list_relay_rows(None, 500, None)
    row = next(r for r in page.items if r.task_id == task_id)
    now = time.time()
    claimed = await store.claim_relay_row(row.id, now, 30.0)
    assert claimed is not None
    await store.mark_relay_failed([publish_failure(claimed, "sqs down", now + 1, dead=True)], now)
    return row


async def _published_and_running(store: SqlStore, job_id: str) -> tuple[float, JobRecord]:
    """The job's newest outbox row published (SENT) and a consumer run started."""
    latest = await store.latest_relay_row_for_job(job_id)
    assert latest is not None
    now = time.time()
    claimed = await store.claim_relay_row(latest.id, now, 30.0)
    assert claimed is not None
    assert await store.mark_relay_sent([(claimed, "msg-" + uuid.uuid4().hex[:8])], now)
    running = await store.start_job_run(job_id, now, 30.0)
    assert running is not None
    return now, running


async def kill_in_processing(store: SqlStore, job_id: str) -> JobRecord:
    """Published, then every processing attempt failed: relay row SENT, job DEAD."""
    now, _running = await _published_and_running(store, job_id)
    dead = await store.mark_job_dead(job_id, ("RETRIES_EXHAUSTED", "portal down"), now)
    assert dead is not None and dead.status == "DEAD"
    return dead


async def succeed(store: SqlStore, job_id: str) -> JobRecord:
    now, running = await _published_and_running(store, job_id)
    done = await store.finish_job(running, "SUCCEEDED", now, result={"ok": True})
    assert done is not None
    return done


async def fail(store: SqlStore, job_id: str) -> JobRecord:
    now, running = await _published_and_running(store, job_id)
    done = await store.finish_job(
        running, "FAILED", now, error=("PORTAL_AUTH_FAILED", "wrong password")
    )
    assert done is not None
    return done


ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, config: dict[str, Any]) -> Path:
    from testkit.daemon import dump_toml

    path = tmp_path / f"cli-{uuid.uuid4().hex[:6]}.toml"
    path.write_text(dump_toml(config))
    return path


def run_cli(
    *args: str,
    timeout_s: float = 60,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m outboxd ARGS` with no OUTBOXD_* variables inherited (`env`: added ones)."""
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")}
    return subprocess.run(
        [sys.executable, "-m", "outboxd", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env={**inherited, **(env or {})},
        cwd=cwd,
        check=False,
    )


async def register_website(store: SqlStore, domain: str, at: float | None = None) -> str:
    """A new website (PENDING classification) straight through the service, registered
    at epoch `at` (now by default): its id."""
    service = WebsiteService(store, clock=(lambda: at) if at is not None else time.time)
    website, created = await service.register(domain, None)
    assert created
    return website.id


async def jobs_in_each_status(store: SqlStore, keys: KeyRing) -> None:
    """Two QUEUED jobs and one each SUCCEEDED, FAILED and DEAD (its relay row DEAD too),
    for the reports that count rows by status."""
    await submit_job(store, keys, key="q1")
    await submit_job(store, keys, key="q2")
    await succeed(store, (await submit_job(store, keys, key="s")).id)
    await fail(store, (await submit_job(store, keys, key="f")).id)
    await kill_at_publish(store, (await submit_job(store, keys, key="d")).id)


@dataclass
class DeadJobs:
    """DEAD jobs as a bulk redrive meets them (`dead_jobs_of_every_kind`)."""

    erased: JobRecord  # died in processing, its credentials since erased: not redrivable
    at_publish: list[JobRecord]  # died at publish: their relay rows DEAD
    in_processing: JobRecord  # died in processing: its relay row SENT


async def dead_jobs_of_every_kind(store: SqlStore, keys: KeyRing, at_publish: int) -> DeadJobs:
    erased = await submit_job(store, keys, key="e")
    await kill_in_processing(store, erased.id)
    # outbox.prune erases a DEAD job's credentials after security.dead_retention_s.
    assert (await store.prune(0, 0, time.time() + 60, 100))["dead_credentials"] == 1
    published = [await submit_job(store, keys, key=f"p{i}") for i in range(at_publish)]
    for job in published:
        await kill_at_publish(store, job.id)
    in_processing = await submit_job(store, keys, key="w")
    await kill_in_processing(store, in_processing.id)
    return DeadJobs(erased, published, in_processing)
