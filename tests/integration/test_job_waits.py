"""Waiting instead of polling (GET /v1/jobs/{id} with ETag, If-None-Match and Prefer: wait),
in-process on both backends: conditional answers, holds woken by a change in this process
or by another store on the same database (what another daemon is), timeouts, the clamp,
the bound on held requests, the stop Event, and the Postgres listener surviving the loss
of its connection. The cross-process cases with real daemons are in
tests/acceptance/test_job_waits.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path
from typing import Any

from outboxd.services.job_waits import JobWaits
from outboxd.storage.ports import JobRecord
from outboxd.storage.store import SqlStore
from tests.conftest import postgres_only
from tests.support.db import raw_rows
from tests.support.held import (
    Api,
    another_store,
    another_store_on,
    feed_listening_through_a_proxy,
    held,
    listening,
    new_job,
    until_held,
)
from tests.support.ops import placeholder_job
from tests.support.waits import Calls, eventually


async def test_every_answer_has_an_etag_and_if_none_match_answers_304(make_api: Api) -> None:
    client = await make_api()
    job_id, etag = await new_job(client)
    assert etag.startswith('"') and etag.endswith('"') and len(etag) == 26
    same = await client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": etag})
    assert (same.status, same.headers["ETag"], await same.read()) == (304, etag, b"")
    for other in ('"0000"', f"W/{etag}", f'"x", {etag}', "*"):
        got = await client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": other})
        assert got.status == (200 if other == '"0000"' else 304), other
    stale = await client.get(f"/v1/jobs/{job_id}", headers={"If-None-Match": "garbage"})
    assert stale.status == 200 and (await stale.json())["jobId"] == job_id
    assert "Preference-Applied" not in stale.headers


async def test_a_held_request_is_answered_when_its_job_changes(
    make_api: Api, store: SqlStore
) -> None:
    client = await make_api()
    job_id, etag = await new_job(client)
    request = asyncio.ensure_future(held(client, job_id, 30, etag))
    await until_held(client, 1)
    started = time.monotonic()
    job, _ = await store.cancel_job(job_id, time.time(), "owner")
    resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200 and time.monotonic() - started < 10
    assert resp.headers["Preference-Applied"] == "wait=30"
    assert resp.headers["ETag"] != etag
    assert (await resp.json())["status"] == "CANCELLED" == job.status
    # Asked again with the new ETag: unchanged, so 304 once the (short) wait is over.
    again = await held(client, job_id, 1, resp.headers["ETag"])
    assert (again.status, again.headers["Preference-Applied"]) == (304, "wait=1")
    assert again.headers["ETag"] == resp.headers["ETag"]


async def test_without_if_none_match_a_request_is_held_until_the_job_finishes(
    make_api: Api, store: SqlStore
) -> None:
    client = await make_api()
    job_id, _ = await new_job(client)
    reads = Calls(store, "get_job")
    request = asyncio.ensure_future(held(client, job_id, 30))
    await reads.reach(1)  # the request's own read
    run = await store.start_job_run(job_id, time.time(), 30.0)  # a change, not an end
    assert run is not None
    # The hold read the job again after the change (a RUNNING job): it holds on. Had the
    # change ended it, the answer below would be that RUNNING job.
    await reads.reach(2)
    assert not request.done()
    assert await store.finish_job(run, "SUCCEEDED", time.time(), result={}) is not None
    resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200 and (await resp.json())["status"] == "SUCCEEDED"
    # A finished job's wait ends at once.
    quick = await asyncio.wait_for(held(client, job_id, 30), 5)
    assert quick.status == 200 and quick.headers["Preference-Applied"] == "wait=30"


async def test_a_wait_that_runs_out_answers_304_with_the_same_etag(make_api: Api) -> None:
    client = await make_api()
    job_id, etag = await new_job(client)
    started = time.monotonic()
    resp = await held(client, job_id, 1, etag)
    assert 0.9 < time.monotonic() - started < 10
    assert (resp.status, resp.headers["ETag"], resp.headers["Preference-Applied"]) == (
        304,
        etag,
        "wait=1",
    )
    # A stale If-None-Match answers at once, whatever the wait.
    resp = await asyncio.wait_for(held(client, job_id, 30, '"stale"'), 5)
    assert resp.status == 200


async def test_the_wait_is_clamped_and_an_unreadable_preference_ignored(make_api: Api) -> None:
    client = await make_api(max_wait_s=1)
    job_id, etag = await new_job(client)
    resp = await asyncio.wait_for(held(client, job_id, 86400, etag), 10)
    assert (resp.status, resp.headers["Preference-Applied"]) == (304, "wait=1")
    for prefer in ("wait=soon", "wait=-1", "respond-async", "wait=0", "wait=1.5"):
        got = await asyncio.wait_for(
            client.get(f"/v1/jobs/{job_id}", headers={"Prefer": prefer, "If-None-Match": etag}),
            5,
        )
        assert got.status == 304 and "Preference-Applied" not in got.headers, prefer
    got = await client.get(
        f"/v1/jobs/{job_id}", headers={"Prefer": "respond-async, wait=1", "If-None-Match": etag}
    )
    assert got.headers["Preference-Applied"] == "wait=1"


async def test_past_max_waiters_a_request_is_answered_at_once(make_api: Api) -> None:
    client = await make_api(max_waiters=2)
    job_id, etag = await new_job(client)
    first = [asyncio.ensure_future(held(client, job_id, 30, etag)) for _ in range(2)]
    await until_held(client, 2)
    extra = await asyncio.wait_for(held(client, job_id, 30, etag), 5)
    assert extra.status == 304 and "Preference-Applied" not in extra.headers
    client.stop.set()
    for resp in await asyncio.wait_for(asyncio.gather(*first), 5):
        # The stop answers every held request at once, with the job as it is.
        assert resp.status == 200 and (await resp.json())["jobId"] == job_id


async def test_another_store_on_the_database_wakes_a_held_request(
    make_api: Api, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """A second store is another daemon's view of the database: its commits do not reach
    this process's JobChanges, so only the feed (NOTIFY, or the poll) can wake the hold."""
    client = await make_api()
    async with another_store(store, db_url, tmp_path) as other:
        job_id, etag = await new_job(client)
        if store.backend == "postgres":
            await listening(db_url)
        reads = Calls(store, "get_job")
        request = asyncio.ensure_future(held(client, job_id, 30, etag))
        await reads.reach(1)  # held, and past its own read: only the feed can wake it now
        started = time.monotonic()
        _, outcome = await other.cancel_job(job_id, time.time(), "admin")
        assert outcome == "cancelled"
        resp = await asyncio.wait_for(request, 10)
        elapsed = time.monotonic() - started
        assert resp.status == 200 and (await resp.json())["status"] == "CANCELLED"
        # The contract's bounds: a notification on Postgres, two polls at most on SQLite.
        assert elapsed < (0.5 if store.backend == "postgres" else 2.0), elapsed


@postgres_only  # LISTEN/NOTIFY; SQLite always polls (the test above)
async def test_the_listener_survives_losing_its_connection(
    make_api: Api, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    client = await make_api()
    async with another_store(store, db_url, tmp_path) as other:
        await listening(db_url)
        killed = await raw_rows(
            db_url,
            "SELECT pg_terminate_backend(pid) AS killed FROM pg_stat_activity"
            " WHERE query LIKE 'LISTEN%' AND datname = current_database()",
        )
        assert killed and all(r["killed"] for r in killed)
        # While it reconnects, the poll still wakes a hold on another store's change.
        job_id, etag = await new_job(client)
        request = asyncio.ensure_future(held(client, job_id, 30, etag))
        await until_held(client, 1)
        await other.cancel_job(job_id, time.time(), "admin")
        resp = await asyncio.wait_for(request, 10)
        assert resp.status == 200 and (await resp.json())["status"] == "CANCELLED"
        # And it listens again: a notification wakes the next hold within the bound.
        await listening(db_url)
        job_id, etag = await new_job(client)
        reads = Calls(store, "get_job")
        request = asyncio.ensure_future(held(client, job_id, 30, etag))
        await reads.reach(1)
        started = time.monotonic()
        await other.cancel_job(job_id, time.time(), "admin")
        resp = await asyncio.wait_for(request, 10)
        assert resp.status == 200 and time.monotonic() - started < 0.5


async def test_a_held_request_holds_no_database_connection(
    make_api: Api, store: SqlStore, db_url: str
) -> None:
    """Twenty holds: on Postgres every pooled connection is idle (none lent to a held
    request); on SQLite the one reader and the one writer still serve others at once."""
    client = await make_api()
    job_id, etag = await new_job(client)
    reads = Calls(store, "get_job")
    requests = [asyncio.ensure_future(held(client, job_id, 30, etag)) for _ in range(20)]
    # A hold registers before its read (the holds entering together share one): every
    # request held, and reads back (on Postgres, every pooled connection idle below).
    await until_held(client, 20)
    await reads.reach(1)
    if store.backend == "postgres":
        pool = store.db._pool  # type: ignore[attr-defined]
        await eventually(
            lambda: pool.get_idle_size() == pool.get_size(), what="every pooled connection idle"
        )
        assert pool.get_size() <= 5
    assert client.waits.held == 20
    plain = await asyncio.wait_for(client.get(f"/v1/jobs/{job_id}"), 5)  # a read
    assert plain.status == 200
    assert not any(r.done() for r in requests)
    await asyncio.wait_for(store.cancel_job(job_id, time.time(), "owner"), 5)  # a write
    for resp in await asyncio.wait_for(asyncio.gather(*requests), 10):
        assert resp.status == 200


async def test_a_change_between_the_read_and_the_wait_still_wakes_the_hold(
    store: SqlStore,
) -> None:
    """The hold is registered before the request reads the job: a change committed after
    that read, before the request says what it waits for, is not lost."""
    waits = JobWaits(store, store.changes, max_waiters=10)
    job_id = str(uuid.uuid4())
    await store.create_portal_job(
        placeholder_job(job_id, str(uuid.uuid4()), job_id, "bob"), now=time.time()
    )
    async with waits.hold(job_id, "local") as hold:
        assert hold is not None
        seen = await store.get_job(job_id)
        assert seen is not None and seen.status == "QUEUED"
        await store.cancel_job(job_id, time.time(), "owner")  # between the read and the wait
        started = time.monotonic()
        ending, now = await hold.until(lambda j: j is None or j.status != seen.status, 5)
    assert ending == "changed" and time.monotonic() - started < 4
    assert now is not None and now.status == "CANCELLED"
    assert waits.held == 0 and store.changes.watched() == []


class GatedReads:
    """The store's get_job, whose next answer, once `close()`d, is read from the database
    and then held back until `open()`: a watch's shared read in flight for as long as the
    test wants."""

    def __init__(self, store: SqlStore) -> None:
        self.store = store
        self.gate = asyncio.Event()
        self.gate.set()
        self.held = asyncio.Event()

    def close(self) -> None:
        self.gate.clear()
        self.held.clear()

    async def get_job(self, job_id: str) -> JobRecord | None:
        job = await self.store.get_job(job_id)
        if not self.gate.is_set():
            self.held.set()
            await self.gate.wait()
        return job


async def test_a_change_during_the_watchs_read_still_ends_the_hold(store: SqlStore) -> None:
    """A change wakes the watch, whose read (shared by its holds) is still out when a
    second change commits: the value that read brings back is already stale, and the
    hold, waiting for the second change, ends at once all the same (no lost wake-up)."""
    reads = GatedReads(store)
    waits = JobWaits(reads, store.changes, max_waiters=10)
    job_id = str(uuid.uuid4())
    await store.create_portal_job(
        placeholder_job(job_id, str(uuid.uuid4()), job_id, "bob"), now=time.time()
    )
    async with waits.hold(job_id, "bob") as hold:
        assert hold is not None
        waiting = asyncio.ensure_future(
            hold.until(lambda j: j is not None and j.cancel_requested, 30)
        )
        reads.close()
        assert await store.start_job_run(job_id, time.time(), 60.0) is not None  # wakes it
        await asyncio.wait_for(reads.held.wait(), 10)  # its read (RUNNING) is out
        _, outcome = await store.cancel_job(job_id, time.time(), "owner")
        assert outcome == "requested"
        reads.gate.set()  # the stale value comes back
        ending, now = await asyncio.wait_for(waiting, 10)
    assert ending == "changed"
    assert now is not None and now.cancel_requested


# The listener stays cut this long: several of the feed's reconnect backoffs (1, 2, 4, 8 s, each
# drawn from half to all of it), well past the bound a poll keeps (2 s).
LISTENER_DOWN_S = 14.0
# A poll a second serves a hold within 2 s; the rest is room for a busy machine.
POLLED_WITHIN_S = 5.0


async def holds_end_by_polling(client: Any, store: SqlStore, other: SqlStore) -> None:
    """For LISTENER_DOWN_S (and three holds at least): a hold on a new job, which `other`
    (another daemon's store) cancels; each hold ends within POLLED_WITHIN_S."""
    reads = Calls(store, "get_job")
    cut = time.monotonic()
    served = 0
    while time.monotonic() - cut < LISTENER_DOWN_S or served < 3:
        job_id, etag = await new_job(client)
        before = reads.count
        request = asyncio.ensure_future(held(client, job_id, 30, etag))
        await reads.reach(before + 1)  # held, past its own read
        started = time.monotonic()
        await other.cancel_job(job_id, time.time(), "admin")
        resp = await asyncio.wait_for(request, 15)
        elapsed = time.monotonic() - started
        assert resp.status == 200 and (await resp.json())["status"] == "CANCELLED"
        assert elapsed < POLLED_WITHIN_S, (served, elapsed)
        served += 1


@postgres_only  # LISTEN/NOTIFY; SQLite always polls
async def test_held_requests_are_served_by_polling_while_the_listener_stays_down(
    make_api: Api, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """The listening connection is cut and every reconnect refused for longer than the
    bound: meanwhile the poll ends each hold on another store's change, within two polls
    or so, however long the listener has been down."""
    client = await make_api()
    since = time.time()
    async with (
        feed_listening_through_a_proxy(store, db_url, tmp_path) as feed,
        another_store_on(db_url, tmp_path) as other,
    ):
        await listening(db_url, since=since)
        await feed.proxy.stop()
        await holds_end_by_polling(client, store, other)


@postgres_only  # LISTEN/NOTIFY; SQLite always polls
async def test_held_requests_are_served_while_the_listener_reconnects_into_silence(
    make_api: Api, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """The listening connection is lost and the network then goes silent: each reconnect
    is accepted and never answered, so it waits out its whole connect timeout (8 s here).
    The poll goes on meanwhile: each hold still ends within two polls or so."""
    client = await make_api()
    since = time.time()
    async with (
        feed_listening_through_a_proxy(store, db_url, tmp_path, connect_timeout_s=8.0) as feed,
        another_store_on(db_url, tmp_path) as other,
    ):
        await listening(db_url, since=since)
        feed.proxy.freeze()
        await feed.proxy.stop()  # the connection lost
        await feed.proxy.start()  # connects accepted, and silent
        await holds_end_by_polling(client, store, other)
