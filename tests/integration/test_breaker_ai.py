"""The AI provider's bad days (docs/contract.md#outside-systems-bad-days), on both
backends: its 500s open the breaker after `open_after` calls in a row and from then on
no row spends an attempt or ends FAILED; while down one call at a time probes it, a probe
interval apart; when it answers every row is classified; a pause stops every call."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import AsyncIterator
from typing import Any

import pytest_asyncio
from testkit.fakes.ai import FakeAI

from outboxd.config import BreakerSettings, ClaimerSettings
from outboxd.metrics import Metrics
from outboxd.scrapers.classifier import OpenAIClassifier
from outboxd.services.breakers import Breaker
from outboxd.storage.store import SqlStore
from outboxd.workers.claimer import Claimer
from tests.support.ai import classifier_for
from tests.support.db import raw_rows
from tests.support.ops import register_website
from tests.support.waits import eventually

DOMAINS = [f"site{n}.example" for n in range(6)]


@pytest_asyncio.fixture
async def classifier(ai: FakeAI) -> AsyncIterator[OpenAIClassifier]:
    client = classifier_for(ai)
    yield client
    await client.close()


def _claimer(store: SqlStore, classifier: OpenAIClassifier, breaker: Breaker) -> Claimer:
    settings = ClaimerSettings(
        fixed_delay_s=0.05, retry_delay_s=0.2, processing_timeout_s=30.0, max_attempts=3
    )
    return Claimer(store, classifier, settings, Metrics(), breaker=breaker, instance="i1")


async def _rows(db_url: str) -> list[dict[str, Any]]:
    return await raw_rows(db_url, "SELECT status, attempt_count FROM work_outbox ORDER BY id")


async def _run(claimer: Claimer, until: Any, deadline_s: float = 30.0) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(claimer.run(stop))
    try:
        await eventually(until, deadline_s, what="the claimer to get there")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def test_an_ai_outage_spends_no_attempt_and_every_row_is_classified_after_it(
    store: SqlStore, ai: FakeAI, classifier: OpenAIClassifier, db_url: str
) -> None:
    for d in DOMAINS:
        await register_website(store, d)
    breaker = Breaker("ai", BreakerSettings(open_after=2, probe_s=0.5), (), store)
    claimer = _claimer(store, classifier, breaker)
    ai.always_fail = True

    async def down_and_probed() -> bool:
        return breaker.row.down_since is not None and len(ai.calls) >= 5

    await _run(claimer, down_and_probed)
    rows = await _rows(db_url)
    assert all(r["status"] == "PENDING" for r in rows), rows
    # Only the calls up to the one that opened the breaker counted (a row's outcome is
    # written before the breaker is told); no probe did.
    assert sum(r["attempt_count"] for r in rows) == 2, rows
    # While down, one call a probe interval: the calls after the first two are spaced.
    starts = [c.started_at_monotonic for c in ai.calls[2:]]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert all(g >= 0.45 for g in gaps), gaps
    ai.always_fail = False

    async def all_done() -> bool:
        return all(r["status"] == "COMPLETED" for r in await _rows(db_url))

    await _run(claimer, all_done)
    assert breaker.row.down_since is None


async def test_a_429_storm_opens_the_ai_breaker_too(
    store: SqlStore, ai: FakeAI, classifier: OpenAIClassifier, db_url: str
) -> None:
    await register_website(store, DOMAINS[0])
    breaker = Breaker("ai", BreakerSettings(open_after=2, probe_s=30), (), store)
    claimer = _claimer(store, classifier, breaker)
    ai.rate_limit_next_n(100, retry_after_s=0)
    for _ in range(4):
        await claimer.tick()
    assert breaker.row.down_since is not None
    calls = len(ai.calls)
    assert await claimer.tick() == "waiting" and len(ai.calls) == calls
    rows = await _rows(db_url)
    assert rows[0]["status"] == "PENDING" and rows[0]["attempt_count"] == 0


async def test_a_paused_ai_is_not_called(
    store: SqlStore, ai: FakeAI, classifier: OpenAIClassifier, db_url: str
) -> None:
    await register_website(store, DOMAINS[0])
    breaker = Breaker("ai", BreakerSettings(), (), store)
    await store.pause_dependency("ai", "provider migration", None, "ops", 0.0)
    await breaker.look()
    claimer = _claimer(store, classifier, breaker)
    for _ in range(3):
        assert await claimer.tick() == "waiting"
    assert ai.calls == []
    await store.resume_dependency("ai", 1.0)
    await breaker.look()
    assert await claimer.tick() == "completed"
