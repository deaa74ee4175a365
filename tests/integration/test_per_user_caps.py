"""The per-user caps under concurrency: `api.max_active_jobs_per_user` and
`api.max_websites_per_user_per_hour` are checked in the transaction that writes the job or
the website (docs/decisions/0030-per-user-bounds.md), so 40 requests sent at
once against a cap of 3 are 3 accepted and 37 refused, on both backends, through the HTTP
API. Also: RUNNING jobs count, a replay is never refused, other users are not held back.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from aiohttp.test_utils import TestClient

from outboxd.storage.store import SqlStore
from tests.support.api import ALICE, BOB, TOKENS, assert_problem, bearer
from tests.support.db import raw_count, raw_rows

JOBS = "/v1/portal-link-jobs"
BODY = {"portal": "suwon", "username": "20201234", "password": "pw-caps"}
CAP = 3
AT_ONCE = 40

Client = TestClient[Any, Any]
ClientFactory = Callable[..., Awaitable[Client]]


@pytest.fixture
def make_client(make_api_client: ClientFactory) -> ClientFactory:
    """An in-process API (no queue: jobs stay QUEUED) with alice, bob and root's tokens and
    the `api` section given."""

    async def factory(**api: Any) -> Client:
        return await make_api_client(auth={"tokens": TOKENS}, api=api)

    return factory


async def _at_once(calls: list[Callable[[], Awaitable[Any]]]) -> list[Any]:
    """Every call started together (each on a connection of its own): their answers."""
    go = asyncio.Event()

    async def one(call: Callable[[], Awaitable[Any]]) -> Any:
        await go.wait()
        resp = await call()
        await resp.read()
        return resp

    tasks = [asyncio.ensure_future(one(c)) for c in calls]
    await asyncio.sleep(0)  # every task waits on `go`
    go.set()
    return await asyncio.gather(*tasks)


def _statuses(answers: list[Any]) -> dict[int, int]:
    out: dict[int, int] = {}
    for resp in answers:
        out[resp.status] = out.get(resp.status, 0) + 1
    return out


async def test_forty_jobs_at_once_against_a_cap_of_three_are_three_accepted(
    make_client: ClientFactory, db_url: str
) -> None:
    client = await make_client(max_active_jobs_per_user=CAP)

    def post(n: int) -> Callable[[], Awaitable[Any]]:
        headers = bearer(ALICE, **{"Idempotency-Key": f"burst-{n}"})
        return lambda: client.post(JOBS, json=BODY, headers=headers)

    answers = await _at_once([post(n) for n in range(AT_ONCE)])
    assert _statuses(answers) == {202: CAP, 429: AT_ONCE - CAP}
    for resp in answers:
        if resp.status == 429:
            await assert_problem(resp, 429, "C12")
            assert int(resp.headers["Retry-After"]) >= 1
    assert await raw_count(db_url, "jobs") == CAP
    assert await raw_count(db_url, "relay_outbox") == CAP
    # Replays of the accepted jobs, sent together, are never refused by the cap.
    accepted = [r for r in answers if r.status == 202]
    keys = [r.request_info.headers["Idempotency-Key"] for r in accepted]
    replays = await _at_once(
        [
            (
                lambda k=k: client.post(
                    JOBS, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": k})
                )
            )
            for k in keys * 3
        ]
    )
    assert _statuses(replays) == {202: 3 * CAP}
    assert all(r.headers["Idempotent-Replayed"] == "true" for r in replays)
    # Another user has a cap of its own.
    bob = await client.post(JOBS, json=BODY, headers=bearer(BOB, **{"Idempotency-Key": "b1"}))
    assert bob.status == 202, await bob.text()
    assert await raw_count(db_url, "jobs") == CAP + 1


async def test_two_users_at_once_each_get_their_own_cap(
    make_client: ClientFactory, db_url: str
) -> None:
    """Requests of two users interleaved in the same groups: each user's cap holds."""
    client = await make_client(max_active_jobs_per_user=CAP)

    def post(token: str, n: int) -> Callable[[], Awaitable[Any]]:
        headers = bearer(token, **{"Idempotency-Key": f"mix-{n}"})
        return lambda: client.post(JOBS, json=BODY, headers=headers)

    answers = await _at_once([post(ALICE if n % 2 else BOB, n) for n in range(AT_ONCE)])
    assert _statuses(answers) == {202: 2 * CAP, 429: AT_ONCE - 2 * CAP}
    rows = await raw_rows(db_url, "SELECT user_id, COUNT(*) AS n FROM jobs GROUP BY user_id")
    assert {r["user_id"]: r["n"] for r in rows} == {"alice": CAP, "bob": CAP}


async def test_running_jobs_count_toward_the_cap(
    make_client: ClientFactory, store: SqlStore, db_url: str
) -> None:
    """A job a worker runs is still active: with the cap's worth of RUNNING jobs a new one is
    refused; once one ends, a new one is accepted."""
    client = await make_client(max_active_jobs_per_user=CAP)
    ids = []
    for n in range(CAP):
        resp = await client.post(
            JOBS, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": f"r{n}"})
        )
        assert resp.status == 202
        ids.append((await resp.json())["jobId"])
    runs = [await store.start_job_run(job_id, time.time(), 60.0) for job_id in ids]
    assert all(run is not None and run.status == "RUNNING" for run in runs)
    over = await client.post(
        JOBS, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "r-over"})
    )
    await assert_problem(over, 429, "C12")
    assert await raw_count(db_url, "jobs") == CAP
    first = runs[0]
    assert first is not None
    assert await store.finish_job(first, "SUCCEEDED", time.time(), result={}) is not None
    again = await client.post(
        JOBS, json=BODY, headers=bearer(ALICE, **{"Idempotency-Key": "r-over"})
    )
    assert again.status == 202, await again.text()


async def test_forty_websites_at_once_against_a_cap_of_three_are_three_registered(
    make_client: ClientFactory, db_url: str
) -> None:
    client = await make_client(max_websites_per_user_per_hour=CAP)

    def register(n: int) -> Callable[[], Awaitable[Any]]:
        body = {"domain": f"burst-{n}.example"}
        return lambda: client.post("/v1/websites", json=body, headers=bearer(ALICE))

    answers = await _at_once([register(n) for n in range(AT_ONCE)])
    assert _statuses(answers) == {201: CAP, 429: AT_ONCE - CAP}
    for resp in answers:
        if resp.status == 429:
            await assert_problem(resp, 429, "C12")
            assert 1 <= int(resp.headers["Retry-After"]) <= 3600
    assert await raw_count(db_url, "websites") == CAP
    assert await raw_count(db_url, "work_outbox") == CAP
    # A known domain costs no classification: never refused, even sent together.
    known = [r for r in answers if r.status == 201]
    domains = [(await r.json())["domain"] for r in known]
    again = await _at_once(
        [
            (lambda d=d: client.post("/v1/websites", json={"domain": d}, headers=bearer(ALICE)))
            for d in domains * 3
        ]
    )
    assert _statuses(again) == {200: 3 * CAP}
    bob = await client.post("/v1/websites", json={"domain": "bob.example"}, headers=bearer(BOB))
    assert bob.status == 201, await bob.text()
