"""Fixtures shared by the in-process API tests of this folder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from outboxd.daemon.app import build_api_deps
from outboxd.daemon.runtime import ConsoleRuntime, Throughput
from outboxd.http.app import create_app
from outboxd.observability import Metrics
from outboxd.security import KeyRing, generate_token, hash_token
from outboxd.storage.store import SqlStore
from tests.conftest import SettingsFactory
from tests.support import held

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
