"""Other processes hear of a job's change from the process that committed it, after the
commit and outside its transaction (storage/notifier.py); what they hear is not echoed."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outboxd.storage.changes import JobChanges
from outboxd.storage.notifier import heard as ids_heard
from outboxd.storage.notifier import payloads
from outboxd.storage.store import JOB_CHANNEL, SqlStore, open_store
from outboxd.workers.job_changes import JobChangeFeed
from tests.conftest import postgres_only
from tests.support.db import raw_rows
from tests.support.group_crash import portal_job
from tests.support.held import listening
from tests.support.waits import eventually


def test_only_this_process_commits_are_told_to_others() -> None:
    told: list[list[str]] = []
    woken: list[str] = []
    changes = JobChanges(told.append)
    changes.watch("a", woken.append)
    changes.committed(["a", None, "b"])
    changes.publish(["a"])  # a notification or a poll: heard, never told on
    assert told == [["a", "b"]]
    assert woken == ["a", "a"]


async def test_a_commit_notifies_each_changed_job_after_it(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """Postgres: a listener hears the job's intake and its cancel, one notification each,
    and a second store's feed that hears them tells no one again. SQLite has nothing to
    notify with: its store has no notifier and its feed polls."""
    if store.backend == "sqlite":
        assert store.notifier is None and store.listen_job_changes(lambda _: None) is None
        return
    heard: list[str] = []
    other_heard: list[str] = []
    listener = await asyncpg.connect(db_url)
    other = await open_store(db_url, tmp_path, 2, 2.0)
    other.changes.watch_any("test", other_heard.append)
    feed = JobChangeFeed(other, other.changes)
    stop = asyncio.Event()
    running = asyncio.create_task(feed.run(stop))
    try:
        await listener.add_listener(
            JOB_CHANNEL, lambda *args: heard.extend(ids_heard(args[3], own=""))
        )
        await listening(db_url, n=2)
        intake = await store.create_portal_job(portal_job("notify", 0), time.time())
        job_id = intake.job.id
        await store.cancel_job(job_id, time.time(), "admin")
        assert store.notifier is not None and other.notifier is not None
        await store.notifier.drain()
        # The other store's feed heard both; had it told on, its notifier would send now.
        await eventually(lambda: len(other_heard) >= 2, 5, what="the other store's feed")
        await other.notifier.drain()
        # A marker sent last: every notification sent before it has arrived with it.
        await listener.execute("SELECT pg_notify($1, 'marker')", JOB_CHANNEL)
        await eventually(lambda: len(heard) >= 3, 5, what="the notifications and the marker")
        assert heard == [job_id, job_id, "marker"], heard
    finally:
        stop.set()
        await running
        await other.close()
        await listener.close()


@postgres_only
async def test_no_write_transaction_notifies(store: SqlStore, db_url: str) -> None:
    """No trigger on the events table: a notifying transaction holds a cluster-wide lock
    until its commit is flushed, which made every job write wait for the others' flushes."""
    triggers = await raw_rows(
        db_url,
        "SELECT tgname FROM pg_trigger WHERE NOT tgisinternal"
        " AND tgrelid IN ('job_events'::regclass, 'jobs'::regclass, 'relay_outbox'::regclass)",
    )
    assert triggers == []


@postgres_only
@pytest.mark.real_clock  # commits spread over real time, a few milliseconds apart
async def test_commits_in_quick_succession_share_notify_statements(
    store: SqlStore, db_url: str
) -> None:
    """One statement at once, and the ids that follow it gather a moment: forty commits
    2 ms apart (longer than a round trip here, so without the pause each would have a
    statement of its own) are told in a handful of statements, every id once, in order."""
    assert store.notifier is not None
    heard: list[str] = []
    statements = 0
    read = store.db.read

    async def counted_read(body: Any) -> Any:  # the real database, counted
        nonlocal statements
        statements += 1
        return await read(body)

    listener = await asyncpg.connect(db_url)
    try:
        await listener.add_listener(
            JOB_CHANNEL, lambda *args: heard.extend(ids_heard(args[3], own=""))
        )
        store.db.read = counted_read  # type: ignore[method-assign]
        ids = [f"job-{i}" for i in range(40)]
        for job_id in ids:
            store.notifier([job_id])
            await asyncio.sleep(0.002)  # the next request's commit
        await store.notifier.drain()
        await listener.execute("SELECT pg_notify($1, 'marker')", JOB_CHANNEL)
        await eventually(lambda: "marker" in heard, 5, what="the notifications and the marker")
        assert heard == [*ids, "marker"]
        assert 1 <= statements <= 15, statements
    finally:
        store.db.read = read  # type: ignore[method-assign]
        await listener.close()


def test_a_notification_names_its_sender_and_up_to_200_ids() -> None:
    """Postgres delivers every notification to every listener, this process's included:
    one per 200 ids, not one per id, and the sender's own listener skips it."""
    ids = [f"{i:036d}" for i in range(450)]
    notes = payloads("me", ids)
    assert [len(n.split(" ")) - 1 for n in notes] == [200, 200, 50]
    assert all(len(n.encode()) < 8000 for n in notes)
    assert [j for n in notes for j in ids_heard(n, own="other")] == ids
    assert [j for n in notes for j in ids_heard(n, own="me")] == []
    assert ids_heard("one-job-id", own="me") == ["one-job-id"]  # an older daemon's payload


@postgres_only
async def test_a_process_skips_its_own_notifications(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """Each process's listener hears the other's commits, never its own (those woke its
    holds already, at the commit)."""
    other = await open_store(db_url, tmp_path, 2, 2.0)
    mine: list[str] = []
    theirs: list[str] = []
    since = time.time() - 1
    mine_cm, theirs_cm = (
        store.listen_job_changes(mine.append),
        other.listen_job_changes(theirs.append),
    )
    assert mine_cm is not None and theirs_cm is not None
    try:
        async with mine_cm, theirs_cm:
            await listening(db_url, n=2, since=since)
            job_id = (await store.create_portal_job(portal_job("own", 0), time.time())).job.id
            assert store.notifier is not None
            await store.notifier.drain()
            await eventually(lambda: theirs == [job_id], 5, what="the other process hearing it")
            # Sent last, from the other process: what this one hears arrives in order.
            other_id = (await other.create_portal_job(portal_job("own", 1), time.time())).job.id
            assert other.notifier is not None
            await other.notifier.drain()
            await eventually(lambda: mine == [other_id], 5, what="this process hearing the other")
    finally:
        await other.close()
