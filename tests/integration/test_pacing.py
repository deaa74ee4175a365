"""Cluster pacing in-process, on both backends (docs/pacing.md).

The pace table through `SqlStore` (slots, pauses, session leases), with a second
store on the same database standing in for another instance; then cluster-scope
claimers and the portal's `ClusterPortalPacing` against the fakes.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from testkit.fakes.ai import FakeAI

from outboxd.config import ClaimerSettings, SuwonScraperSettings
from outboxd.metrics import Metrics
from outboxd.storage.ports import PaceSlot, PaceStore
from outboxd.storage.store import SqlStore
from outboxd.workers.claimer import AI_PACE, Claimer
from outboxd.workers.pacing import PORTAL_PACE, ClusterPortalPacing, DbClock, late_limit
from tests.support.ai import classifier_for
from tests.support.db import raw_rows
from tests.support.ops import register_website
from tests.support.waits import consistently, eventually


def cluster_claimer(store: SqlStore, ai: FakeAI, **settings: Any) -> Claimer:
    base: dict[str, Any] = {
        "fixed_delay_s": 0.3,
        "retry_delay_s": 10.0,
        "processing_timeout_s": 30.0,
        "max_attempts": 3,
        "pace_scope": "cluster",
    }
    base.update(settings)
    return Claimer(store, classifier_for(ai), ClaimerSettings(**base), Metrics(), pace=store)


async def categories(store: SqlStore, domains: list[str]) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for d in domains:
        w = await store.get_website(d)
        out[d] = w.category if w is not None else None
    return out


# --- the pace table ---------------------------------------------------------------------------


@pytest.mark.real_clock  # another writer holds SQLite's write lock for a while
async def test_a_slot_is_decided_once_the_write_lock_is_held(
    store: SqlStore, backend: str, db_url: str
) -> None:
    """A caller that waited for the SQLite write lock gets a slot no earlier than the moment it
    got the lock: a slot stamped with the time it asked would let the next one start a delay
    after that stale time, closer than the delay to when this one really ran. (Postgres reads
    its own clock in the statement.) Real clock: the lock is held for a while on purpose."""
    await store.pace_ensure("lock")
    if backend != "sqlite":
        before = time.time()
        assert (await store.pace_take("lock", 0.4, time.time)).slot >= before - 1.0
        return
    blocker = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        blocker.execute("BEGIN IMMEDIATE")
        taking = asyncio.ensure_future(store.pace_take("lock", 0.4, time.time))
        await asyncio.sleep(0.5)  # the other writer's transaction, held on purpose
        released = time.time()
        blocker.execute("ROLLBACK")
        slot = await taking
    finally:
        blocker.close()
    assert slot.slot >= released


async def test_slots_are_handed_out_delay_apart_across_two_stores(
    store: SqlStore, other: SqlStore
) -> None:
    first = await store.pace_take("r", 0.5, time.time)
    assert first.wait_s == 0  # an unused pace starts now
    slots = await asyncio.gather(
        *(
            s.pace_take("r", 0.5, time.time)
            for s in itertools.islice(itertools.cycle([store, other]), 8)
        )
    )
    starts = sorted([first.slot, *(s.slot for s in slots)])
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(abs(g - 0.5) < 1e-6 for g in gaps), gaps
    state = await other.pace_state("r", time.time())
    assert state is not None
    assert state.last_at == starts[-1]
    assert abs(state.next_at - (starts[-1] + 0.5)) < 1e-6


async def test_a_pause_holds_every_later_slot_back(store: SqlStore, other: SqlStore) -> None:
    await store.pace_take("r", 0.1, time.time)
    state = await store.pace_pause("r", 2.0, time.time)
    assert 1.9 < state.paused_for_s <= 2.0
    seen = await other.pace_state("r", time.time())
    assert seen is not None and seen.paused_for_s > 1.8
    slot = await other.pace_take("r", 0.1, time.time)
    assert slot.slot >= state.paused_until
    assert 1.8 < slot.wait_s <= 2.0
    # A shorter pause never shortens the one in force.
    again = await other.pace_pause("r", 0.5, time.time)
    assert again.paused_until == state.paused_until


async def test_session_leases_hold_the_limit_expire_and_come_back(
    store: SqlStore, other: SqlStore
) -> None:
    await store.pace_ensure("p", 2)
    a = await store.lease_take("p", "a", 2, 30.0, time.time)
    b = await other.lease_take("p", "b", 2, 0.5, time.time)
    assert a is not None and b is not None and a.slot != b.slot
    assert await other.lease_take("p", "c", 2, 30.0, time.time) is None  # both sessions are held
    # The limit is the caller's: with max_concurrency = 1 the second row is never used.
    assert await store.lease_take("p", "c", 1, 30.0, time.time) is None
    states = {s.name: s for s in await store.pace_states(time.time())}
    assert states["p"].sessions == 2
    # b's holder dies: its lease ends by itself.
    c = await eventually(
        lambda: store.lease_take("p", "c", 2, 30.0, time.time),
        10,
        what="the expired lease to come back",
        interval=0.1,
    )
    assert c.slot == b.slot
    assert not await other.lease_release(b)  # no longer b's to give back
    assert not await other.lease_renew(b, 30.0, time.time)
    assert await store.lease_renew(a, 30.0, time.time)
    assert await store.lease_release(a)
    d = await other.lease_take("p", "d", 2, 30.0, time.time)
    assert d is not None and d.slot == a.slot


# --- cluster-scope claimers -------------------------------------------------------------------


async def run_claimers(claimers: list[Claimer], done: Any, deadline_s: float = 40.0) -> None:
    stop = asyncio.Event()
    tasks = [asyncio.create_task(c.run(stop)) for c in claimers]
    try:
        await eventually(done, deadline_s, what="the claimers to finish")
    finally:
        stop.set()
        await asyncio.wait_for(asyncio.gather(*tasks), 15)


@pytest.mark.real_clock  # idle for a while: no slot may be taken meanwhile
async def test_two_cluster_claimers_keep_one_pace_and_idle_ones_take_no_slot(
    store: SqlStore, other: SqlStore, ai: FakeAI
) -> None:
    delay = 0.3
    claimers = [cluster_claimer(db, ai, fixed_delay_s=delay) for db in (store, other)]
    # Idle: nothing to classify for a while. No slot may be taken.
    stop = asyncio.Event()
    idle = [asyncio.create_task(c.run(stop)) for c in claimers]

    async def no_slot_taken() -> bool:
        state = await store.pace_state(AI_PACE, time.time())
        assert state is None or state.last_at is None, state
        return True

    await consistently(no_slot_taken, 4 * delay, interval=0.1)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*idle), 10)
    await no_slot_taken()

    domains = [f"site{i}.example" for i in range(8)]
    for d in domains:
        await register_website(store, d)

    async def done() -> bool:
        return all(v is not None for v in (await categories(store, domains)).values())

    await run_claimers(claimers, done)
    starts = sorted(c.started_at_monotonic for c in ai.calls)
    assert sorted(c.domain for c in ai.calls) == sorted(domains)  # once each
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert min(gaps) >= 0.9 * delay, gaps
    for c in claimers:
        await c.classifier.close()


class LateOnce(DbClock):
    """The claimer's DbClock, with the process descheduled across its first slot: the event
    loop is blocked from just before that deadline until `late_s` after it."""

    def __init__(self, late_s: float) -> None:
        super().__init__()
        self.late_s = late_s
        self.deadlines: list[float] = []

    async def take(self, store: PaceStore, name: str, delay_s: float) -> tuple[PaceSlot, float]:
        slot, deadline = await super().take(store, name, delay_s)
        self.deadlines.append(deadline)
        if len(self.deadlines) == 1:
            # The loop's clock is time.monotonic, as the deadline's is.
            asyncio.get_running_loop().call_at(deadline - 0.01, time.sleep, self.late_s + 0.01)
        return slot, deadline


async def test_a_cluster_claimer_woken_late_skips_its_slot(store: SqlStore, ai: FakeAI) -> None:
    """Woken well after its slot (here 0.3 s: past the 5 % allowed, short of a whole
    fixed_delay_s), a cluster claimer does not call the provider then, which would crowd the
    next slot's holder: it takes the next slot and calls at that one."""
    delay = 1.0
    await register_website(store, "late.example")
    await store.pace_take(AI_PACE, delay, time.time)  # the claimer's slot is a delay ahead
    claimer = cluster_claimer(store, ai, fixed_delay_s=delay)
    late = LateOnce(0.3)
    claimer._db_clock = late
    try:
        assert await claimer.tick() == "completed"
    finally:
        await claimer.classifier.close()
    assert len(late.deadlines) == 2, "the late slot was used"
    assert len(ai.calls) == 1
    started = ai.calls[0].started_at_monotonic
    assert started >= late.deadlines[1] - 0.01
    assert late.deadlines[1] - late.deadlines[0] >= 0.99 * delay


async def test_a_429_pauses_both_cluster_claimers(
    store: SqlStore, other: SqlStore, ai: FakeAI
) -> None:
    delay = 0.2
    claimers = [cluster_claimer(db, ai, fixed_delay_s=delay) for db in (store, other)]
    domains = [f"r{i}.example" for i in range(4)]
    for d in domains:
        await register_website(store, d)
    ai.rate_limit_next_n(1, 2.0)

    async def done() -> bool:
        return all(v is not None for v in (await categories(store, domains)).values())

    await run_claimers(claimers, done)
    calls = sorted(ai.calls, key=lambda c: c.started_at_monotonic)
    assert calls[0].status == 429
    after = [c for c in calls[1:]]
    assert after, calls
    quiet = after[0].started_at_monotonic - calls[0].finished_at_monotonic
    assert quiet >= 1.9, f"a call {quiet:.2f}s after the 429"
    assert sorted(c.domain for c in calls if c.status == 200) == sorted(domains)
    for c in claimers:
        await c.classifier.close()


async def test_a_stop_while_waiting_for_a_slot_gives_the_row_back_unspent(
    store: SqlStore, other: SqlStore, ai: FakeAI
) -> None:
    # Another instance holds the next ten slots of 0.5 s: this one's slot is 5 s away.
    for _ in range(10):
        await other.pace_take(AI_PACE, 0.5, time.time)
    await register_website(store, "waiting.example")
    claimer = cluster_claimer(store, ai, fixed_delay_s=0.5)
    stop = asyncio.Event()
    task = asyncio.create_task(claimer.run(stop))

    async def claimed() -> bool:
        website = await store.get_website("waiting.example")
        return website is not None and website.work_status == "PROCESSING"

    await eventually(claimed, 10, what="the row to be claimed")
    stopped_at = time.monotonic()
    stop.set()
    await asyncio.wait_for(task, 10)
    assert time.monotonic() - stopped_at < 2.0  # the wait for the slot ends at once
    website = await store.get_website("waiting.example")
    assert website is not None
    assert (website.work_status, website.work_attempts) == ("PENDING", 0)
    assert ai.calls == []
    await claimer.classifier.close()


# --- the portal's cluster pacing --------------------------------------------------------------


async def test_portal_pacing_spaces_requests_and_limits_sessions_across_instances(
    store: SqlStore, other: SqlStore
) -> None:
    settings = SuwonScraperSettings(
        min_interval_s=0.1, max_concurrency=1, timeout_s=2.0, pace_scope="cluster"
    )
    pacings = [ClusterPortalPacing(store, settings), ClusterPortalPacing(other, settings)]
    inside = 0
    most = 0
    starts: list[float] = []

    async def job(p: ClusterPortalPacing) -> None:
        nonlocal inside, most
        async with p.session():
            inside += 1
            most = max(most, inside)
            for _ in range(3):
                await p.before_request()
                starts.append(time.monotonic())
            inside -= 1

    await asyncio.wait_for(asyncio.gather(*(job(pacings[i % 2]) for i in range(4))), 30)
    assert most == 1
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert len(starts) == 12 and min(gaps) >= 0.09, gaps
    states = {s.name: s for s in await store.pace_states(time.time())}
    assert states["suwon"].sessions == 0  # every session given back


@pytest.mark.real_clock  # a request that really starts late in its slot's window
async def test_a_portal_request_started_late_in_its_window_is_still_an_interval_from_the_next(
    store: SqlStore, other: SqlStore
) -> None:
    """One instance's cancel check takes most of the late window, the other's nothing: the
    requests still start (when before_request returns, the check done) `min_interval_s`
    apart, because slots are handed out the late window further apart."""
    interval = 0.4
    settings = SuwonScraperSettings(min_interval_s=interval, timeout_s=2.0, pace_scope="cluster")
    starts: list[float] = []

    def check(delay_s: float) -> Callable[[], Awaitable[None]]:
        async def slow() -> None:
            await asyncio.sleep(delay_s)

        return slow

    async def requests(p: ClusterPortalPacing, delay_s: float) -> None:
        for _ in range(3):
            await p.before_request(check(delay_s))
            # What the scraper does next is send: no await in between.
            starts.append(time.monotonic())

    late = late_limit(interval) * 0.75
    await asyncio.wait_for(
        asyncio.gather(
            requests(ClusterPortalPacing(store, settings), late),
            requests(ClusterPortalPacing(other, settings), 0.0),
        ),
        30,
    )
    starts.sort()
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    # Two estimates of the database clock (DbClock) are the only slack.
    assert len(starts) == 6 and min(gaps) >= interval - 0.005, gaps


@pytest.mark.real_clock  # a scrape that really outlives its session lease
async def test_a_portal_session_longer_than_its_lease_is_renewed_early_and_never_shared(
    store: SqlStore, other: SqlStore, db_url: str
) -> None:
    """A scrape that outlives its session lease keeps the session: the lease is renewed well
    before it would run out (never left to its last moment, where a slow renewal loses it),
    and another instance polling for a session meanwhile never gets one (max_concurrency 1),
    so the portal never sees more sessions than allowed."""
    settings = SuwonScraperSettings(max_concurrency=1, timeout_s=2.0, pace_scope="cluster")
    slow = ClusterPortalPacing(store, settings, holder="slow")
    # The scrape below lasts two leases; a lease long enough that a loaded machine's
    # scheduling delay (three test workers on two cores) stays well inside a third of it.
    slow.lease_s = 2.0
    margins: list[float] = []
    taken_by_other: list[int] = []

    async def never_taken_by_another() -> bool:
        """One look at the slow holder's lease, and another instance trying for one."""
        rows = await raw_rows(db_url, "SELECT expires_at FROM pace_leases WHERE holder = 'slow'")
        if rows:
            margins.append(float(rows[0]["expires_at"]) - time.time())
        lease = await other.lease_take(PORTAL_PACE, "other", 1, 30.0, time.time)
        if lease is not None:
            taken_by_other.append(lease.slot)
            await other.lease_release(lease)
        return not taken_by_other

    async with slow.session():
        with contextlib.suppress(AssertionError):  # said below, with what was taken
            await consistently(never_taken_by_another, 2 * slow.lease_s, interval=0.03)
    assert taken_by_other == [], "another instance took the session of a running scrape"
    assert len(margins) > 20
    # Renewed every third of the lease: at least about two thirds of it always remain.
    assert min(margins) > slow.lease_s / 3, sorted(margins)[:5]
    after = await other.lease_take(PORTAL_PACE, "other", 1, 30.0, time.time)
    assert after is not None  # given back at the end


# --- the operator's view ----------------------------------------------------------------------


async def test_metrics_admin_stats_and_status_show_the_pace(
    api: Any, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    from tests.support.ops import run_cli, write_config

    await store.pace_take(AI_PACE, 0.5, time.time)
    await store.pace_take(AI_PACE, 0.5, time.time)
    await store.pace_pause(AI_PACE, 30.0, time.time)
    await store.pace_ensure("suwon", 2)
    assert await store.lease_take("suwon", "someone", 2, 60.0, time.time) is not None
    ai_state = await store.pace_state(AI_PACE, time.time())
    assert ai_state is not None and ai_state.last_at is not None

    text = await (await api.get("/metrics")).text()
    gauges = {
        (s.name, s.labels.get("resource")): s.value
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name.startswith("outboxd_pace_")
    }
    assert gauges[("outboxd_pace_last_slot_timestamp_seconds", "ai")] == ai_state.last_at
    assert gauges[("outboxd_pace_next_slot_timestamp_seconds", "ai")] == ai_state.next_at
    assert gauges[("outboxd_pace_paused_until_timestamp_seconds", "ai")] == ai_state.paused_until
    assert gauges[("outboxd_pace_sessions", "suwon")] == 1
    assert gauges[("outboxd_pace_last_slot_timestamp_seconds", "suwon")] == 0  # no slot yet

    stats = await (await api.get("/v1/admin/stats")).json()
    ai_item = stats["pace"]["ai"]
    assert ai_item["lastSlotAt"] == ai_state.last_at
    assert 29 < ai_item["pausedForSeconds"] <= 30
    assert stats["pace"]["suwon"]["sessions"] == 1

    config = write_config(tmp_path, {"storage": {"url": db_url, "auto_migrate": False}})
    done = run_cli("status", "--json", "--config", str(config))
    assert done.returncode == 0, done.stderr
    status = json.loads(done.stdout)
    assert status["pace"]["ai"]["lastSlotAt"] == ai_state.last_at
    assert status["pace"]["ai"]["pausedUntil"] == ai_state.paused_until
    plain = run_cli("status", "--config", str(config))
    assert plain.returncode == 0, plain.stderr
    line = next(x for x in plain.stdout.splitlines() if x.startswith("pace ai"))
    assert "s more" in line and "next slot" in line, line
