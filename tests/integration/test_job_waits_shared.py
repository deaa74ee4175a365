"""What ten thousand held requests on one job share (docs/decisions/0038-held-waits-cost-little.md),
on both backends with the real store: the holds entering together share one read, a read
already out is never shared with a hold that entered after it started, the deadlines of
many holds share the wheel's timers and end on time, and a wait given up (its client gone)
leaves nothing behind. The HTTP side of held requests is in test_job_waits.py.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from outboxd.services.job_waits import TICK_S, JobWaits
from outboxd.storage.store import SqlStore
from tests.integration.test_job_waits import GatedReads
from tests.support.ops import placeholder_job
from tests.support.waits import Calls, eventually


async def a_job(store: SqlStore) -> str:
    job_id = str(uuid.uuid4())
    await store.create_portal_job(
        placeholder_job(job_id, str(uuid.uuid4()), job_id, "bob"), now=time.time()
    )
    return job_id


async def test_holds_entering_together_share_one_read(store: SqlStore) -> None:
    reads = Calls(store, "get_job")
    waits = JobWaits(store, store.changes, max_waiters=100)
    job_id = await a_job(store)
    holds = [waits.hold(job_id, "bob") for _ in range(50)]
    assert all(h.enter() for h in holds)  # in one turn of the loop
    try:
        values = await asyncio.wait_for(asyncio.gather(*(h.current() for h in holds)), 10)
    finally:
        for h in holds:
            h.release()
    assert reads.count == 1
    assert {v.id for v in values if v is not None} == {job_id} and len(values) == 50
    assert waits.held == 0 and store.changes.watched() == []


async def test_a_read_already_out_is_not_shared_with_a_later_hold(store: SqlStore) -> None:
    """The first hold's read has read the job (QUEUED) and is still out when the job is
    cancelled; a hold entering after that must not take the stale value: it reads anew."""
    gated = GatedReads(store)
    reads = Calls(gated, "get_job")
    waits = JobWaits(gated, store.changes, max_waiters=10)
    job_id = await a_job(store)
    first, second = waits.hold(job_id, "bob"), waits.hold(job_id, "bob")
    assert first.enter()
    try:
        gated.close()
        early = asyncio.ensure_future(first.current())
        await asyncio.wait_for(gated.held.wait(), 10)  # its read is out, with QUEUED
        await store.cancel_job(job_id, time.time(), "owner")
        assert second.enter()
        late = asyncio.ensure_future(second.current())
        gated.gate.set()
        seen_early, seen_late = await asyncio.wait_for(asyncio.gather(early, late), 10)
    finally:
        first.release()
        second.release()
    assert seen_early is not None and seen_early.status == "QUEUED"
    assert seen_late is not None and seen_late.status == "CANCELLED"
    assert reads.count == 2


async def test_many_deadlines_share_the_wheel_and_end_on_time(store: SqlStore) -> None:
    waits = JobWaits(store, store.changes, max_waiters=500)
    job_id = await a_job(store)
    holds = [waits.hold(job_id, "bob") for _ in range(300)]
    assert all(h.enter() for h in holds)
    try:
        started = time.monotonic()
        futures = [h.wait(lambda j: j is None, 0.3) for h in holds]
        # Three hundred deadlines within a few milliseconds of each other: a timer or two.
        assert 1 <= waits.deadlines <= 2
        endings = await asyncio.wait_for(asyncio.gather(*futures), 10)
        took = time.monotonic() - started
    finally:
        for h in holds:
            h.release()
    assert set(endings) == {"timeout"}
    assert 0.3 <= took < 0.3 + TICK_S + 1.0  # a busy machine's loop may run late, not early
    assert waits.deadlines == 0 and waits.held == 0


async def test_a_wait_given_up_leaves_nothing_behind(store: SqlStore) -> None:
    """The request's task is cancelled (its client went away, aiohttp cancels the handler):
    its hold, its deadline and the job's watch go with it; the other hold waits on and is
    woken by the change."""
    waits = JobWaits(store, store.changes, max_waiters=10)
    job_id = await a_job(store)

    async def one() -> str:
        hold = waits.hold(job_id, "bob")
        assert hold.enter()
        try:
            await hold.current()
            return await hold.wait(lambda j: j is not None and j.status == "CANCELLED", 30)
        finally:
            hold.release()

    gone, stays = asyncio.ensure_future(one()), asyncio.ensure_future(one())
    await eventually(lambda: waits.deadlines == 1 and waits.held == 2, what="both waiting")
    gone.cancel()
    await asyncio.gather(gone, return_exceptions=True)
    assert waits.held == 1 and waits.deadlines == 1 and store.changes.watched() == [job_id]
    await store.cancel_job(job_id, time.time(), "owner")
    assert await asyncio.wait_for(stays, 10) == "changed"
    assert waits.held == 0 and waits.deadlines == 0 and store.changes.watched() == []
