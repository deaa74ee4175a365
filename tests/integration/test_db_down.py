"""Database down: bounded 503 C09, nothing half-written, and recovery without a restart.

Postgres goes "down" behind a TCP proxy that drops its listener and every open
connection; SQLite is "down" while another connection holds the write lock.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.config import Settings
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.db import sqlite_path
from outboxd.storage.store import SqlStore, open_store
from tests.conftest import postgres_only
from tests.support.consumer_rig import FINAL, RigFactory
from tests.support.db import raw_count
from tests.support.tcp_proxy import TcpProxy, via_proxy
from tests.support.waits import consistently, eventually

URL = "/v1/portal-link-jobs"
BODY = {"portal": "suwon", "username": "20201234", "password": "pw-down"}
ACQUIRE_TIMEOUT_S = 2.0
BOUND_S = 6.0


@dataclass
class Outage:
    backend: str
    store: SqlStore
    client: TestClient[Any, Any]
    down: Callable[[], Awaitable[None]]
    up: Callable[[], Awaitable[None]]
    count_direct: Callable[[str], Awaitable[int]]
    proxy: TcpProxy | None


@pytest_asyncio.fixture
async def outage(
    backend: str,
    db_url: str,
    make_settings: Callable[..., Settings],
    keys: KeyRing,
    tmp_path: Path,
) -> AsyncIterator[Outage]:
    """An API whose database can be taken down and brought back while it runs."""
    proxy: TcpProxy | None = None
    lock_conn: sqlite3.Connection | None = None
    if backend == "postgres":
        upstream = urlsplit(db_url)
        proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432)
        url = via_proxy(db_url, await proxy.start())
    else:
        url = db_url
    settings = make_settings(storage={"url": url, "acquire_timeout_s": ACQUIRE_TIMEOUT_S})
    store = await open_store(url, tmp_path, 5, ACQUIRE_TIMEOUT_S)
    await store.db.migrate()

    async def down() -> None:
        nonlocal lock_conn
        if proxy is not None:
            await proxy.stop()
        else:
            lock_conn = sqlite3.connect(sqlite_path(url, tmp_path), isolation_level=None)
            lock_conn.execute("BEGIN EXCLUSIVE")

    async def up() -> None:
        nonlocal lock_conn
        if proxy is not None:
            await proxy.start()
        elif lock_conn is not None:
            lock_conn.execute("ROLLBACK")
            lock_conn.close()
            lock_conn = None

    async def count_direct(table: str) -> int:
        """Rows in `table`, read around the outage (not through the proxy or the store)."""
        return await raw_count(db_url, table)

    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    try:
        yield Outage(backend, store, client, down, up, count_direct, proxy)
    finally:
        if proxy is not None:
            proxy.thaw()
        await up()
        await client.close()
        await store.close()
        if proxy is not None:
            await proxy.stop()


async def assert_c09(resp: Any, started: float) -> None:
    elapsed = time.monotonic() - started
    text = await resp.text()
    assert resp.status == 503, text
    assert resp.content_type == "application/problem+json"
    body = json.loads(text)
    assert body["code"] == "C09" and body["status"] == 503
    assert "pw-down" not in text
    assert elapsed < BOUND_S, f"answered after {elapsed:.1f} s"


async def test_post_while_down_is_bounded_503_and_recovers(outage: Outage) -> None:
    """POST with the database down answers 503 C09 quickly, stores nothing; then recovers."""
    await outage.down()
    started = time.monotonic()
    resp = await outage.client.post(URL, json=BODY, headers={"Idempotency-Key": "k-down"})
    await assert_c09(resp, started)
    assert await outage.count_direct("jobs") == 0
    assert await outage.count_direct("relay_outbox") == 0

    await outage.up()
    ok = await outage.client.post(URL, json=BODY, headers={"Idempotency-Key": "k-down"})
    assert ok.status == 202, await ok.text()
    assert "Idempotent-Replayed" not in ok.headers
    job_id = (await ok.json())["jobId"]
    got = await outage.client.get(f"/v1/jobs/{job_id}")
    assert got.status == 200, await got.text()
    assert await outage.count_direct("jobs") == 1
    assert await outage.count_direct("relay_outbox") == 1


async def test_concurrent_requests_while_down_are_all_bounded(outage: Outage) -> None:
    """Several requests at once during an outage each answer 503 C09 within the bound."""
    await outage.down()
    started = time.monotonic()
    responses = await asyncio.gather(
        *(
            outage.client.post(URL, json=BODY, headers={"Idempotency-Key": f"k-{i}"})
            for i in range(4)
        )
    )
    for r in responses:
        await assert_c09(r, started)
    await outage.up()
    assert await outage.count_direct("jobs") == 0
    resps = await asyncio.gather(
        *(
            outage.client.post(URL, json=BODY, headers={"Idempotency-Key": f"k-{i}"})
            for i in range(4)
        )
    )
    assert [r.status for r in resps] == [202] * 4
    assert await outage.count_direct("jobs") == 4


async def test_readyz_reports_the_database_while_down(outage: Outage) -> None:
    """/readyz answers 503 naming the database while it is down, and 200 once it is back."""
    before = await outage.client.get("/readyz")
    assert before.status == 200, await before.text()
    job = await outage.client.post(URL, json=BODY, headers={"Idempotency-Key": "k-ready"})
    assert job.status == 202
    job_id = (await job.json())["jobId"]

    await outage.down()
    started = time.monotonic()
    resp = await outage.client.get("/readyz")
    elapsed = time.monotonic() - started
    body = await resp.json()
    assert elapsed < BOUND_S
    assert resp.status == 503, body
    assert body["checks"]["database"] != "ok"
    if outage.backend == "postgres":
        started = time.monotonic()
        read = await outage.client.get(f"/v1/jobs/{job_id}")
        await assert_c09(read, started)

    await outage.up()
    after = await outage.client.get("/readyz")
    assert after.status == 200, await after.text()
    assert (await after.json())["checks"]["database"] == "ok"


# asyncpg's command_timeout (outboxd: max(2 x acquire_timeout_s, 10 s)) bounds a statement
# on a connection whose peer went silent; releasing it then costs up to acquire_timeout_s.
PARTITION_BOUND_S = 10.0 + 2 * ACQUIRE_TIMEOUT_S + 3.0


@pytest.mark.slow
@postgres_only
async def test_network_partition_is_bounded_and_heals(outage: Outage) -> None:
    """A database that goes silent (no RST) still answers 503 C09 in bounded time, then heals."""
    assert outage.proxy is not None
    warm = await outage.client.post(URL, json=BODY, headers={"Idempotency-Key": "k-warm"})
    assert warm.status == 202
    outage.proxy.freeze()
    started = time.monotonic()
    post, ready = await asyncio.gather(
        outage.client.post(URL, json=BODY, headers={"Idempotency-Key": "k-silent"}),
        outage.client.get("/readyz"),
    )
    elapsed = time.monotonic() - started
    text = await post.text()
    assert post.status == 503, text
    assert json.loads(text)["code"] == "C09"
    assert elapsed < PARTITION_BOUND_S, f"answered after {elapsed:.1f} s"
    assert ready.status == 503
    assert (await ready.json())["checks"]["database"] != "ok"

    outage.proxy.thaw()
    ok = await outage.client.post(URL, json=BODY, headers={"Idempotency-Key": "k-silent"})
    assert ok.status == 202, await ok.text()
    assert "Idempotent-Replayed" not in ok.headers
    assert await outage.count_direct("jobs") == 2
    assert await outage.count_direct("relay_outbox") == 2


# ---------------------------------------------------------------- the consumer while down

# The rig's visibility timeout: a message whose handler met the outage is visible again after
# it, so an outage of a few of these would walk a message that is received again and again
# (max_receive_count 3) to the DLQ.
VISIBILITY_S = 3
OUTAGE_S = 4 * VISIBILITY_S


@pytest.mark.real_clock  # the outage lasts several visibility timeouts of real SQS (moto)
async def test_the_consumer_stops_receiving_while_the_database_is_down(
    outage: Outage, make_rig: RigFactory
) -> None:
    """A message on the queue when the database goes down: the handler that meets the
    outage gives it back, and the consumer receives nothing until the database answers
    again (its store's ping, as the daemon wires it), so the message's receive count does
    not walk it to the DLQ; once the database is back the job runs and succeeds."""
    rig = await make_rig(sqs={"visibility_timeout_s": VISIBILITY_S, "max_receive_count": 3})
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)  # on the queue, nobody consuming
    await outage.down()
    rig.start_consumer(outage.store, storage_probe=outage.store.db.ping)
    await eventually(lambda: rig.receiver.receives_of(job_id), 15, what="the message received once")

    def received_at_most_twice() -> bool:
        # The first receive, and at most one more before its handler met the outage.
        return len(rig.receiver.receives_of(job_id)) <= 2

    await consistently(received_at_most_twice, OUTAGE_S)
    await outage.up()
    done = await rig.wait_status(job_id, *FINAL, timeout_s=60)
    assert done.status == "SUCCEEDED", done
    await rig.wait_queue_empty(dlq=0)
