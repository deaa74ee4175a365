"""`POST /v1/portal-link-jobs` and `GET /v1/jobs/{id}`: intake, idempotency, validation, visibility.

Every test runs on SQLite and Postgres (the `backend` fixture behind `store`/`api`).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from outboxd.config import Settings
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from tests.support.api import ADMIN, ALICE, BOB, TOKENS, assert_problem, bearer, keyed
from tests.support.db import assert_nothing_stored, raw_count

URL = "/v1/portal-link-jobs"
BODY = {"portal": "suwon", "username": "20201234", "password": "pw-jobs"}

Client = TestClient[Any, Any]
ClientFactory = Callable[..., Awaitable[Client]]


@pytest.fixture
def make_client(make_api_client: ClientFactory) -> ClientFactory:
    """Build an in-process API (no queue) on the test's store with settings overrides."""
    return make_api_client


# ------------------------------------------------------------------ accept and replay


async def test_new_job_answers_202_with_location_and_body(api: Client, store: SqlStore) -> None:
    """A new job answers 202 with a Location header, QUEUED status and a PENDING dispatch."""
    resp = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-new"})
    assert resp.status == 202, await resp.text()
    body = await resp.json()
    assert set(body) == {"jobId", "status", "dispatch"}
    job_id = body["jobId"]
    assert resp.headers["Location"] == f"/v1/jobs/{job_id}"
    assert "Idempotent-Replayed" not in resp.headers
    assert body["status"] == "QUEUED"
    assert set(body["dispatch"]) == {"outboxId", "status", "messageId"}
    assert body["dispatch"]["status"] == "PENDING"
    assert body["dispatch"]["messageId"] is None
    row = await store.latest_relay_row_for_job(job_id)
    assert row is not None and row.id == body["dispatch"]["outboxId"]
    job = await store.get_job(job_id)
    assert job is not None and job.status == "QUEUED" and job.user_id == "local"
    got = await api.get(resp.headers["Location"])
    assert got.status == 200
    shown = await got.json()
    assert shown["jobId"] == job_id and shown["status"] == "QUEUED"
    assert shown["kind"] == "portal_link" and shown["portal"] == "suwon"


async def test_replay_returns_the_same_job_and_stores_nothing_new(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """The same key and body answer 202 with the same jobId and Idempotent-Replayed: true."""
    first = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-replay"})
    assert first.status == 202
    job_id = (await first.json())["jobId"]
    for _ in range(2):
        again = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-replay"})
        assert again.status == 202, await again.text()
        assert again.headers.get("Idempotent-Replayed") == "true"
        body = await again.json()
        assert body["jobId"] == job_id
        assert again.headers["Location"] == f"/v1/jobs/{job_id}"
    assert await raw_count(db_url, "jobs") == 1
    assert await raw_count(db_url, "relay_outbox") == 1


async def test_same_key_different_body_is_409_c07(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """The same key with a different body answers 409 C07 problem+json and stores nothing."""
    first = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-conflict"})
    assert first.status == 202
    other = {**BODY, "password": "another-password"}
    resp = await api.post(URL, json=other, headers={"Idempotency-Key": "k-conflict"})
    body = await assert_problem(resp, 409, "C07")
    assert "another-password" not in json.dumps(body)
    assert await raw_count(db_url, "jobs") == 1
    assert await raw_count(db_url, "relay_outbox") == 1


async def test_twenty_concurrent_identical_requests_create_one_job(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """Twenty identical requests at once create exactly one job and one outbox row."""
    responses = await asyncio.gather(
        *(api.post(URL, json=BODY, headers={"Idempotency-Key": "k-storm"}) for _ in range(20))
    )
    statuses = [r.status for r in responses]
    assert statuses == [202] * 20, [await r.text() for r in responses]
    ids = {(await r.json())["jobId"] for r in responses}
    assert len(ids) == 1
    replayed = [r.headers.get("Idempotent-Replayed") == "true" for r in responses]
    assert replayed.count(False) == 1
    assert await raw_count(db_url, "jobs") == 1
    assert await raw_count(db_url, "relay_outbox") == 1


async def test_concurrent_same_key_different_bodies_never_make_two_jobs(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """Concurrent requests sharing a key, different bodies: one job; the rest 409 or replay."""
    bodies = [{**BODY, "password": f"pw-{i % 4}"} for i in range(12)]
    responses = await asyncio.gather(
        *(api.post(URL, json=b, headers={"Idempotency-Key": "k-race"}) for b in bodies)
    )
    accepted = [(b, r) for b, r in zip(bodies, responses, strict=True) if r.status == 202]
    rejected = [r for r in responses if r.status != 202]
    for r in rejected:
        await assert_problem(r, 409, "C07")
    fresh = [r for _, r in accepted if r.headers.get("Idempotent-Replayed") != "true"]
    assert len(fresh) == 1
    winner_body = next(b for b, r in accepted if r is fresh[0])
    # Every 202 carries the winner's body, and every request with it was accepted.
    assert all(b == winner_body for b, _ in accepted)
    assert len(accepted) == sum(1 for b in bodies if b == winner_body)
    assert len({(await r.json())["jobId"] for _, r in accepted}) == 1
    assert await raw_count(db_url, "jobs") == 1
    assert await raw_count(db_url, "relay_outbox") == 1


async def test_replay_survives_key_rotation(
    make_settings: Callable[..., Settings], store: SqlStore, db_url: str
) -> None:
    """After a key rotation that keeps the old key second, the same request still replays."""
    old_key, new_key = os.urandom(32), os.urandom(32)
    settings = make_settings()
    job_ids: list[str] = []
    for ring, key in (
        (KeyRing([old_key]), "k-rot"),
        (KeyRing([new_key, old_key]), "k-rot"),
        (KeyRing([new_key]), "k-rot"),
    ):
        deps = build_api_deps(settings, store, ring, Metrics(), queues=None, dispatcher=None)
        client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
        await client.start_server()
        try:
            resp = await client.post(URL, json=BODY, headers={"Idempotency-Key": key})
            if len(job_ids) < 2:
                assert resp.status == 202, await resp.text()
                job_ids.append((await resp.json())["jobId"])
            else:
                # The key that signed the fingerprint is gone: it can no longer be matched.
                await assert_problem(resp, 409, "C07")
        finally:
            await client.close()
    assert job_ids[0] == job_ids[1]
    assert await raw_count(db_url, "jobs") == 1


# ------------------------------------------------------------------ rejected requests


@pytest.mark.parametrize(
    "headers",
    [{}, {"Idempotency-Key": ""}, {"Idempotency-Key": "k" * 256}],
    ids=["missing", "empty", "256-chars"],
)
async def test_bad_idempotency_key_is_400_c06(
    api: Client, store: SqlStore, headers: dict[str, str], db_url: str
) -> None:
    """A missing, empty or over-255-character Idempotency-Key answers 400 C06 and stores nothing."""
    resp = await api.post(URL, json=BODY, headers=headers)
    assert resp.request_info.headers.get("Idempotency-Key") == headers.get("Idempotency-Key")
    await assert_problem(resp, 400, "C06")
    await assert_nothing_stored(db_url)


async def test_a_255_character_key_is_accepted(api: Client, store: SqlStore, db_url: str) -> None:
    """An Idempotency-Key of exactly 255 characters is accepted."""
    resp = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k" * 255})
    assert resp.status == 202, await resp.text()
    assert await raw_count(db_url, "jobs") == 1


INVALID_BODIES: list[tuple[str, Any, set[str]]] = [
    ("malformed-json", b'{"portal": "suwon", ', {"body"}),
    ("not-utf8", b'{"portal": "\xff"}', {"body"}),
    ("array", [BODY], {"body"}),
    ("string", "suwon", {"body"}),
    ("null", None, {"body"}),
    ("deeply-nested", b"[" * 30000 + b"]" * 30000, {"body"}),
    ("control-chars", {**BODY, "username": "2020\n1234"}, {"username"}),
    ("username-too-long", {**BODY, "username": "u" * 65}, {"username"}),
    ("username-number", {**BODY, "username": 20201234}, {"username"}),
    ("password-list", {**BODY, "password": ["x"]}, {"password"}),
    ("portal-null", {**BODY, "portal": None}, {"portal"}),
    ("missing-username", {"portal": "suwon", "password": "x"}, {"username"}),
    ("missing-password", {"portal": "suwon", "username": "x"}, {"password"}),
    ("missing-portal", {"username": "x", "password": "x"}, {"portal"}),
    ("empty-object", {}, {"portal"}),
    ("empty-username", {**BODY, "username": ""}, {"username"}),
    ("blank-password", {**BODY, "password": "   "}, {"password"}),
    ("empty-portal", {**BODY, "portal": ""}, {"portal"}),
    ("wrong-portal", {**BODY, "portal": "seoul"}, {"portal"}),
    ("unknown-fields", {**BODY, "extra": 1, "remember": True}, {"extra", "remember"}),
]


@pytest.mark.parametrize(
    ("payload", "fields"),
    [pytest.param(p, f, id=name) for name, p, f in INVALID_BODIES],
)
async def test_invalid_body_is_400_c01_with_field_errors(
    api: Client, store: SqlStore, payload: Any, fields: set[str], db_url: str
) -> None:
    """An invalid body answers 400 C01 naming the bad fields in errors[] and stores nothing."""
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    resp = await api.post(
        URL,
        data=data,
        headers={"Idempotency-Key": "k-invalid", "Content-Type": "application/json"},
    )
    body = await assert_problem(resp, 400, "C01")
    errors = body["errors"]
    assert isinstance(errors, list) and errors
    for e in errors:
        assert set(e) == {"field", "message"}
        assert isinstance(e["message"], str) and e["message"]
    assert {e["field"] for e in errors} == fields
    await assert_nothing_stored(db_url)


@pytest.mark.parametrize("ctype", ["text/plain", "application/x-www-form-urlencoded", None])
async def test_non_json_content_type_is_415_c01(
    api: Client, store: SqlStore, ctype: str | None, db_url: str
) -> None:
    """A body that is not declared JSON answers 415 C01 and stores nothing."""
    headers = keyed("k-ctype", "Content-Type", ctype)
    resp = await api.post(URL, data=json.dumps(BODY).encode(), headers=headers)
    body = await assert_problem(resp, 415, "C01")
    assert body["errors"][0]["field"] == "Content-Type"
    await assert_nothing_stored(db_url)


async def in_chunks(data: bytes, size: int) -> AsyncIterator[bytes]:
    """`data` sent chunked (no Content-Length), `size` bytes at a time."""
    for i in range(0, len(data), size):
        yield data[i : i + size]


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
@pytest.mark.parametrize("size", [1025 + 100, 4 * 1024 * 1024])
async def test_oversized_body_is_413_c05(
    make_client: ClientFactory, store: SqlStore, size: int, chunked: bool, db_url: str
) -> None:
    """A body over server.max_body_bytes answers 413 C05 and stores nothing, whether it
    declares its Content-Length or comes chunked (no Content-Length)."""
    client = await make_client(server={"max_body_bytes": 1024})
    data = json.dumps({**BODY, "username": "u" * size}).encode()
    resp = await client.post(
        URL,
        data=in_chunks(data, 64 * 1024) if chunked else data,
        headers={
            "Idempotency-Key": "k-chunked" if chunked else "k-big",
            "Content-Type": "application/json",
        },
    )
    if chunked:
        assert "Content-Length" not in resp.request_info.headers
    await assert_problem(resp, 413, "C05")
    await assert_nothing_stored(db_url)


async def test_body_at_the_limit_is_accepted(
    make_client: ClientFactory, store: SqlStore, db_url: str
) -> None:
    """A chunked body of exactly server.max_body_bytes is read and accepted."""
    client = await make_client(server={"max_body_bytes": 1024})
    base = json.dumps({**BODY, "username": ""}).encode()
    data = json.dumps({**BODY, "username": "u" * (1024 - len(base))}).encode()
    assert len(data) == 1024

    resp = await client.post(
        URL,
        data=in_chunks(data, 500),
        headers={"Idempotency-Key": "k-limit", "Content-Type": "application/json"},
    )
    # username is capped at 64 characters: the body was read whole and validated.
    body = await assert_problem(resp, 400, "C01")
    assert body["errors"][0]["field"] == "username"
    await assert_nothing_stored(db_url)


async def test_unknown_route_is_404_c04(api: Client, store: SqlStore, db_url: str) -> None:
    """An unknown path answers 404 C04 problem+json."""
    for path in ("/v1/nope", "/v1/portal-link-jobs/extra", "/v2"):
        resp = await api.get(path)
        await assert_problem(resp, 404, "C04")
    await assert_nothing_stored(db_url)


@pytest.mark.parametrize(
    ("method", "path", "allow"),
    [
        ("GET", URL, {"POST"}),
        ("DELETE", URL, {"POST"}),
        ("PUT", "/v1/jobs/abc", {"GET"}),
        ("POST", "/v1/jobs/abc", {"GET"}),
    ],
)
async def test_wrong_method_is_405_c10_with_allow(
    api: Client, store: SqlStore, method: str, path: str, allow: set[str], db_url: str
) -> None:
    """A known path with the wrong method answers 405 C10 with an Allow header."""
    resp = await api.request(
        method, path, data=json.dumps(BODY).encode(), headers={"Idempotency-Key": "k-405"}
    )
    await assert_problem(resp, 405, "C10")
    allowed = {m.strip() for m in resp.headers["Allow"].split(",")}
    assert allowed == allow
    await assert_nothing_stored(db_url)


# ------------------------------------------------------------------ visibility


async def test_another_users_job_is_404_like_a_missing_one(
    make_client: ClientFactory, store: SqlStore
) -> None:
    """Bob reading Alice's job gets the same 404 C04 as for a job that does not exist."""
    client = await make_client(auth={"tokens": TOKENS})
    resp = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "k1"}))
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["jobId"]
    job = await store.get_job(job_id)
    assert job is not None and job.user_id == "alice"

    own = await client.get(f"/v1/jobs/{job_id}", headers=bearer(ALICE))
    assert own.status == 200
    assert (await own.json())["jobId"] == job_id

    theirs = await client.get(f"/v1/jobs/{job_id}", headers=bearer(BOB))
    missing = await client.get(f"/v1/jobs/{uuid.uuid4()}", headers=bearer(BOB))
    a = await assert_problem(theirs, 404, "C04")
    b = await assert_problem(missing, 404, "C04")
    a.pop("requestId")
    b.pop("requestId")
    assert a == b
    assert job_id not in json.dumps(a)
    skip = {"x-request-id", "date"}
    ha = {k.lower(): v for k, v in theirs.headers.items() if k.lower() not in skip}
    hb = {k.lower(): v for k, v in missing.headers.items() if k.lower() not in skip}
    assert ha == hb


async def test_same_key_for_two_users_makes_two_jobs(
    make_client: ClientFactory, store: SqlStore, db_url: str
) -> None:
    """Idempotency keys are per user: Alice and Bob using one key get a job each."""
    client = await make_client(auth={"tokens": TOKENS})
    a = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "same"}))
    b = await client.post(
        URL,
        json={**BODY, "password": "bob-pw"},
        headers=bearer(BOB, **{"Idempotency-Key": "same"}),
    )
    assert a.status == 202 and b.status == 202
    assert "Idempotent-Replayed" not in b.headers
    assert (await a.json())["jobId"] != (await b.json())["jobId"]
    assert await raw_count(db_url, "jobs") == 2


async def test_admin_can_read_any_job(make_client: ClientFactory, store: SqlStore) -> None:
    """An admin token reads a job another user created."""
    client = await make_client(auth={"tokens": TOKENS})
    resp = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "k2"}))
    job_id = (await resp.json())["jobId"]
    got = await client.get(f"/v1/jobs/{job_id}", headers=bearer(ADMIN))
    assert got.status == 200, await got.text()
    body = await got.json()
    assert body["jobId"] == job_id
    assert set(body) == {
        "jobId",
        "kind",
        "portal",
        "status",
        "attempts",
        "createdAt",
        "updatedAt",
        "finishedAt",
        "progress",
        "error",
        "result",
        "resultHidden",
        "waitingFor",
        "cancelRequested",
    }
    assert body["cancelRequested"] is False and body["waitingFor"] is None
    assert body["resultHidden"] is False  # an admin reads every result
    assert "password" not in json.dumps(body) and "pw-jobs" not in json.dumps(body)


# ------------------------------------------------------------------ bidirectional controls

BIDI = ["\u202a", "\u202b", "\u202c", "\u202d", "\u202e", "\u2066", "\u2067", "\u2068", "\u2069"]


@pytest.mark.parametrize("bidi", BIDI, ids=[f"U+{ord(c):04X}" for c in BIDI])
async def test_a_username_with_a_bidi_control_is_400_c01(
    api: Client, store: SqlStore, db_url: str, bidi: str
) -> None:
    """A username shows up in the console and the logs of whoever reads them: it may not
    hold text that displays as something else (`2020\u202e4321` reads as `20201234`)."""
    body = {**BODY, "username": f"2020{bidi}4321"}
    resp = await api.post(URL, json=body, headers={"Idempotency-Key": "k-bidi"})
    problem = await assert_problem(resp, 400, "C01")
    assert problem["errors"][0]["field"] == "username"
    await assert_nothing_stored(db_url)


async def test_an_idempotency_key_with_a_bidi_control_is_400_c01(
    api: Client, store: SqlStore, db_url: str
) -> None:
    resp = await api.post(URL, json=BODY, headers={"Idempotency-Key": "k-\u2067-1"})
    problem = await assert_problem(resp, 400, "C01")
    assert problem["errors"][0]["field"] == "Idempotency-Key"
    await assert_nothing_stored(db_url)


async def test_a_password_may_hold_a_bidi_control(api: Client, store: SqlStore) -> None:
    """A password is never shown: whatever the portal accepts is accepted."""
    body = {**BODY, "password": "pw\u202e-x"}
    resp = await api.post(URL, json=body, headers={"Idempotency-Key": "k-bidi-pw"})
    assert resp.status == 202, await resp.text()


# ------------------------------------------------------------------ per-user caps


async def test_active_jobs_over_the_cap_are_429_c12_and_a_replay_is_not(
    make_client: ClientFactory, store: SqlStore, db_url: str
) -> None:
    """api.max_active_jobs_per_user = 2: a third QUEUED/RUNNING job of one user is 429 C12
    with Retry-After and stores nothing; replaying an existing job still answers 202;
    another user is not affected; once a job ends, a new one is accepted."""
    client = await make_client(auth={"tokens": TOKENS}, api={"max_active_jobs_per_user": 2})
    first = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "a1"}))
    second = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "a2"}))
    assert (first.status, second.status) == (202, 202)
    over = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "a3"}))
    problem = await assert_problem(over, 429, "C12")
    assert int(over.headers["Retry-After"]) >= 1
    assert "password" not in json.dumps(problem) and BODY["password"] not in json.dumps(problem)
    assert await raw_count(db_url, "jobs") == 2

    replay = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "a1"}))
    assert replay.status == 202, await replay.text()
    assert replay.headers["Idempotent-Replayed"] == "true"
    assert (await replay.json())["jobId"] == (await first.json())["jobId"]
    bob = await client.post(URL, json=BODY, headers=bearer(BOB, **{"Idempotency-Key": "a3"}))
    assert bob.status == 202

    done = await store.get_job((await first.json())["jobId"])
    assert done is not None
    assert await store.mark_job_dead(done.id, ("RETRIES_EXHAUSTED", "x"), done.updated_at)
    again = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "a3"}))
    assert again.status == 202, await again.text()
    assert await raw_count(db_url, "jobs") == 4


async def test_a_running_job_counts_toward_the_cap(
    make_client: ClientFactory, store: SqlStore, db_url: str
) -> None:
    """api.max_active_jobs_per_user = 1 and the user's one job is RUNNING (a worker holds
    it): a new job is 429 C12, as with a QUEUED one."""
    client = await make_client(auth={"tokens": TOKENS}, api={"max_active_jobs_per_user": 1})
    first = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "r1"}))
    assert first.status == 202, await first.text()
    job_id = (await first.json())["jobId"]
    assert await store.start_job_run(job_id, time.time(), 60.0) is not None
    got = await client.get(f"/v1/jobs/{job_id}", headers=bearer(ALICE))
    assert (await got.json())["status"] == "RUNNING"

    over = await client.post(URL, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "r2"}))
    await assert_problem(over, 429, "C12")
    assert await raw_count(db_url, "jobs") == 1


async def test_with_no_cap_a_user_may_have_any_number_of_active_jobs(
    api: Client, db_url: str
) -> None:
    for n in range(6):
        resp = await api.post(URL, json=BODY, headers={"Idempotency-Key": f"nocap-{n}"})
        assert resp.status == 202
    assert await raw_count(db_url, "jobs") == 6
