"""Waiting instead of polling on the views of many jobs: GET /v1/admin/jobs and
GET /v1/admin/stats with ETag, If-None-Match and Prefer: wait, in-process on both backends.
They share the job waits' machinery (services/job_waits.py): any job's change, made in
this process or by another store on the database, ends a hold whose answer it alters;
holds of one listing share their reads; api.max_waiters bounds job and view holds
together; the stop Event answers them at once; a held listing holds no connection.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from outboxd.storage.store import SqlStore
from tests.conftest import postgres_only
from tests.support.held import (
    Api,
    Client,
    another_store,
    another_store_on,
    feed_listening_through_a_proxy,
    held,
    listening,
    new_job,
    until_held,
)
from tests.support.waits import Calls, eventually

JOBS = "/v1/admin/jobs"


async def held_view(client: Client, path: str, etag: str, wait: int = 30, **params: str) -> Any:
    return await client.get(
        path, params=params, headers={"Prefer": f"wait={wait}", "If-None-Match": etag}
    )


async def test_a_listing_has_an_etag_and_a_new_job_ends_its_wait(make_api: Api) -> None:
    client = await make_api()
    await new_job(client)
    first = await client.get(JOBS)
    etag = first.headers["ETag"]
    assert first.status == 200 and etag.startswith('"') and len(etag) == 26
    assert "Preference-Applied" not in first.headers
    same = await client.get(JOBS, headers={"If-None-Match": etag})
    assert (same.status, same.headers["ETag"], await same.read()) == (304, etag, b"")
    # No If-None-Match: a wait means nothing for a listing, it answers at once.
    quick = await asyncio.wait_for(client.get(JOBS, headers={"Prefer": "wait=30"}), 5)
    assert quick.status == 200 and "Preference-Applied" not in quick.headers

    request = asyncio.ensure_future(held_view(client, JOBS, etag))
    await until_held(client, 1)
    job_id, _ = await new_job(client)  # this process's intake
    resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200 and resp.headers["Preference-Applied"] == "wait=30"
    assert resp.headers["ETag"] != etag
    body = await resp.json()
    assert body["items"][0]["jobId"] == job_id and body["items"][0]["user"] == "local"
    # Unchanged since: 304 once the (short) wait is over, with the same tag.
    again = await held_view(client, JOBS, resp.headers["ETag"], wait=1)
    assert (again.status, again.headers["ETag"]) == (304, resp.headers["ETag"])
    assert again.headers["Preference-Applied"] == "wait=1"
    # A tag that is not the current one answers at once.
    stale = await asyncio.wait_for(held_view(client, JOBS, '"stale"'), 5)
    assert stale.status == 200 and stale.headers["Preference-Applied"] == "wait=30"


async def test_a_change_that_leaves_the_page_as_it_was_does_not_end_the_wait(
    make_api: Api, store: SqlStore
) -> None:
    client = await make_api()
    page = await client.get(JOBS, params={"status": "CANCELLED"})
    assert (await page.json())["items"] == []
    etag = page.headers["ETag"]
    reads = Calls(store, "list_jobs")
    request = asyncio.ensure_future(held_view(client, JOBS, etag, status="CANCELLED"))
    await reads.reach(1)  # the request's own read
    job_id, _ = await new_job(client)  # QUEUED: not on this page
    # Past the view's settle the page was read again, unchanged: the hold holds on. Had
    # the change ended it, the answer below would be the empty page.
    await reads.reach(2)
    assert not request.done()
    await store.cancel_job(job_id, time.time(), "admin")
    resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200
    assert [i["jobId"] for i in (await resp.json())["items"]] == [job_id]


async def test_holds_of_one_listing_share_their_reads(make_api: Api, store: SqlStore) -> None:
    client = await make_api()
    await new_job(client)
    etag = (await client.get(JOBS, params={"limit": "5"})).headers["ETag"]
    reads = Calls(store, "list_jobs")
    requests = [asyncio.ensure_future(held_view(client, JOBS, etag, limit="5")) for _ in range(10)]
    await until_held(client, 10)
    await reads.reach(10)
    own_reads = reads.count  # each request's read before its wait
    for _ in range(5):  # a burst of changes
        await new_job(client)
    for resp in await asyncio.wait_for(asyncio.gather(*requests), 10):
        assert resp.status == 200
    # Ten holds, five changes: a few reads for all of them, not one per hold and change.
    assert own_reads == 10 and reads.count - own_reads <= 3, (own_reads, reads.count)


async def test_stats_answer_a_weak_etag_and_wait_for_a_job(make_api: Api) -> None:
    client = await make_api()
    first = await client.get("/v1/admin/stats")
    etag = first.headers["ETag"]
    assert first.status == 200 and etag.startswith('W/"')
    assert (await client.get("/v1/admin/stats", headers={"If-None-Match": etag})).status == 304
    timed_out = await held_view(client, "/v1/admin/stats", etag, wait=1)
    assert (timed_out.status, timed_out.headers["ETag"]) == (304, etag)
    request = asyncio.ensure_future(held_view(client, "/v1/admin/stats", etag))
    await until_held(client, 1)
    await new_job(client)
    resp = await asyncio.wait_for(request, 10)
    assert resp.status == 200 and resp.headers["ETag"] != etag
    assert (await resp.json())["tables"]["jobs"] == {"QUEUED": 1}


async def test_another_store_on_the_database_ends_a_held_listing(
    make_api: Api, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """Another daemon's change reaches this one only through the feed: a notification on
    Postgres, the poll of the newest event on SQLite."""
    client = await make_api()
    async with another_store(store, db_url, tmp_path, poll_s=0.2) as other:
        job_id, _ = await new_job(client)
        if store.backend == "postgres":
            await listening(db_url)
        etag = (await client.get(JOBS)).headers["ETag"]
        reads = Calls(store, "list_jobs")
        request = asyncio.ensure_future(held_view(client, JOBS, etag))
        await reads.reach(1)  # the request's own read
        if store.backend == "sqlite":
            # The first poll with the listing held wakes it (nothing new): read, the hold stays.
            await reads.reach(2)
        assert not request.done()
        await other.cancel_job(job_id, time.time(), "admin")
        resp = await asyncio.wait_for(request, 15)
        assert resp.status == 200
        assert (await resp.json())["items"][0]["status"] == "CANCELLED"


async def test_job_and_view_holds_share_max_waiters_and_the_stop_answers_them(
    make_api: Api,
) -> None:
    client = await make_api(max_waiters=2)
    job_id, job_etag = await new_job(client)
    etag = (await client.get(JOBS)).headers["ETag"]
    on_job = asyncio.ensure_future(held(client, job_id, 30, job_etag))
    on_list = asyncio.ensure_future(held_view(client, JOBS, etag))
    await until_held(client, 2)
    extra = await asyncio.wait_for(held_view(client, JOBS, etag), 5)
    assert extra.status == 304 and "Preference-Applied" not in extra.headers
    client.stop.set()
    job_resp, list_resp = await asyncio.wait_for(asyncio.gather(on_job, on_list), 5)
    assert job_resp.status == 200 and list_resp.status == 200
    assert (await list_resp.json())["items"][0]["jobId"] == job_id


async def test_a_held_listing_holds_no_database_connection(make_api: Api, store: SqlStore) -> None:
    """As a held job request: on Postgres every pooled connection idle, on SQLite the one
    reader and the one writer free for others."""
    client = await make_api()
    await new_job(client)
    etag = (await client.get(JOBS)).headers["ETag"]
    reads = Calls(store, "list_jobs")
    requests = [asyncio.ensure_future(held_view(client, JOBS, etag)) for _ in range(20)]
    await reads.reach(20)  # a hold registers before its read: let the reads end
    if store.backend == "postgres":
        pool = store.db._pool  # type: ignore[attr-defined]
        await eventually(
            lambda: pool.get_idle_size() == pool.get_size(), what="every pooled connection idle"
        )
    assert (await asyncio.wait_for(client.get(JOBS), 5)).status == 200  # a read
    assert not any(r.done() for r in requests)
    await asyncio.wait_for(new_job(client), 5)  # a write
    for resp in await asyncio.wait_for(asyncio.gather(*requests), 10):
        assert resp.status == 200


@postgres_only  # LISTEN/NOTIFY; SQLite always polls
async def test_a_listener_reconnect_wakes_a_held_listing(
    make_api: Api, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """Notifications sent while the listener was down are lost: once it listens again, it
    wakes every held request, a held listing as well as held jobs; the listing reads again
    and ends on the change made meanwhile. (The feed here polls once per reconnect attempt
    only, so the reconnect alone can tell the listing.)"""
    client = await make_api()
    since = time.time()
    async with (
        feed_listening_through_a_proxy(store, db_url, tmp_path, poll_s=3600) as feed,
        another_store_on(db_url, tmp_path) as other,
    ):
        job_id, _ = await new_job(client)
        await listening(db_url, since=since)
        etag = (await client.get(JOBS)).headers["ETag"]
        lists = Calls(store, "list_jobs")
        request = asyncio.ensure_future(held_view(client, JOBS, etag))
        await lists.reach(1)  # the request's own read
        polls = Calls(feed.reads, "newest_job_event")
        await feed.proxy.stop()
        # Refused twice: after its third poll the feed waits 2-4 s before its next attempt.
        await polls.reach(3)
        await other.cancel_job(job_id, time.time(), "admin")  # notified to nobody
        await feed.proxy.start()  # the next attempt listens again
        resp = await asyncio.wait_for(request, 20)
        assert resp.status == 200
        assert (await resp.json())["items"][0]["status"] == "CANCELLED"
