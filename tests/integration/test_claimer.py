"""The fixed-delay claimer in-process: `Claimer` + `OpenAIClassifier` against `FakeAI`
(docs/contract.md#the-fixed-delay-claimer).

Two kinds of test: `claimer.run(stop)` on the real clock, where the fake's call record
shows the pace; and `claimer.tick()` on a hand-driven clock, where the claim order,
attempt counting and guarded updates are checked row by row.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import pytest_asyncio
from testkit.fakes.ai import FakeAI

from outboxd.config import ClaimerSettings
from outboxd.metrics import Metrics
from outboxd.scrapers.classifier import OpenAIClassifier
from outboxd.storage.store import SqlStore
from outboxd.workers.claimer import Claimer
from tests.support.ai import AI_KEY, classifier_for
from tests.support.clock import Clock
from tests.support.db import raw_execute, raw_rows
from tests.support.ops import register_website
from tests.support.waits import eventually


@pytest_asyncio.fixture
async def classifier(ai: FakeAI) -> AsyncIterator[OpenAIClassifier]:
    client = classifier_for(ai)
    yield client
    await client.close()


MakeClaimer = Callable[..., Claimer]


@pytest.fixture
def make_claimer(store: SqlStore, classifier: OpenAIClassifier) -> MakeClaimer:
    def make(clock: Callable[[], float] = time.time, **settings: Any) -> Claimer:
        base: dict[str, Any] = {
            "fixed_delay_s": 0.2,
            "retry_delay_s": 10.0,
            "processing_timeout_s": 30.0,
            "max_attempts": 3,
        }
        base.update(settings)
        return Claimer(store, classifier, ClaimerSettings(**base), Metrics(), clock=clock)

    return make


async def work(db_url: str, domain: str) -> dict[str, Any]:
    """The work row of `domain` joined with its website's category."""
    sql = (
        "SELECT o.status, o.attempt_count, o.attempted_at, o.last_error, o.version, w.category"
        " FROM work_outbox o JOIN websites w ON w.id = o.website_id"
        f" WHERE w.domain = '{domain}'"
    )
    rows = await raw_rows(db_url, sql)
    assert rows, domain
    return rows[0]


def calls_per_domain(ai: FakeAI) -> dict[str, int]:
    out: dict[str, int] = {}
    for call in ai.calls:
        out[call.domain] = out.get(call.domain, 0) + 1
    return out


async def run_until(claimer: Claimer, done: Callable[[], Any], deadline_s: float = 20.0) -> None:
    """Run the claimer's own loop until `await done()` is true (bounded), then stop it."""
    stop = asyncio.Event()
    task = asyncio.create_task(claimer.run(stop))

    async def finished() -> bool:
        assert not task.done(), "the claimer loop ended by itself"
        return bool(await done())

    try:
        await eventually(finished, deadline_s, what="the claimer to finish")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


# --- the loop on the real clock --------------------------------------------------------------


async def test_each_website_is_classified_once_at_the_fixed_pace(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    expected = {
        "news.example": "news",
        "shop.example": "shopping",
        "school.example": "education",
        "bank.example": "finance",
        "portal.example": "government",
        "fun.example": "entertainment",
    }
    ai.categories_by_domain.update(expected)
    ai.delay_s = 0.02
    for domain in expected:
        await register_website(store, domain)
    claimer = make_claimer(fixed_delay_s=0.2)

    async def all_done() -> bool:
        rows = [await work(db_url, d) for d in expected]
        return all(r["status"] == "COMPLETED" for r in rows)

    await run_until(claimer, all_done)

    assert calls_per_domain(ai) == dict.fromkeys(expected, 1)
    for domain, category in expected.items():
        row = await work(db_url, domain)
        assert row["category"] == category
        assert row["status"] == "COMPLETED"
        assert row["attempt_count"] == 1
        assert row["last_error"] is None
    # One row per tick: never two calls at once, and each call starts at least
    # fixed_delay_s after the previous one ended (the delay runs from the tick's end).
    assert ai.in_flight_max == 1
    calls = sorted(ai.calls, key=lambda c: c.started_at_monotonic)
    gaps = [b.started_at_monotonic - a.finished_at_monotonic for a, b in itertools.pairwise(calls)]
    assert min(gaps) >= 0.2 - 0.01, gaps
    # Never-tried rows go in registration order.
    assert [c.domain for c in calls] == list(expected)


async def test_429_pauses_this_claimer_for_retry_after_without_spending_an_attempt(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    await register_website(store, "first.example", at=1.0)
    await register_website(store, "second.example", at=2.0)
    ai.rate_limit_next_n(1, retry_after_s=1.0)
    claimer = make_claimer(fixed_delay_s=0.05, retry_delay_s=0.5)

    async def both_done() -> bool:
        rows = [await work(db_url, d) for d in ("first.example", "second.example")]
        return all(r["status"] == "COMPLETED" for r in rows)

    await run_until(claimer, both_done)

    calls = sorted(ai.calls, key=lambda c: c.started_at_monotonic)
    assert (calls[0].domain, calls[0].status) == ("first.example", 429)
    assert sorted((c.domain, c.status) for c in calls[1:]) == [
        ("first.example", 200),
        ("second.example", 200),
    ]
    paused = calls[1].started_at_monotonic - calls[0].finished_at_monotonic
    assert paused >= 1.0 - 0.02, paused
    first = await work(db_url, "first.example")
    assert first["attempt_count"] == 1  # the 429 did not count
    assert first["category"] == "technology"


async def test_429_gives_the_row_back_with_its_attempt_count_unchanged(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    clock = Clock(100.0)
    claimer = make_claimer(clock)
    await register_website(store, "limited.example", at=1.0)

    ai.rate_limit_next_n(1, retry_after_s=30.0)
    assert await claimer.tick() == "rate_limited"
    row = await work(db_url, "limited.example")
    assert (row["status"], row["attempt_count"], row["attempted_at"]) == ("PENDING", 0, None)

    # A retry that meets a 429 keeps the one attempt it already spent.
    ai.fail_next_n(1)
    clock.now = 200.0
    assert await claimer.tick() == "retry"
    assert (await work(db_url, "limited.example"))["attempt_count"] == 1
    ai.rate_limit_next_n(1, retry_after_s=5.0)
    clock.now = 300.0
    assert await claimer.tick() == "rate_limited"
    row = await work(db_url, "limited.example")
    assert (row["status"], row["attempt_count"], row["category"]) == ("PENDING", 1, None)

    clock.now = 400.0
    assert await claimer.tick() == "completed"
    row = await work(db_url, "limited.example")
    assert (row["status"], row["attempt_count"]) == ("COMPLETED", 2)
    assert [c.status for c in ai.calls] == [429, 500, 429, 200]


# --- the claim order and the outcomes, on a hand-driven clock --------------------------------


async def test_claim_order_fresh_then_due_retries_then_stale_processing(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    clock = Clock(1000.0)
    claimer = make_claimer(clock, retry_delay_s=10.0, processing_timeout_s=30.0)
    for i, domain in enumerate(("a.example", "b.example", "c.example", "d.example"), start=1):
        await register_website(store, domain, at=float(i))

    async def tick_at(now: float) -> str:
        clock.now = now
        return await claimer.tick()

    ai.fail_next_n(1)
    assert await tick_at(10.0) == "retry"  # a: first registered, fails
    # b's holder claims it and dies (never completes): PROCESSING since t=11.
    dead = await store.claim_work(11.0, 10.0, 30.0)
    b = await store.get_website("b.example")
    assert dead is not None and b is not None and dead.website_id == b.id
    ai.fail_next_n(1)
    assert await tick_at(12.0) == "retry"  # c fails
    assert await tick_at(13.0) == "completed"  # d
    # a and c wait retry_delay_s; b is not stale before processing_timeout_s.
    assert await tick_at(15.0) == "idle"
    assert await tick_at(19.9) == "idle"  # a is due at 20, c at 22, b stale at 41
    assert [c.domain for c in ai.calls] == ["a.example", "c.example", "d.example"]

    await register_website(store, "e.example", at=50.0)
    outcomes = [await tick_at(t) for t in (60.0, 61.0, 62.0, 63.0, 64.0)]
    assert outcomes == ["completed"] * 4 + ["idle"]
    # Never tried first (e, though newest), then retries oldest attempt first (a, c),
    # then the stale PROCESSING row (b), although b's attempt is older than c's.
    assert [c.domain for c in ai.calls[3:]] == ["e.example", "a.example", "c.example", "b.example"]
    for domain, attempts in (("a", 2), ("b", 2), ("c", 2), ("d", 1), ("e", 1)):
        row = await work(db_url, f"{domain}.example")
        assert (row["status"], row["attempt_count"]) == ("COMPLETED", attempts), domain
        assert row["category"] == "technology"


async def test_retries_wait_retry_delay_and_stale_rows_wait_processing_timeout(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer
) -> None:
    clock = Clock(100.0)
    claimer = make_claimer(clock, retry_delay_s=10.0, processing_timeout_s=30.0)
    await register_website(store, "retry.example", at=1.0)
    await register_website(store, "stale.example", at=2.0)
    ai.fail_next_n(1)
    assert await claimer.tick() == "retry"
    assert await store.claim_work(101.0, 10.0, 30.0) is not None  # its holder dies

    for now, expected in ((109.9, "idle"), (110.0, "completed"), (130.9, "idle")):
        clock.now = now
        assert await claimer.tick() == expected, now
    clock.now = 131.0
    assert await claimer.tick() == "completed"
    assert calls_per_domain(ai) == {"retry.example": 2, "stale.example": 1}


async def test_a_provider_that_always_fails_ends_the_row_failed_after_max_attempts(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    clock = Clock(100.0)
    claimer = make_claimer(clock, retry_delay_s=10.0, max_attempts=3)
    await register_website(store, "down.example", at=1.0)
    ai.always_fail = True

    outcomes = []
    for now in (100.0, 110.0, 120.0, 130.0, 1000.0):
        clock.now = now
        outcomes.append(await claimer.tick())
    assert outcomes == ["retry", "retry", "failed", "idle", "idle"]
    row = await work(db_url, "down.example")
    assert (row["status"], row["attempt_count"], row["category"]) == ("FAILED", 3, None)
    assert "500" in row["last_error"]
    assert AI_KEY not in row["last_error"]
    assert calls_per_domain(ai) == {"down.example": 3}
    website = await store.get_website("down.example")
    assert website is not None
    assert (website.work_status, website.work_attempts) == ("FAILED", 3)
    assert website.work_last_error == row["last_error"]


async def test_failing_rows_go_to_the_back_while_newer_rows_are_served(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    """An answer outside the categories is a failed attempt; others keep flowing meanwhile."""
    clock = Clock(1000.0)
    claimer = make_claimer(clock, retry_delay_s=10.0, max_attempts=3)
    ai.categories_by_domain["odd.example"] = "weather"  # not a configured category
    ai.categories_by_domain["x.example"] = "weather"

    async def tick_at(now: float) -> str:
        clock.now = now
        return await claimer.tick()

    await register_website(store, "odd.example", at=1.0)
    assert await tick_at(10.0) == "retry"
    row = await work(db_url, "odd.example")
    assert (row["status"], row["attempt_count"], row["category"]) == ("PENDING", 1, None)
    assert "outside categories" in row["last_error"]
    assert row["attempted_at"] == 10.0

    await register_website(store, "new1.example", at=15.0)
    assert await tick_at(25.0) == "completed"  # odd is due, but new1 was never tried
    await register_website(store, "x.example", at=26.0)
    assert await tick_at(27.0) == "retry"  # x fresh, fails
    assert await tick_at(28.0) == "retry"  # odd, attempt 2: now behind x in the retry line
    await register_website(store, "new2.example", at=29.0)
    await register_website(store, "new3.example", at=30.0)
    assert await tick_at(40.0) == "completed"  # new2
    assert await tick_at(41.0) == "completed"  # new3
    assert await tick_at(42.0) == "retry"  # x (attempted 27) before odd (attempted 28)
    assert await tick_at(43.0) == "failed"  # odd, attempt 3 of 3
    assert [c.domain for c in ai.calls] == [
        "odd.example",
        "new1.example",
        "x.example",
        "odd.example",
        "new2.example",
        "new3.example",
        "x.example",
        "odd.example",
    ]
    odd = await work(db_url, "odd.example")
    assert (odd["status"], odd["attempt_count"], odd["category"]) == ("FAILED", 3, None)
    assert "weather" in odd["last_error"]
    for domain in ("new1.example", "new2.example", "new3.example"):
        assert (await work(db_url, domain))["category"] == "technology"


async def test_a_website_that_has_a_category_is_not_sent_to_the_provider(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    claimer = make_claimer(Clock(100.0))
    await register_website(store, "known.example", at=1.0)
    await raw_execute(
        db_url, "UPDATE websites SET category = 'news' WHERE domain = 'known.example'"
    )
    assert await claimer.tick() == "skipped"
    assert await claimer.tick() == "idle"
    assert ai.calls == []
    row = await work(db_url, "known.example")
    assert (row["status"], row["category"]) == ("COMPLETED", "news")


async def test_a_stale_holders_late_outcome_cannot_overwrite_the_new_holders(
    store: SqlStore,
    db_url: str,
) -> None:
    await register_website(store, "slow.example", at=1.0)
    stale = await store.claim_work(100.0, 10.0, 30.0)
    assert stale is not None and stale.status == "PROCESSING"

    # The holder is presumed dead; another claim takes the row over (version changes).
    fresh = await store.claim_work(200.0, 10.0, 30.0)
    assert fresh is not None and fresh.id == stale.id and fresh.version != stale.version

    # The old holder wakes up: none of its writes land while the new one holds the row.
    assert await store.complete_work(stale, "news", 201.0) is False
    assert await store.fail_work(stale, "late failure", True, 201.0) is False
    assert await store.give_back_work(stale) is False
    row = await work(db_url, "slow.example")
    assert (row["status"], row["category"], row["last_error"]) == ("PROCESSING", None, None)
    assert row["attempt_count"] == fresh.attempt_count

    # The new holder's outcome is applied, and the old one still cannot undo it.
    assert await store.complete_work(fresh, "finance", 202.0) is True
    assert await store.complete_work(stale, "news", 203.0) is False
    assert await store.fail_work(stale, "late failure", True, 203.0) is False
    row = await work(db_url, "slow.example")
    assert (row["status"], row["category"]) == ("COMPLETED", "finance")
    # The same holder cannot apply its outcome twice either.
    assert await store.complete_work(fresh, "news", 204.0) is False
    assert (await work(db_url, "slow.example"))["category"] == "finance"


async def test_a_claimer_whose_row_was_taken_over_reports_lost_and_changes_nothing(
    store: SqlStore, ai: FakeAI, make_claimer: MakeClaimer, db_url: str
) -> None:
    """The claimer's own path: its call ends after another instance reclaimed the row."""
    clock = Clock(100.0)
    claimer = make_claimer(clock, processing_timeout_s=1.0)
    await register_website(store, "race.example", at=1.0)
    ai.categories_by_domain["race.example"] = "news"
    ai.delay_s = 0.5
    tick = asyncio.create_task(claimer.tick())
    # The call is in flight; the row is PROCESSING since t=100.
    await eventually(lambda: ai.requests, 5, what="the call in flight")
    other = await store.claim_work(200.0, 10.0, 1.0)
    assert other is not None
    assert await tick == "lost"
    row = await work(db_url, "race.example")
    assert (row["status"], row["category"]) == ("PROCESSING", None)
    assert await store.complete_work(other, "finance", 201.0)
    assert (await work(db_url, "race.example"))["category"] == "finance"


async def test_concurrent_claims_never_hand_out_one_row_twice(store: SqlStore, db_url: str) -> None:
    """What lets several instances share the table: a row goes to exactly one claimer."""
    for i in range(10):
        await register_website(store, f"site{i}.example", at=float(i))
    for _ in range(3):
        claimed = await asyncio.gather(*(store.claim_work(100.0, 10.0, 30.0) for _ in range(15)))
        got = [row.id for row in claimed if row is not None]
        assert len(got) == len(set(got)), got
    rows = [await work(db_url, f"site{i}.example") for i in range(10)]
    assert all((r["status"], r["attempt_count"]) == ("PROCESSING", 1) for r in rows)
