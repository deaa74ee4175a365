"""Bearer-token authentication and roles, on both backends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from outboxd.config import ConfigError, Settings
from outboxd.daemon.app import build_api_deps
from outboxd.http.app import create_app
from outboxd.observability import Metrics
from outboxd.security import KeyRing, hash_token
from outboxd.storage.store import SqlStore
from tests.support.db import raw_count

URL = "/v1/portal-link-jobs"
BODY = {"portal": "suwon", "username": "20201234", "password": "pw-auth"}
USER_TOKEN = "obx_user_" + "u" * 30
ADMIN_TOKEN = "obx_admin_" + "a" * 30
TOKENS = [
    {"sha256": hash_token(USER_TOKEN), "user": "alice", "role": "user"},
    {"sha256": hash_token(ADMIN_TOKEN), "user": "root", "role": "admin"},
]

Client = TestClient[Any, Any]


async def _client(settings: Settings, store: SqlStore, keys: KeyRing) -> Client:
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    return client


@pytest_asyncio.fixture
async def authed(
    make_settings: Callable[..., Settings], store: SqlStore, keys: KeyRing
) -> AsyncIterator[Client]:
    """The API with a user token and an admin token configured."""
    client = await _client(make_settings(auth={"tokens": TOKENS}), store, keys)
    yield client
    await client.close()


async def assert_401(resp: Any) -> None:
    text = await resp.text()
    assert resp.status == 401, text
    assert resp.content_type == "application/problem+json"
    body = json.loads(text)
    assert body["code"] == "C02" and body["status"] == 401
    assert resp.headers["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(
    "authorization",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        f"Basic {USER_TOKEN}",
        f"Token {USER_TOKEN}",
        "Bearer not-a-configured-token",
        f"Bearer {USER_TOKEN}x",
        f"Bearer {hash_token(USER_TOKEN)}",
    ],
    ids=[
        "missing",
        "empty",
        "scheme-only",
        "scheme-space",
        "basic",
        "token-scheme",
        "bad",
        "extended",
        "the-hash",
    ],
)
async def test_missing_or_bad_token_is_401_c02(
    authed: Client, store: SqlStore, authorization: str | None, db_url: str
) -> None:
    """Without a valid bearer token every /v1 route answers 401 C02 with WWW-Authenticate."""
    headers = {"Idempotency-Key": "k-auth"}
    if authorization is not None:
        headers["Authorization"] = authorization
    await assert_401(await authed.post(URL, json=BODY, headers=headers))
    await assert_401(await authed.get("/v1/jobs/anything", headers=headers))
    await assert_401(await authed.get("/v1/admin/stats", headers=headers))
    assert await raw_count(db_url, "jobs") == 0
    assert await raw_count(db_url, "relay_outbox") == 0


async def test_good_token_works_and_names_the_user(authed: Client, store: SqlStore) -> None:
    """A configured token is accepted (scheme case-insensitive) and the job belongs to its user."""
    for scheme in ("Bearer", "bearer"):
        resp = await authed.post(
            URL,
            json=BODY,
            headers={"Authorization": f"{scheme} {USER_TOKEN}", "Idempotency-Key": "k-good"},
        )
        assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["jobId"]
    job = await store.get_job(job_id)
    assert job is not None and job.user_id == "alice"
    got = await authed.get(f"/v1/jobs/{job_id}", headers={"Authorization": f"Bearer {USER_TOKEN}"})
    assert got.status == 200


async def test_user_role_on_admin_route_is_403_c03(authed: Client) -> None:
    """A user-role token on an admin route answers 403 C03; an admin token gets 200."""
    resp = await authed.get("/v1/admin/stats", headers={"Authorization": f"Bearer {USER_TOKEN}"})
    text = await resp.text()
    assert resp.status == 403, text
    assert resp.content_type == "application/problem+json"
    assert json.loads(text)["code"] == "C03"
    ok = await authed.get("/v1/admin/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert ok.status == 200, await ok.text()


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/openapi.json"])
async def test_operational_routes_need_no_token(authed: Client, path: str) -> None:
    """/healthz, /readyz, /metrics and /openapi.json answer 200 without a token."""
    resp = await authed.get(path)
    assert resp.status == 200, await resp.text()
    bad = await authed.get(path, headers={"Authorization": "Bearer wrong"})
    assert bad.status == 200


async def test_no_tokens_means_local_admin(
    make_settings: Callable[..., Settings], store: SqlStore, keys: KeyRing
) -> None:
    """With no tokens configured every caller is user `local` with the admin role."""
    client = await _client(make_settings(), store, keys)
    try:
        resp = await client.post(URL, json=BODY, headers={"Idempotency-Key": "k-local"})
        assert resp.status == 202, await resp.text()
        job = await store.get_job((await resp.json())["jobId"])
        assert job is not None and job.user_id == "local"
        stats = await client.get("/v1/admin/stats")
        assert stats.status == 200, await stats.text()
        assert (await stats.json())["tables"]["jobs"] == {"QUEUED": 1}
    finally:
        await client.close()


@pytest.mark.parametrize("host", ["0.0.0.0", "192.0.2.10", "::", "example.com"])
def test_no_tokens_and_public_host_is_rejected(
    make_settings: Callable[..., Settings], host: str
) -> None:
    """Config with no tokens and a non-loopback server.host fails validation naming server.host."""
    with pytest.raises(ConfigError) as exc:
        make_settings(server={"host": host})
    msg = str(exc.value)
    assert "server.host" in msg and "\n" not in msg


@pytest.mark.parametrize("host", ["127.0.0.1", "::1", "localhost", "127.0.0.2"])
def test_no_tokens_and_loopback_host_is_accepted(
    make_settings: Callable[..., Settings], host: str
) -> None:
    """Config with no tokens binds any loopback address."""
    assert make_settings(server={"host": host}).server.host == host


def test_tokens_allow_a_public_host(make_settings: Callable[..., Settings]) -> None:
    """With tokens configured a non-loopback server.host is accepted."""
    s = make_settings(server={"host": "0.0.0.0"}, auth={"tokens": TOKENS})
    assert s.server.host == "0.0.0.0" and len(s.auth.tokens) == 2
