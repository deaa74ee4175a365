"""Faults under load: clear errors while a fault lasts, full recovery after, nothing lost.

Each test runs a daemon (all roles) with the chaos loader (portal jobs for students of
their own, websites; a client retries with the same key after a connection error or a
503), injects one fault for a few seconds, lets the load run on, then waits for
quiescence and counts as the chaos test does: nothing accepted is lost, nothing applied
twice, no 5xx but 503 C09, no request hangs. The error window (first and last failure,
relative to the fault) is printed.

- Postgres backends killed mid-transaction (`pg_terminate_backend`, own database only);
- Postgres "stopped and started" (a TCP proxy closes its listener and every connection);
- SQS stopped and started (a moto server of the test's own, back empty on the same
  port: the daemon recreates its queues);
- the fake portal and AI slow (beyond the client timeouts), resetting connections, and
  answering garbage;
- a pool of one connection held by slow statements: 503 C09 within the bound;
- many concurrent writers (SQLite's single writer, Postgres' pool).
"""

from __future__ import annotations

import asyncio
import sqlite3
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import pytest
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from outboxd.storage.db import sqlite_path
from tests.conftest import postgres_only, sqlite_only
from tests.reliability.chaos import ChaosParams, ChaosReport, Cluster, Loader, settle_and_count
from tests.reliability.conftest import MakeDaemon
from tests.reliability.harness import (
    CONNECTION_ERRORS,
    Db,
    ErrorWindow,
    Fakes,
    Resp,
    http,
    log_events,
    student_number,
)
from tests.support.loop_thread import LoopThread
from tests.support.tcp_proxy import TcpProxy, via_proxy
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow

C09_BOUND_S = 6.0  # a failing request answers within this (acquire timeout 2 s + margin)
RECOVERY_S = 4.0  # the last failure comes no later than this after the fault ends


@dataclass
class Rig:
    tmp_path: Path
    db_url: str
    fakes: Fakes
    moto: MotoServer
    queue_names: dict[str, str]
    daemon: MakeDaemon

    def params(self, **kw: Any) -> ChaosParams:
        base: dict[str, Any] = {
            "backend": "postgres" if self.db_url.startswith("postgres") else "sqlite",
            "db_url": self.db_url,
            "sqs_endpoint": self.moto.endpoint_url,
            "queue_names": self.queue_names,
            "workdir": self.tmp_path,
            "job_rate": 4.0,
            "site_rate": 2.0,
            "quiesce_timeout_s": 60.0,
            "quiesce_cap_s": 60.0,
        }
        base.update(kw)
        return ChaosParams(**base)


@pytest.fixture
def n_students() -> int:
    return 600


@pytest.fixture
def rig(
    tmp_path: Path,
    db_url: str,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    fakes: Fakes,
    make_daemon: MakeDaemon,
) -> Rig:
    return Rig(tmp_path, db_url, fakes, moto_server, queue_names, make_daemon)


FaultFn = Callable[[Loader], tuple[float, float]]


def under_load(
    rig: Rig, daemon: DaemonProcess, fault: FaultFn, **params: Any
) -> tuple[ChaosReport, Loader, tuple[float, float]]:
    """Load, `fault(loader)` (returns its wall-clock start and end), more load, settle."""
    p = rig.params(**params)
    cluster = Cluster([daemon])
    cluster.start_all()
    loader = Loader(cluster, p)
    loader.start()
    # Warm: work accepted, and more in flight, when the fault starts.
    eventually_sync(lambda: len(loader.accepted_since(0)) >= 5, 30, what="load accepted")
    span = fault(loader)
    # More load, and the daemon taking it again, after the fault.
    eventually_sync(
        lambda: len(loader.accepted_since(span[1])) >= 5, 30, what="load accepted after the fault"
    )
    loader.stop_and_drain()
    report = ChaosReport(p, label="fault run")
    db = Db(rig.db_url)
    try:
        settle_and_count(report, loader.items, db, rig.fakes, [daemon], cluster.any_base())
    finally:
        db.close()
    return report, loader, span


def assert_recovered(report: ChaosReport) -> None:
    print(report.table())
    assert report.jobs.lost == 0 and report.sites.lost == 0, report.table()
    assert report.jobs.duplicated == 0 and report.sites.duplicated == 0, report.table()
    assert report.jobs.succeeded == report.jobs.accepted, report.table()
    assert report.sites.succeeded == report.sites.accepted, report.table()
    assert report.unacked == 0, report.table()
    assert report.ok, report.table()


def client_window(
    name: str, loader: Loader, span: tuple[float, float], known_500s: int = 0
) -> ErrorWindow:
    window = ErrorWindow(name, span[0], span[1], [t for t, _lat, _what in loader.failures])
    kinds = Counter(what for _t, _lat, what in loader.failures)
    slowest = max((lat for _t, lat, _w in loader.failures), default=0.0)
    print(f"\n{window.describe()}; failures by kind {dict(kinds)}; slowest {slowest:.2f}s")
    if known_500s:
        assert kinds.pop("HTTP 500 C99", 0) <= known_500s
    # Clear errors only: a 503 C09 or the connection refused/reset, never another status,
    # and never a request left hanging.
    assert set(kinds) <= {
        "HTTP 503 C09",
        "ConnectionRefusedError",
        "ConnectionResetError",
        "RemoteDisconnected",
    }, kinds
    assert slowest < C09_BOUND_S
    if window.last is not None:
        assert window.last <= span[1] + RECOVERY_S, window.describe()
    return window


# ------------------------------------------------------------------ Postgres


@pytest.mark.timeout(120)
@pytest.mark.real_clock  # backends killed every 0.15 s for three seconds
@postgres_only
def test_postgres_backends_killed_mid_transaction(rig: Rig) -> None:
    daemon = rig.daemon()
    killed = Counter[str]()

    def fault(_loader: Loader) -> tuple[float, float]:
        async def kill_for(seconds: float) -> None:
            conn = await asyncpg.connect(rig.db_url, timeout=5)
            try:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    rows = await conn.fetch(
                        "SELECT pid, state, pg_terminate_backend(pid) AS ok FROM pg_stat_activity"
                        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                    )
                    killed.update(str(r["state"]) for r in rows if r["ok"])
                    await asyncio.sleep(0.15)
            finally:
                await conn.close()

        start = time.time()
        asyncio.run(kill_for(3.0))
        return start, time.time()

    report, loader, span = under_load(rig, daemon, fault)
    print(f"\nbackends terminated, by state at the time: {dict(killed)}")
    assert sum(killed.values()) > 0
    # A connection killed while idle in the pool can surface as asyncpg's
    # InternalClientError, which the storage layer does not map: 500 C99 (the strict
    # test_a_connection_killed_in_the_pool_is_storage_unavailable). Tolerated here
    # only when the daemon's log shows exactly that error.
    unhandled = [
        e.get("error_type")
        for e in log_events([daemon])
        if e["event"] in ("unhandled_error", "storage_error")
    ]
    assert set(unhandled) <= {"InternalClientError"}, unhandled
    client_window("pg_terminate_backend", loader, span, known_500s=len(unhandled))
    assert_recovered(report)


@pytest.mark.timeout(120)
@pytest.mark.real_clock  # under_load: clients that pause between retries
@postgres_only
def test_postgres_stopped_and_started(rig: Rig) -> None:
    with LoopThread() as lt:
        upstream = urlsplit(rig.db_url)
        proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432)
        port = lt.run(proxy.start())
        daemon = rig.daemon(db_url=via_proxy(rig.db_url, port))
        ready: list[tuple[float, int]] = []

        def fault(loader: Loader) -> tuple[float, float]:
            start = time.time()
            lt.run(proxy.stop())
            base = loader.cluster.any_base()

            def shown() -> bool:
                """/readyz sampled; the outage lasts until clients and /readyz have seen it."""
                ready.append((time.time(), http("GET", base, "/readyz").status))
                failed = [t for t, _lat, _what in loader.failures if t >= start]
                return len(ready) >= 4 and len(failed) >= 3

            eventually_sync(shown, 30, what="the outage seen by the clients", interval=0.25)
            lt.run(proxy.start())
            return start, time.time()

        report, loader, span = under_load(rig, daemon, fault)
        lt.run(proxy.stop())
    assert ready and all(status == 503 for _t, status in ready), ready
    window = client_window("Postgres stopped", loader, span)
    assert window.failures, "the outage must show as errors"
    assert_recovered(report)


@pytest.mark.timeout(120)
@postgres_only
def test_a_pool_of_one_held_by_slow_statements(rig: Rig) -> None:
    """pool_size = 1 and a statement that waits on a lock (held until the other requests
    have been refused): every other request is 503 C09 after the acquire timeout, none
    hangs; afterwards everything goes through."""
    daemon = rig.daemon(storage={"pool_size": 1, "acquire_timeout_s": 1.0})
    base = daemon.start()
    locked, refused = threading.Event(), threading.Event()
    held: list[float] = []

    async def hold_lock() -> None:
        conn = await asyncpg.connect(rig.db_url, timeout=5)
        try:
            async with conn.transaction():
                await conn.execute("LOCK TABLE jobs IN EXCLUSIVE MODE")
                locked.set()
                since = time.monotonic()
                await asyncio.get_running_loop().run_in_executor(None, refused.wait, 10.0)
                held.append(time.monotonic() - since)
        finally:
            await conn.close()

    def post(key: str) -> Resp:
        answer = _post_job(base, key, timeout_s=30)
        if answer.status == 503:
            refused.set()
        return answer

    holder = threading.Thread(target=asyncio.run, args=(hold_lock(),))
    holder.start()
    assert locked.wait(10)
    keys = [f"pool-{i}" for i in range(20)]
    started = time.monotonic()
    with ThreadPoolExecutor(len(keys)) as pool:
        answers = list(pool.map(post, keys))
    holder.join()
    [lock_s] = held
    took = [a.elapsed_s for a in answers]
    statuses = Counter(a.status for a in answers)
    print(
        f"\npool of 1, lock held {lock_s}s: {dict(statuses)}; slowest answer {max(took):.2f}s,"
        f" all answered {time.monotonic() - started:.2f}s after the first was sent"
    )
    assert set(statuses) <= {202, 503}, statuses
    assert statuses[503] > 0
    assert all(a.json()["code"] == "C09" for a in answers if a.status == 503)
    assert max(took) < lock_s + C09_BOUND_S
    _whole_and_finished(rig, base, keys, answers)
    assert daemon.terminate() == 0


# ------------------------------------------------------------------ both backends


@pytest.mark.timeout(150)
@pytest.mark.real_clock  # under_load: clients that pause between retries
def test_sqs_stopped_and_started(rig: Rig, tmp_path: Path) -> None:
    sqs = MotoServer(tmp_path / "private-moto.log")
    sqs.start()
    try:
        daemon = rig.daemon(sqs_endpoint=sqs.endpoint_url)
        db = Db(rig.db_url)

        def fault(loader: Loader) -> tuple[float, float]:
            # Stopped with nothing on the queue: what a restart does to messages waiting
            # there is test_messages_on_the_queue_survive_an_sqs_restart.
            loader.pause()
            eventually_sync(lambda: _all_terminal(db, loader), 30, what="the queue drained")
            start = time.time()
            sqs.stop()
            loader.resume()

            def queued_meanwhile() -> bool:
                """Down until jobs accepted meanwhile show it (QUEUED, not SENT)."""
                jobs = loader.accepted_since(start, "job")
                return len([i for i in jobs if i.dispatch != "SENT"]) >= 3

            eventually_sync(queued_meanwhile, 30, what="jobs accepted while SQS is down")
            sqs.restart()
            return start, time.time()

        try:
            report, loader, span = under_load(rig, daemon, fault)
        finally:
            db.close()
    finally:
        sqs.stop()
    # Requests are not refused while SQS is down: the job is accepted (202) and waits in
    # the outbox (QUEUED, its row RETRYABLE_FAILED); those are this fault's "errors".
    waiting = [i.accepted_at for i in loader.items if i.kind == "job" and i.dispatch != "SENT"]
    window = ErrorWindow(
        "SQS stopped (202 QUEUED)", span[0], span[1], [t for t in waiting if t is not None]
    )
    print("\n" + window.describe())
    assert window.failures, "jobs accepted while SQS was down must show QUEUED"
    assert window.last is not None and window.last <= span[1] + RECOVERY_S
    assert not loader.failures, loader.failures[:5]  # no request failed
    events = [e["event"] for e in log_events([daemon])]
    assert "sqs_queue_missing_recreating" in events  # the daemon made its queues again
    assert_recovered(report)


@pytest.mark.timeout(150)
@pytest.mark.real_clock  # under_load: clients that pause between retries
def test_portal_and_ai_slow_resetting_and_answering_garbage(rig: Rig) -> None:
    daemon = rig.daemon()
    # Each phase: the portal's switches, the AI's, and how each shows as a retry (the
    # portal's error code, the start of the classifier's error).
    phases: list[tuple[str, dict[str, Any], dict[str, Any], str, str]] = [
        # beyond the 1.5 s / 1 s timeouts
        ("slow", {"delay_s": 1.8}, {"delay_s": 1.3}, "PORTAL_UNAVAILABLE", "provider timed out"),
        (
            "reset",
            {"reset_connections": True},
            {"reset_connections": True},
            "PORTAL_UNAVAILABLE",
            "provider unreachable",
        ),
        ("garbage", {"garbage": True}, {"malformed": True}, "PORTAL_BAD_RESPONSE", "malformed"),
    ]
    normal_portal: dict[str, Any] = {"delay_s": 0.0, "reset_connections": False, "garbage": False}
    normal_ai: dict[str, Any] = {"delay_s": 0.0, "reset_connections": False, "malformed": False}
    spans: dict[str, tuple[float, float]] = {}

    def shown_since(t0: float, portal_code: str, ai_error: str) -> bool:
        """Since `t0`, the portal's and the AI's misbehaviour each showed as a retry."""
        since = [e for e in log_events([daemon]) if e.get("ts", 0) >= t0]
        return any(
            e["event"] == "job_retry_scheduled" and e.get("error_code") == portal_code
            for e in since
        ) and any(
            e["event"] == "classification_retry_scheduled"
            and str(e.get("error", "")).startswith(ai_error)
            for e in since
        )

    def fault(_loader: Loader) -> tuple[float, float]:
        start = time.time()
        for name, portal, ai, portal_code, ai_error in phases:
            t0 = time.time()
            rig.fakes.set_portal(**{**normal_portal, **portal})
            rig.fakes.set_ai(**{**normal_ai, **ai})
            # The phase lasts until both fakes' misbehaviour showed (as this phase's).
            eventually_sync(
                lambda t0=t0, p=portal_code, a=ai_error: shown_since(t0, p, a),
                30,
                what=f"the {name} phase in the log",
                interval=0.2,
            )
            spans[name] = (t0, time.time())
        rig.fakes.set_portal(**normal_portal)
        rig.fakes.set_ai(**normal_ai)
        return start, time.time()

    report, loader, span = under_load(rig, daemon, fault)
    events = list(log_events([daemon]))
    job_errors = [e for e in events if e["event"] == "job_retry_scheduled"]
    ai_errors = [e for e in events if e["event"] == "classification_retry_scheduled"]
    for name, errors in (("portal", job_errors), ("AI", ai_errors)):
        window = ErrorWindow(f"{name} misbehaving", span[0], span[1], [e["ts"] for e in errors])
        print("\n" + window.describe())
        assert window.failures, f"the {name} fault must show as retries"
        assert window.last is not None and window.last <= span[1] + RECOVERY_S
    codes = Counter(e["error_code"] for e in job_errors)
    print(f"portal error codes: {dict(codes)}")
    print("AI errors: " + str(Counter(e["error"].split(":")[0][:40] for e in ai_errors)))
    assert {"PORTAL_UNAVAILABLE", "PORTAL_BAD_RESPONSE"} <= set(codes)
    assert not loader.failures  # the API never noticed
    assert_recovered(report)


@pytest.mark.timeout(120)
@pytest.mark.real_clock  # on SQLite another writer holds the file for a moment
def test_many_concurrent_writers(rig: Rig, backend: str) -> None:
    """50 POSTs at once (a short acquire timeout): each 202 or 503 C09, none half
    written; a client retrying its 503s gets every job accepted once and run once.
    On SQLite another process also holds the file's write lock for a moment (another
    writer), so some requests do wait past the timeout."""
    daemon = rig.daemon(storage={"acquire_timeout_s": 0.25, "pool_size": 3})
    base = daemon.start()
    keys = [f"writer-{i}" for i in range(50)]
    barrier = threading.Barrier(len(keys) + 1)

    def post(key: str) -> Resp:
        barrier.wait()
        return _post_job(base, key, timeout_s=30)

    with ThreadPoolExecutor(len(keys)) as pool:
        futures = [pool.submit(post, k) for k in keys]
        if backend == "sqlite":
            other = sqlite3.connect(sqlite_path(rig.db_url, Path.cwd()), isolation_level=None)
            other.execute("BEGIN IMMEDIATE")
            barrier.wait()
            time.sleep(0.4)  # another writer, for a moment
            other.execute("ROLLBACK")
            other.close()
        else:
            barrier.wait()
        answers = [f.result() for f in futures]
    statuses = Counter(a.status for a in answers)
    print(
        f"\n50 concurrent POSTs on {backend}: {dict(statuses)}; "
        f"slowest {max(a.elapsed_s for a in answers):.2f}s"
    )
    assert set(statuses) <= {202, 503}, statuses
    assert all(a.json()["code"] == "C09" for a in answers if a.status == 503)
    assert max(a.elapsed_s for a in answers) < C09_BOUND_S
    _whole_and_finished(rig, base, keys, answers)
    assert daemon.terminate() == 0


# ------------------------------------------------------------------ helpers


def _post_job(base: str, key: str, timeout_s: float = 10.0) -> Resp:
    """A job for the student numbered by the key's suffix (`writer-7`: 7, `pool-7`: 107)."""
    prefix, _, i = key.rpartition("-")
    n = int(i) + (100 if prefix == "pool" else 0)
    return http(
        "POST",
        base,
        "/v1/portal-link-jobs",
        {"portal": "suwon", "username": student_number(n), "password": f"pw-{n}"},
        {"Idempotency-Key": key},
        timeout_s=timeout_s,
    )


def _whole_and_finished(rig: Rig, base: str, keys: list[str], answers: list[Resp]) -> None:
    """Every 202 stored a job and its outbox row; a 503 stored nothing (or, if the job had
    committed, a retry with the same key finds that job); then every job succeeds."""
    db = Db(rig.db_url)
    try:
        rows = {
            r["idempotency_key"]: r
            for r in db.rows(
                "SELECT j.idempotency_key, j.id, (SELECT COUNT(*) FROM relay_outbox o"
                " WHERE o.job_id = j.id) AS outbox FROM jobs j"
            )
        }
        committed_503 = []
        for key, a in zip(keys, answers, strict=True):
            if a.status == 202:
                assert rows[key]["id"] == a.json()["jobId"] and rows[key]["outbox"] == 1
            elif key in rows:
                committed_503.append(key)
                assert rows[key]["outbox"] == 1, "half written"
        if committed_503:
            # See test_a_storage_error_after_the_commit_still_answers_202.
            print(f"503 for a job that had committed: {committed_503}")
        job_ids = {}
        for key in keys:  # the client retries its 503s with the same key
            resp = eventually_sync(lambda k=key: _accepted(base, k), 20, what=f"{key} accepted")
            job_ids[key] = resp.json()["jobId"]
            if key in rows:
                assert job_ids[key] == rows[key]["id"], "a retry made a second job"
        assert db.scalar("SELECT COUNT(*) AS n FROM jobs") == len(keys)
        eventually_sync(
            lambda: (
                db.scalar("SELECT COUNT(*) AS n FROM jobs WHERE status = 'SUCCEEDED'") == len(keys)
            ),
            60,
            what="every job to succeed",
            interval=0.5,
        )
        logins = rig.fakes.logins()
        assert all(len(v) == 1 for v in logins.values()), "a job ran twice"
    finally:
        db.close()


def _accepted(base: str, key: str) -> Resp | None:
    try:
        resp = _post_job(base, key)
    except CONNECTION_ERRORS:
        return None
    return resp if resp.status == 202 else None


def _all_terminal(db: Db, loader: Loader) -> bool:
    jobs = {r["id"]: r["status"] for r in db.rows("SELECT id, status FROM jobs")}
    mine = [i.ref for i in loader.items if i.kind == "job" and i.state == "accepted"]
    pending = [i for i in loader.items if i.state == "pending"]
    return not pending and all(jobs.get(j) == "SUCCEEDED" for j in mine)


# ------------------------------------------------------------------ bugs found


@pytest.mark.timeout(90)
@sqlite_only
def test_messages_on_the_queue_survive_an_sqs_restart(rig: Rig, tmp_path: Path) -> None:
    sqs = MotoServer(tmp_path / "private-moto.log")
    sqs.start()
    try:
        rig.fakes.set_portal(delay_s=0.3)  # one job at a time, ~3 s each: the rest wait
        daemon = rig.daemon(sqs_endpoint=sqs.endpoint_url, consumer={"max_concurrency": 1})
        base = daemon.start()
        keys = [f"writer-{i}" for i in range(4)]
        answers = [_post_job(base, k) for k in keys]
        assert all(a.status == 202 and a.json()["dispatch"]["status"] == "SENT" for a in answers)
        eventually_sync(
            lambda: any(e["event"] == "job_started" for e in log_events([daemon])),
            15,
            what="the first job running",
        )
        sqs.stop()
        sqs.restart()
        rig.fakes.set_portal(delay_s=0.0)
        db = Db(rig.db_url)
        try:
            eventually_sync(
                lambda: (
                    db.scalar("SELECT COUNT(*) AS n FROM jobs WHERE status = 'SUCCEEDED'")
                    == len(keys)
                ),
                15,
                what="all four jobs to finish after SQS came back",
                interval=0.5,
            )
        finally:
            print(
                "\njobs after the SQS restart: "
                f"{db.rows('SELECT status, COUNT(*) AS n FROM jobs GROUP BY status')}"
            )
            db.close()
    finally:
        sqs.stop()


class _StoreFailingAfterTheCommit:
    """The real store, whose next transaction fails the way a dropped connection or an
    exhausted pool makes it fail: right after the job and its outbox row committed."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def claim_relay_rows(self, outbox_ids: Any, now: float, lease_s: float) -> Any:
        _connection_closed()

    async def record_relay_outcome(self, sent: Any, failures: Any, now: float) -> Any:
        # The intake claimed the row in its own transaction: the request's next one is
        # the batch's outcome, after SQS took the message.
        _connection_closed()


def _connection_closed() -> None:
    from outboxd.errors import StorageUnavailable

    raise StorageUnavailable("postgres: ConnectionDoesNotExistError: connection was closed")


class _AckPublisher:
    """SQS takes every message; only recording that fails."""

    async def send_batch(self, kind: Any, messages: Any) -> Any:
        from outboxd.queue.sqs import BatchResult

        return BatchResult(successful={m.entry_id: f"m-{m.entry_id}" for m in messages}, failed={})


async def test_a_storage_error_after_the_commit_still_answers_202(
    store: Any, make_settings: Callable[..., Any], keys: Any
) -> None:
    from aiohttp.test_utils import TestClient, TestServer

    from outboxd.daemon.components import build_api_deps
    from outboxd.http.app import create_app
    from outboxd.metrics import Metrics
    from outboxd.workers.relay import Relay

    settings = make_settings()
    relay = Relay(_StoreFailingAfterTheCommit(store), _AckPublisher(), settings.relay, Metrics())
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=relay)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    try:
        resp = await client.post(
            "/v1/portal-link-jobs",
            json={"portal": "suwon", "username": "20201234", "password": "pw"},
            headers={"Idempotency-Key": "after-commit"},
        )
        body = await resp.json()
        job = await store.get_job((await store.list_relay_rows(None, 5, None)).items[0].job_id)
        assert job is not None and job.status == "QUEUED"  # committed, and safe
        assert resp.status == 202, body
        assert body["jobId"] == job.id and body["status"] == "QUEUED"
    finally:
        await client.close()


@pytest.mark.timeout(60)
@pytest.mark.real_clock  # a race with the pool, won or lost by a millisecond
@postgres_only
async def test_a_connection_killed_in_the_pool_is_storage_unavailable(db_url: str) -> None:
    from outboxd.errors import StorageUnavailable
    from outboxd.storage.db import Op, Query, fetch
    from outboxd.storage.postgres import PostgresDatabase

    def select_one() -> Generator[Op, Any, Any]:
        return (yield fetch(Query("one", "SELECT 1", ()), {}))

    async def one_transaction(db: PostgresDatabase) -> None:
        await db.run(select_one)

    outcomes: Counter[str] = Counter()
    killer = await asyncpg.connect(db_url, timeout=5)
    try:
        for _ in range(30):  # the race is lost about one time in three
            db = PostgresDatabase(db_url, 2, 2.0)
            await db.open()
            try:
                victim = asyncio.create_task(one_transaction(db))
                await asyncio.sleep(0.001)  # its connection back in the pool, or nearly
                await killer.fetch(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
                for task in (victim, asyncio.ensure_future(one_transaction(db))):
                    try:
                        await task
                        outcomes["ok"] += 1
                    except StorageUnavailable:
                        outcomes["StorageUnavailable"] += 1
                    except Exception as exc:
                        outcomes[type(exc).__name__] += 1
            finally:
                await db.close()
    finally:
        await killer.close()
    print(f"\noutcomes of transactions around pg_terminate_backend: {dict(outcomes)}")
    assert set(outcomes) <= {"ok", "StorageUnavailable"}, outcomes
