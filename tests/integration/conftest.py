"""Fixtures shared by the in-process API tests of this folder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from testkit.fakes.ai import FakeAI
from testkit.fakes.portal import FakePortal, sample_student
from testkit.moto import MotoServer

from outboxd.config import Settings
from outboxd.daemon.components import build_api_deps
from outboxd.daemon.runtime import ConsoleRuntime, Throughput
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.queue.sqs import SqsQueues
from outboxd.security import KeyRing, generate_token, hash_token
from outboxd.storage.store import SqlStore, open_store
from tests.conftest import SettingsFactory
from tests.support import consumer_rig, held
from tests.support.ai import AI_KEY
from tests.support.config import merge
from tests.support.sqs_proxy import Proxy, queues_at, serve

Client = TestClient[Any, Any]


@pytest_asyncio.fixture
async def two_role_api(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> AsyncIterator[tuple[Client, str, str]]:
    """The API (console included) with a user token for bob and an admin token for root:
    the client, the user token, the admin token."""
    user_token, admin_token = generate_token(), generate_token()
    settings = make_settings(
        auth={
            "tokens": [
                {"sha256": hash_token(user_token), "user": "bob", "role": "user"},
                {"sha256": hash_token(admin_token), "user": "root", "role": "admin"},
            ]
        }
    )
    metrics = Metrics()
    runtime = ConsoleRuntime(Throughput(metrics))
    deps = build_api_deps(
        settings, store, keys, metrics, queues=None, dispatcher=None, runtime=runtime
    )
    client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    yield client, user_token, admin_token
    await client.close()


ClientFactory = Callable[..., Awaitable["TestClient[Any, Any]"]]


@pytest_asyncio.fixture
async def make_api_client(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> AsyncIterator[ClientFactory]:
    """An in-process API (no queue: jobs stay QUEUED) on the test's store, its settings'
    sections as given."""
    clients: list[TestClient[Any, Any]] = []

    async def factory(**sections: Any) -> TestClient[Any, Any]:
        settings = make_settings(**sections)
        deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
        client: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
        await client.start_server()
        clients.append(client)
        return client

    yield factory
    for c in clients:
        await c.close()


@pytest_asyncio.fixture
async def make_api(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> AsyncIterator[held.Api]:
    """The API in-process with its held requests (no queue: jobs stay QUEUED), its `api`
    section as given; tests/support/held.py speaks to it."""
    made: list[held.Client] = []
    stops: list[asyncio.Event] = []
    tasks: list[asyncio.Task[None]] = []

    async def factory(**api: Any) -> held.Client:
        settings = make_settings(api=api)
        deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
        assert deps.waits is not None
        stop = asyncio.Event()
        stops.append(stop)
        tasks.append(asyncio.create_task(deps.waits.run(stop)))
        http: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
        await http.start_server()
        client = held.Client(http, deps.waits, stop)
        made.append(client)
        return client

    yield factory
    for stop in stops:
        stop.set()
    for c in made:
        await c.http.close()
    for t in tasks:
        await t


@pytest_asyncio.fixture
async def make_rig(
    make_settings: SettingsFactory,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    store: SqlStore,
    keys: KeyRing,
) -> AsyncIterator[consumer_rig.RigFactory]:
    """The consumer's rig (tests/support/consumer_rig.py) on the test's store and queues,
    with the fake portal knowing the sample student and a broken one; keyword sections
    override the small test settings."""
    rigs: list[consumer_rig.Rig] = []
    opened: list[SqsQueues] = []
    portal = FakePortal([sample_student(), consumer_rig.broken_student()])
    await portal.start()

    async def factory(**sections: dict[str, Any]) -> consumer_rig.Rig:
        base: dict[str, dict[str, Any]] = {
            "sqs": {
                "endpoint_url": moto_server.endpoint_url,
                **queue_names,
                "wait_time_s": 1,
                "visibility_timeout_s": 3,
                "max_receive_count": 3,
            },
            # The DLQ sweep runs once when a consumer starts; the tests call it themselves.
            "consumer": {
                "max_concurrency": 4,
                "heartbeat_s": 1.0,
                "backoff_base_s": 0,
                "dlq_sweep_s": 3600,
            },
            "relay": {"publish_timeout_s": 3.0},
            "scrapers": {
                "suwon": {
                    "portal_base_url": portal.portal_base_url,
                    "info_base_url": portal.info_base_url,
                    "timeout_s": 5.0,
                    "min_interval_s": 0.0,
                }
            },
        }
        for name, values in sections.items():
            base[name] = merge(base.get(name, {}), values)
        settings = make_settings(**base)
        queues = SqsQueues(settings.sqs, settings.sqs.endpoint_url)
        await queues.start()
        opened.append(queues)
        rig = consumer_rig.Rig(
            settings=settings,
            store=store,
            keys=keys,
            queues=queues,
            portal=portal,
            receiver=consumer_rig.RecordingReceiver(queues),
            publisher=consumer_rig.BodyRecordingPublisher(queues),
        )
        rigs.append(rig)
        return rig

    try:
        yield factory
        for rig in rigs:
            await rig.close()
        for q in opened:
            await q.close()
    finally:
        await portal.stop()


@pytest.fixture
def settings(
    make_settings: SettingsFactory, moto_server: MotoServer, queue_names: dict[str, str]
) -> Settings:
    """Settings on the session's moto with this test's own queues (short polls)."""
    return make_settings(
        sqs={"endpoint_url": moto_server.endpoint_url, **queue_names, "wait_time_s": 0}
    )


@pytest_asyncio.fixture
async def queues(settings: Settings) -> AsyncIterator[SqsQueues]:
    """This test's queues, created and started (a module may bring its own)."""
    q = SqsQueues(settings.sqs, settings.sqs.endpoint_url)
    await q.start()
    try:
        yield q
    finally:
        await q.close()


@pytest_asyncio.fixture
async def proxied_queues(proxy: Proxy) -> AsyncIterator[SqsQueues]:
    """SqsQueues on fresh queues through the module's own `proxy` fixture (an SQS endpoint
    that misbehaves as its tests want), which is served on loopback here, its `url` set."""
    async with serve(proxy.handle) as proxy.url, queues_at(proxy.url) as q:
        yield q


@pytest_asyncio.fixture
async def other(db_url: str, tmp_path: Path, store: SqlStore) -> AsyncIterator[SqlStore]:
    """A second store on the same database: another instance's connections."""
    s = await open_store(db_url, tmp_path, 5, 5.0)
    yield s
    await s.close()


@pytest_asyncio.fixture
async def ai() -> AsyncIterator[FakeAI]:
    """The fake AI in-process, on support/ai.py's key."""
    async with FakeAI(api_key=AI_KEY) as server:
        yield server
