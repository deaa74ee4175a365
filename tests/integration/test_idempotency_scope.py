"""Idempotency keys belong to one user: a replay finds the caller's own job, never another's.

On both backends (the `backend` fixture behind `store`).
"""

from __future__ import annotations

from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from tests.conftest import SettingsFactory
from tests.support.api import ALICE, BOB, TOKENS, bearer

URL = "/v1/portal-link-jobs"
BODY = {"portal": "suwon", "username": "20201234", "password": "pw-jobs"}


async def test_alice_and_bob_replaying_one_key_and_body_each_get_their_own_job(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    """Same body, same key, two users: two jobs; each user's replay answers that user's job."""
    settings = make_settings(auth={"tokens": TOKENS})
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    try:
        first: dict[str, str] = {}
        for who, token in (("alice", ALICE), ("bob", BOB)):
            resp = await client.post(
                URL, json=BODY, headers=bearer(token, **{"Idempotency-Key": "shared"})
            )
            assert resp.status == 202, await resp.text()
            assert "Idempotent-Replayed" not in resp.headers
            first[who] = (await resp.json())["jobId"]
        assert first["alice"] != first["bob"]

        for who, token in (("bob", BOB), ("alice", ALICE)):
            again = await client.post(
                URL, json=BODY, headers=bearer(token, **{"Idempotency-Key": "shared"})
            )
            assert again.status == 202, await again.text()
            assert again.headers.get("Idempotent-Replayed") == "true"
            assert (await again.json())["jobId"] == first[who], who
            job = await store.get_job(first[who])
            assert job is not None and job.user_id == who
    finally:
        await client.close()
