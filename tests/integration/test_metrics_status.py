"""/metrics, `outboxd status --json` and /readyz against the database's own counts.

Both backends. The API runs in process with real SQS queues on the session's moto
server; the CLI runs as a subprocess on a config file naming the same database.
"""

from __future__ import annotations

import json
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from outboxd.config import Settings
from outboxd.daemon.app import build_api_deps
from outboxd.http.app import create_app
from outboxd.observability import Metrics
from outboxd.queue.sqs import OutgoingMessage, SqsQueues
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore, open_store
from tests.conftest import SettingsFactory
from tests.support.moto import MotoServer, free_port
from tests.support.ops import (
    db_counts,
    fail,
    kill_at_publish,
    kill_in_processing,
    kill_task_at_publish,
    run_cli,
    submit_job,
    succeed,
    write_config,
)

Client = TestClient[Any, Any]


@pytest_asyncio.fixture
async def queues(moto_server: MotoServer, queue_names: dict[str, str]) -> AsyncIterator[SqsQueues]:
    settings = Settings.from_mapping(
        {"sqs": {"endpoint_url": moto_server.endpoint_url, **queue_names}}, env={}
    )
    q = SqsQueues(settings.sqs, moto_server.endpoint_url)
    await q.start()
    yield q
    await q.close()


async def serve(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing, queues: SqsQueues | None
) -> Client:
    deps = build_api_deps(make_settings(), store, keys, Metrics(), queues=queues, dispatcher=None)
    client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    return client


@pytest_asyncio.fixture
async def api_sqs(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> AsyncIterator[Client]:
    client = await serve(make_settings, store, keys, queues)
    yield client
    await client.close()


async def mixed_run(store: SqlStore, keys: KeyRing, queues: SqsQueues) -> None:
    """Rows in most states of every table, and messages on the queues."""
    await submit_job(store, keys, key="queued-1")
    await submit_job(store, keys, key="queued-2")
    running = await submit_job(store, keys, key="running")
    row = await store.latest_relay_row_for_job(running.id)
    assert row is not None
    claimed = await store.claim_relay_row(row.id, time.time(), 30)
    assert claimed is not None
    await store.mark_relay_sent([(claimed, "m-running")], time.time())
    await succeed(store, (await submit_job(store, keys, key="ok")).id)
    await fail(store, (await submit_job(store, keys, key="bad-password")).id)
    await kill_at_publish(store, (await submit_job(store, keys, key="dead-publish")).id)
    await kill_in_processing(store, (await submit_job(store, keys, key="dead-work")).id)

    now = time.time()
    for domain in ("a.example", "b.example", "c.example", "d.example"):
        await store.register_website(str(uuid.uuid4()), str(uuid.uuid4()), domain, None, now)
    done = await store.claim_work(now, 60, 300)
    assert done is not None and await store.complete_work(done, "news", now)
    final = await store.claim_work(now, 60, 300)
    assert final is not None and await store.fail_work(final, "nope", True, now)
    assert await store.claim_work(now, 60, 300) is not None  # left PROCESSING

    finished, _ = await store.enqueue_task(
        str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, "t1", now
    )
    await store.finish_task(finished.id, "SUCCEEDED", None, now)
    dead_task, _ = await store.enqueue_task(
        str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, "t2", now
    )
    await kill_task_at_publish(store, dead_task.id)
    await store.enqueue_task(str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, "t3", now)

    # Three messages on the jobs queue, one on the tasks queue (depth shows in both reports).
    await queues.send_batch(
        "jobs", [OutgoingMessage(f"e{i}", json.dumps({"jobId": f"x{i}"})) for i in range(3)]
    )
    await queues.send_batch(
        "tasks", [OutgoingMessage("t", json.dumps({"taskId": "x"}), "noop", "dedup-x")]
    )


def metric_samples(text: str, name: str, keys: tuple[str, str]) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                assert set(s.labels) == set(keys), s.labels
                out[(s.labels[keys[0]], s.labels[keys[1]])] = s.value
    return out


def rows_gauges(text: str) -> dict[tuple[str, str], float]:
    return metric_samples(text, "outboxd_rows", ("table", "status"))


def as_gauges(counts: dict[str, dict[str, int]]) -> dict[tuple[str, str], float]:
    return {(t, s): float(n) for t, per in counts.items() for s, n in per.items()}


def cli(tmp_path: Path, config: dict[str, Any], *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, "--config", str(write_config(tmp_path, config)))


async def test_metrics_and_status_report_the_database_counts(
    api_sqs: Client,
    store: SqlStore,
    keys: KeyRing,
    queues: SqsQueues,
    db_url: str,
    tmp_path: Path,
    moto_server: MotoServer,
    queue_names: dict[str, str],
) -> None:
    await mixed_run(store, keys, queues)
    truth = await db_counts(db_url)
    # The mixed run really is mixed.
    assert set(truth["jobs"]) == {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD"}
    assert set(truth["relay_outbox"]) == {"PENDING", "SENT", "DEAD"}
    assert set(truth["work_outbox"]) == {"PENDING", "PROCESSING", "COMPLETED", "FAILED"}
    assert set(truth["task_runs"]) == {"PENDING", "SUCCEEDED", "DEAD"}

    resp = await api_sqs.get("/metrics")
    assert resp.status == 200
    assert resp.content_type == "text/plain"
    text = await resp.text()
    assert rows_gauges(text) == as_gauges(truth)
    depth = metric_samples(text, "outboxd_queue_depth", ("queue", "state"))
    assert depth[("jobs", "visible")] == 3
    assert depth[("tasks", "visible")] == 1
    assert depth[("jobs", "dlq")] == depth[("tasks", "dlq")] == 0
    ages = {
        s.labels["table"]: s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "outboxd_oldest_pending_age_seconds"
    }
    assert set(ages) == {"jobs", "relay_outbox", "work_outbox", "task_runs"}
    assert all(0 <= v < 120 for v in ages.values())

    config = {
        "storage": {"url": db_url, "auto_migrate": False},
        "sqs": {"endpoint_url": moto_server.endpoint_url, **queue_names},
    }
    done = cli(tmp_path, config, "status", "--json")
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["tables"] == truth
    assert status["queues"]["jobs"] == {"visible": 3, "inFlight": 0, "dlq": 0}
    assert status["queues"]["tasks"] == {"visible": 1, "inFlight": 0, "dlq": 0}
    assert set(status["oldestPendingAgeSeconds"]) == set(truth)

    # A change in the database shows at the next scrape (gauges are read, not counted).
    await submit_job(store, keys, key="one-more")
    truth2 = await db_counts(db_url)
    text2 = await (await api_sqs.get("/metrics")).text()
    assert rows_gauges(text2) == as_gauges(truth2)
    stats = await (await api_sqs.get("/v1/admin/stats")).json()
    assert stats["tables"] == truth2


async def test_status_degrades_when_sqs_is_unreachable(
    store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path
) -> None:
    await submit_job(store, keys)
    await kill_at_publish(store, (await submit_job(store, keys, key="d")).id)
    truth = await db_counts(db_url)
    config = {
        "storage": {"url": db_url},
        "sqs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
    }
    started = time.monotonic()
    done = cli(tmp_path, config, "status", "--json")
    assert done.returncode == 0, done.stderr
    assert time.monotonic() - started < 30
    status = json.loads(done.stdout)
    assert status["tables"] == truth
    assert status["queues"] is None

    human = cli(tmp_path, config, "status")
    assert human.returncode == 0, human.stderr
    assert "DEAD" in human.stdout
    assert "queues: not reachable (SQS did not answer)" in human.stdout
    assert "Traceback" not in human.stderr


async def test_readyz_ok_when_database_and_sqs_answer(api_sqs: Client) -> None:
    resp = await api_sqs.get("/readyz")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["status"] == "ok"
    assert body["checks"] == {"database": "ok", "sqs": "ok"}


async def test_readyz_503_names_sqs_when_it_is_unreachable(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    dead = SqsQueues(make_settings(sqs={"endpoint_url": endpoint}).sqs, endpoint)
    # As in the daemon while SQS is down: start() failed, the API serves on.
    started = False
    try:
        await dead.start()
        started = True
    except Exception:  # noqa: S110 - expected: nothing listens there
        pass
    assert not started
    client = await serve(make_settings, store, keys, dead)
    try:
        resp = await client.get("/readyz")
        assert resp.status == 503, await resp.text()
        body = await resp.json()
        assert body["status"] == "unavailable"
        assert body["checks"]["database"] == "ok"
        assert body["checks"]["sqs"] != "ok" and body["checks"]["sqs"]
        # /healthz is about the event loop only; /metrics still scrapes without SQS.
        assert (await client.get("/healthz")).status == 200
        metrics = await client.get("/metrics")
        assert metrics.status == 200
        assert "outboxd_rows" in await metrics.text()
    finally:
        await client.close()
        await dead.close()


async def test_readyz_503_names_the_database_when_it_is_down(
    make_settings: SettingsFactory, keys: KeyRing, db_url: str, tmp_path: Path, queues: SqsQueues
) -> None:
    gone = await open_store(db_url, tmp_path, 2, 1.0)
    await gone.db.migrate()
    await gone.close()
    client = await serve(make_settings, gone, keys, queues)
    try:
        resp = await client.get("/readyz")
        assert resp.status == 503
        checks = (await resp.json())["checks"]
        assert checks["sqs"] == "ok"
        assert checks["database"] != "ok"
    finally:
        await client.close()
