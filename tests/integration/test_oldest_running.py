"""The oldest RUNNING job: jobs published to SQS and not finished (a backlog behind a
failing portal) show in the stats, `outboxd status` and /metrics, where "oldest pending"
(QUEUED, not yet published) says nothing about them. Both backends."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from tests.conftest import SettingsFactory
from tests.support.ops import insert_portal_job, run_cli, submit_job, write_config

Client = TestClient[Any, Any]
HOUR = 3600.0
METRIC = "outboxd_oldest_running_job_age_seconds"


@pytest_asyncio.fixture
async def client(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> AsyncIterator[Client]:
    """The API in process, its gauges read again at every scrape."""
    settings = make_settings(metrics={"refresh_s": 0})
    deps = build_api_deps(settings, store, keys, Metrics(), None, dispatcher=None)
    c: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await c.start_server()
    yield c
    await c.close()


async def publish(store: SqlStore, job_id: str) -> None:
    """The job's outbox row SENT, as the relay marks it: the job is RUNNING (in SQS)."""
    row = await store.latest_relay_row_for_job(job_id)
    assert row is not None
    now = time.time()
    claimed = await store.claim_relay_row(row.id, now, 30.0)
    assert claimed is not None
    assert await store.mark_relay_sent([(claimed, "msg-" + uuid.uuid4().hex[:8])], now)


def gauge(text: str, name: str) -> float:
    values = [
        s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name
    ]
    assert len(values) == 1, values
    return values[0]


async def test_jobs_waiting_in_sqs_show_as_the_oldest_running(
    client: Client, store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path
) -> None:
    # Nothing runs: null in the stats, 0 on /metrics.
    stats = await (await client.get("/v1/admin/stats")).json()
    assert stats["oldestRunningJobAgeSeconds"] is None
    assert gauge(await (await client.get("/metrics")).text(), METRIC) == 0

    # Two jobs accepted an hour and ten minutes ago, published and waiting in SQS; one
    # fresh job still QUEUED.
    old, _ = await insert_portal_job(store, time.time() - HOUR)
    newer, _ = await insert_portal_job(store, time.time() - 600)
    for job_id in (old, newer):
        await publish(store, job_id)
    await submit_job(store, keys, key="fresh")

    stats = await (await client.get("/v1/admin/stats")).json()
    assert stats["tables"]["jobs"] == {"QUEUED": 1, "RUNNING": 2}
    assert HOUR <= stats["oldestRunningJobAgeSeconds"] < HOUR + 120
    # The pending age keeps its meaning: the QUEUED job, seconds old.
    assert 0 <= stats["oldestPendingAgeSeconds"]["jobs"] < 120
    age = gauge(await (await client.get("/metrics")).text(), METRIC)
    assert HOUR <= age < HOUR + 120

    config = {"storage": {"url": db_url, "auto_migrate": False}}
    done = run_cli("status", "--config", str(write_config(tmp_path, config)))
    assert done.returncode == 0, done.stderr
    line = next(s for s in done.stdout.splitlines() if s.startswith("oldest running jobs"))
    assert HOUR <= float(line.split()[-2]) < HOUR + 120
    done = run_cli("status", "--json", "--config", str(write_config(tmp_path, config)))
    assert done.returncode == 0, done.stderr
    assert '"oldestRunningJobAgeSeconds": ' in done.stdout
