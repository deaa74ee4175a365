"""Bearer-token authentication and roles, on both backends."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer

from outboxd.config import ConfigError, Settings
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing, hash_token
from outboxd.storage.store import SqlStore
from tests.support.api import assert_problem, keyed
from tests.support.db import assert_nothing_stored, raw_count

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
    headers = keyed("k-auth", "Authorization", authorization)
    await assert_401(await authed.post(URL, json=BODY, headers=headers))
    await assert_401(await authed.get("/v1/jobs/anything", headers=headers))
    await assert_401(await authed.get("/v1/admin/stats", headers=headers))
    await assert_nothing_stored(db_url)


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


# ------------------------------------------------------------------ auth-off: this operator only


async def _dead_job(client: Client, store: SqlStore, key: str) -> str:
    resp = await client.post(URL, json=BODY, headers={"Idempotency-Key": key})
    assert resp.status == 202, await resp.text()
    job_id: str = (await resp.json())["jobId"]
    assert await store.mark_job_dead(job_id, ("RETRIES_EXHAUSTED", "x"), 1.0) is not None
    return job_id


@pytest.mark.parametrize(
    "host",
    [
        "evil.example",
        "evil.example:8080",
        "rebind.attacker.test:8080",
        "127.0.0.1.nip.io:8080",
        "localhost.evil.example",
        "[::2]:8080",
        "10.0.0.1:8080",
        "127.0.0.1:80x",
        "[::1]x",
        "",
    ],
)
async def test_no_tokens_refuses_a_foreign_host_421(
    make_settings: Callable[..., Settings], store: SqlStore, keys: KeyRing, host: str
) -> None:
    """DNS rebinding: a page whose name now resolves to 127.0.0.1 reads nothing."""
    client = await _client(make_settings(), store, keys)
    try:
        job_id = await _dead_job(client, store, "k-host")
        for path in ("/v1/admin/jobs", f"/v1/jobs/{job_id}", "/ui/", "/healthz", "/nope"):
            resp = await client.get(path, headers={"Host": host})
            await assert_problem(resp, 421, "C03")
            assert job_id not in await resp.text()
        resp = await client.post(
            f"/v1/admin/jobs/{job_id}/redrive", headers={"Host": host, "Origin": f"http://{host}"}
        )
        await assert_problem(resp, 421, "C03")
        job = await store.get_job(job_id)
        assert job is not None and job.status == "DEAD"
    finally:
        await client.close()


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "127.0.0.1:8080", "localhost", "LOCALHOST:8080", "[::1]", "[::1]:8080",
             "127.0.0.2:9", "localhost.:8080"],
)  # fmt: skip
async def test_no_tokens_serves_a_loopback_host(
    make_settings: Callable[..., Settings], store: SqlStore, keys: KeyRing, host: str
) -> None:
    client = await _client(make_settings(), store, keys)
    try:
        resp = await client.get("/v1/admin/stats", headers={"Host": host})
        assert resp.status == 200, await resp.text()
        job_id = await _dead_job(client, store, "k-loop")
        # The console's own POST: Origin is the daemon's origin, the fetch is same-origin.
        redrive = await client.post(
            f"/v1/admin/jobs/{job_id}/redrive",
            headers={"Host": host, "Origin": f"http://{host}", "Sec-Fetch-Site": "same-origin"},
        )
        assert redrive.status == 202, await redrive.text()
    finally:
        await client.close()


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.2:{port}"},
        {"Origin": "http://127.0.0.1:1"},
        {"Origin": "https://127.0.0.1:{port}"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
        {"Origin": "http://127.0.0.1:{port}", "Sec-Fetch-Site": "cross-site"},
    ],
    ids=["other-site", "null", "other-loopback", "other-port", "https", "cross", "same-site",
         "cross-with-own-origin"],
)  # fmt: skip
async def test_no_tokens_refuses_a_cross_origin_state_change_403(
    make_settings: Callable[..., Settings],
    store: SqlStore,
    keys: KeyRing,
    db_url: str,
    headers: dict[str, str],
) -> None:
    """A form post or no-cors fetch from another origin (another site, another local port)
    changes nothing: every POST route is refused before it runs."""
    client = await _client(make_settings(), store, keys)
    try:
        job_id = await _dead_job(client, store, "k-csrf")
        port = client.server.port
        sent = {k: v.format(port=port) for k, v in headers.items()}
        before = {t: await raw_count(db_url, t) for t in ("jobs", "websites", "task_runs")}
        for path, kwargs in [
            (f"/v1/admin/jobs/{job_id}/redrive", {}),
            ("/v1/admin/tasks", {"json": {"type": "noop"}}),
            ("/v1/websites", {"json": {"domain": "csrf.example"}}),
            (URL, {"json": BODY, "headers": {"Idempotency-Key": "k-csrf-2"}}),
        ]:
            extra = kwargs.pop("headers", {})
            resp = await client.post(path, headers={**sent, **extra}, **kwargs)
            await assert_problem(resp, 403, "C03")
        job = await store.get_job(job_id)
        assert job is not None and job.status == "DEAD"
        assert {t: await raw_count(db_url, t) for t in before} == before
        # Reads stay open to the operator's browser tabs of any origin: they change nothing,
        # and without CORS headers another origin cannot read the answer.
        assert (await client.get("/v1/admin/stats", headers=sent)).status == 200
    finally:
        await client.close()


async def test_tokens_configured_do_not_check_host_or_origin(authed: Client) -> None:
    """With tokens, the bearer token is the guard (a browser never sends one on its own)."""
    resp = await authed.post(
        URL,
        json=BODY,
        headers={
            "Authorization": f"Bearer {USER_TOKEN}",
            "Idempotency-Key": "k-any-host",
            "Host": "outboxd.internal.example",
            "Origin": "https://app.example",
        },
    )
    assert resp.status == 202, await resp.text()
