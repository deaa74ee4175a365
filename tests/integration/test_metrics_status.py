"""/metrics, `outboxd status --json` and /readyz against the database's own counts.

Both backends. The API runs in process with real SQS queues on the session's moto
server; the CLI runs as a subprocess on a config file naming the same database.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast
from urllib.parse import urlsplit

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs
from testkit.moto import MotoServer, free_port

from outboxd.config import ROLES
from outboxd.daemon.components import build_api_deps
from outboxd.daemon.readiness import DependencyReadiness
from outboxd.http.app import create_app
from outboxd.metrics import Metrics, package_version
from outboxd.queue.sqs import OutgoingMessage, SqsQueues
from outboxd.security import KeyRing
from outboxd.services.admin import AdminService
from outboxd.services.gauges import StatsGauges
from outboxd.storage.ports import TABLE_STATUSES, PaceState, StatusCount
from outboxd.storage.store import SqlStore, open_database, open_store
from tests.conftest import SettingsFactory
from tests.support.clock import Clock
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
from tests.support.tcp_proxy import TcpProxy, via_proxy
from tests.support.waits import eventually

Client = TestClient[Any, Any]


async def serve(
    make_settings: SettingsFactory,
    store: SqlStore,
    keys: KeyRing,
    queues: SqsQueues | None,
    metrics: Metrics | None = None,
    refresh_s: float = 0,
) -> Client:
    """The API in process; its gauges refreshed at every scrape unless `refresh_s` says."""
    settings = make_settings(metrics={"refresh_s": refresh_s})
    deps = build_api_deps(settings, store, keys, metrics or Metrics(), queues, dispatcher=None)
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
    """The database's counts as /metrics shows them: every known status, 0 when empty."""
    return {
        (t, s): float(counts.get(t, {}).get(s, 0))
        for t, known in TABLE_STATUSES.items()
        for s in known
    }


def sample(text: str, name: str, **labels: str) -> float | None:
    """The value of the one sample `name{labels}` in a scrape (None when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return None


def families(text: str) -> set[str]:
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


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
    assert sample(text, "outboxd_stats_refresh_success", source="database") == 1
    assert sample(text, "outboxd_stats_refresh_success", source="sqs") == 1
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


# ---------------------------------------------------------------- metrics that tell the truth


class CountingDb:
    """The real database driver, counting the readiness pings."""

    def __init__(self, inner: Any, calls: Counter[str]) -> None:
        self._inner = inner
        self._calls = calls

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def ping(self) -> None:
        self._calls["ping"] += 1
        await self._inner.ping()


class CountingStore:
    """The real store, counting the reads a refresh of the gauges makes."""

    def __init__(self, inner: SqlStore) -> None:
        self._inner = inner
        self.calls: Counter[str] = Counter()
        self.db = CountingDb(inner.db, self.calls)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def status_counts(self) -> list[StatusCount]:
        self.calls["status_counts"] += 1
        return await self._inner.status_counts()

    async def pace_states(self, now: float) -> list[PaceState]:
        self.calls["pace_states"] += 1
        return await self._inner.pace_states(now)


async def test_every_status_the_process_and_the_build_are_exported(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    client = await serve(make_settings, store, keys, None)
    try:
        resp = await client.get("/metrics")
        assert resp.status == 200
        text = await resp.text()
    finally:
        await client.close()
    # An empty database: every status of every table is a series at 0, so the first DEAD
    # row is an increase Prometheus sees, not a series appearing at N.
    shown = rows_gauges(text)
    assert shown == as_gauges({})
    assert set(shown.values()) == {0.0}
    assert ("relay_outbox", "SUPERSEDED") in shown and ("jobs", "DEAD") in shown
    for table in ("jobs", "relay_outbox", "task_runs"):
        assert sample(text, "outboxd_dead_total", table=table) == 0
    assert sample(text, "outboxd_build_info", version=package_version(), schema="") == 1
    assert {
        "process_start_time_seconds",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    } <= families(text)
    started = sample(text, "process_start_time_seconds")
    assert started is not None and 0 < started <= time.time()


async def test_a_role_gauge_is_exported_only_where_the_role_runs(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    claimer = "outboxd_claimer_last_tick_timestamp_seconds"
    consumer = "outboxd_consumer_last_receive_timestamp_seconds"

    def registered(*roles: str) -> set[str]:
        return {f.name for f in Metrics(roles).registry.collect()}

    assert claimer not in registered("api") and consumer not in registered("api")
    assert claimer in registered("api", "claimer") and consumer not in registered("claimer")
    assert consumer in registered("consumer") and claimer not in registered("consumer")
    assert {claimer, consumer} <= registered(*ROLES)

    # The api role alone, as the split docs/operations.md recommends: a scrape shows neither.
    client = await serve(make_settings, store, keys, None, metrics=Metrics(["api"]))
    try:
        text = await (await client.get("/metrics")).text()
    finally:
        await client.close()
    assert "outboxd_rows" in text
    assert claimer not in text and consumer not in text


async def test_concurrent_scrapes_share_one_refresh(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    """32 scrapers at once read the database once, and again only after refresh_s."""
    counting = CountingStore(store)
    client = await serve(make_settings, cast(SqlStore, counting), keys, None, refresh_s=60)
    try:
        answers = await asyncio.gather(*(client.get("/metrics") for _ in range(32)))
        assert [r.status for r in answers] == [200] * 32
        texts = [await r.text() for r in answers]
        assert counting.calls == {"status_counts": 1, "pace_states": 1, "ping": 1}
        # Every scraper got the refreshed values, not an empty registry.
        assert all(
            sample(t, "outboxd_stats_refresh_success", source="database") == 1 for t in texts
        )

        # Within refresh_s the cached result answers: no database work at all.
        await submit_job(store, keys)
        again = await asyncio.gather(*(client.get("/metrics") for _ in range(32)))
        assert [r.status for r in again] == [200] * 32
        assert counting.calls == {"status_counts": 1, "pace_states": 1, "ping": 1}
        assert sample(await again[0].text(), "outboxd_rows", table="jobs", status="QUEUED") == 0
    finally:
        await client.close()


async def test_the_gauges_are_refreshed_at_most_every_refresh_s(
    store: SqlStore, keys: KeyRing
) -> None:
    counting = CountingStore(store)
    metrics = Metrics()
    clock = Clock(1000.0)
    gauges = StatsGauges(
        metrics,
        AdminService(cast(SqlStore, counting)),
        DependencyReadiness(cast(SqlStore, counting), None),
        refresh_s=5,
        clock=clock,
    )

    def queued() -> float | None:
        return sample(
            generate_latest(metrics.registry).decode(),
            "outboxd_rows",
            table="jobs",
            status="QUEUED",
        )

    await gauges.refresh()
    assert counting.calls["status_counts"] == 1 and queued() == 0
    await submit_job(store, keys)
    clock.now = 1004.9
    await gauges.refresh()
    assert counting.calls["status_counts"] == 1 and queued() == 0
    clock.now = 1005.0
    await gauges.refresh()
    assert counting.calls["status_counts"] == 2 and queued() == 1

    # refresh_s = 0: no cache at all, yet scrapes that arrive while a refresh runs share it.
    eager = StatsGauges(
        metrics,
        AdminService(cast(SqlStore, counting)),
        DependencyReadiness(cast(SqlStore, counting), None),
        refresh_s=0,
    )
    await asyncio.gather(*(eager.refresh() for _ in range(32)))
    assert counting.calls["status_counts"] == 3
    await eager.refresh()
    assert counting.calls["status_counts"] == 4


@dataclass
class Breakable:
    """A store whose database can be taken away and given back while the API runs."""

    store: SqlStore
    down: Callable[[], Awaitable[None]]
    up: Callable[[], Awaitable[None]]


@pytest_asyncio.fixture
async def breakable(backend: str, db_url: str, tmp_path: Path) -> AsyncIterator[Breakable]:
    """Postgres behind a TCP proxy that drops every connection; SQLite's driver closed and
    opened again (in WAL mode another process's write lock does not stop reads, so the
    counts of a locked SQLite file stay fresh: only its readiness fails)."""
    proxy: TcpProxy | None = None
    url = db_url
    if backend == "postgres":
        upstream = urlsplit(db_url)
        proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432)
        url = via_proxy(db_url, await proxy.start())
    store = await open_store(url, tmp_path, 3, 1.0)
    await store.db.migrate()

    async def down() -> None:
        if proxy is not None:
            await proxy.stop()
        else:
            await store.db.close()

    async def up() -> None:
        if proxy is not None:
            await proxy.start()
        else:
            store.db = await open_database(url, tmp_path, 3, 1.0)

    try:
        yield Breakable(store, down, up)
    finally:
        if proxy is not None:
            await proxy.start()
        await store.close()
        if proxy is not None:
            await proxy.stop()


async def test_metrics_answer_while_the_database_is_down_and_recover(
    make_settings: SettingsFactory, breakable: Breakable, store: SqlStore, keys: KeyRing
) -> None:
    """/metrics is 200 with the database gone: the gauges keep their last values, marked
    stale, and readiness says database; when it is back they are fresh again."""
    client = await serve(make_settings, breakable.store, keys, None)
    try:
        # `store` is another connection to the same database: it writes around the outage.
        await submit_job(store, keys)
        with capture_logs() as logs:
            text = await (await client.get("/metrics")).text()
            assert sample(text, "outboxd_stats_refresh_success", source="database") == 1
            assert sample(text, "outboxd_ready", check="database") == 1
            assert sample(text, "outboxd_rows", table="jobs", status="QUEUED") == 1
            good = sample(text, "outboxd_stats_last_success_timestamp_seconds", source="database")
            assert good is not None and good <= time.time()

            await breakable.down()
            await submit_job(store, keys)
            for _ in range(3):
                resp = await client.get("/metrics")
                assert resp.status == 200, await resp.text()
                text = await resp.text()
                assert sample(text, "outboxd_stats_refresh_success", source="database") == 0
                assert sample(text, "outboxd_ready", check="database") == 0
                # Stale, not gone: the last counts it could read, and when it read them.
                assert rows_gauges(text)[("jobs", "QUEUED")] == 1
                assert set(rows_gauges(text)) == set(as_gauges({}))
                assert (
                    sample(text, "outboxd_stats_last_success_timestamp_seconds", source="database")
                    == good
                )

            await breakable.up()

            async def recovered() -> str | None:
                text = await (await client.get("/metrics")).text()
                ok = sample(text, "outboxd_stats_refresh_success", source="database") == 1
                return text if ok else None

            text = await eventually(recovered, 20, what="the gauges to recover", interval=0.1)
            assert sample(text, "outboxd_rows", table="jobs", status="QUEUED") == 2
            assert sample(text, "outboxd_ready", check="database") == 1
            later = sample(text, "outboxd_stats_last_success_timestamp_seconds", source="database")
            assert later is not None and later > good
        events = [e["event"] for e in logs if e["event"].startswith("metrics_refresh")]
        # Once per outage, however many scrapes saw it.
        assert events == ["metrics_refresh_failed", "metrics_refresh_recovered"]
    finally:
        await client.close()
