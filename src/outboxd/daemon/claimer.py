"""The fixed-delay claimer: one work-outbox row per tick, per instance.

The pace toward the AI provider is set by construction: a tick claims at most
one row, calls the provider with no transaction or connection held, records
the outcome, then waits `fixed_delay_s` from the end of the tick. A 429 pauses
this instance for the provider's `Retry-After` without spending an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Literal

import structlog

from outboxd.config import ClaimerSettings
from outboxd.crashpoints import crash_point
from outboxd.observability import Metrics
from outboxd.scrapers.classifier import ClassificationError, Classifier, RateLimited
from outboxd.storage.ports import WebsiteStore

log = structlog.get_logger(__name__)

TickOutcome = Literal["idle", "completed", "skipped", "retry", "failed", "rate_limited", "lost"]


class Claimer:
    def __init__(
        self,
        store: WebsiteStore,
        classifier: Classifier,
        settings: ClaimerSettings,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._classifier = classifier
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        self._paused_until = 0.0
        self._last_tick_at: float | None = None
        self._next_tick_at: float | None = None

    async def run(self, stop: asyncio.Event) -> None:
        log.info("claimer_started", fixed_delay_s=self._settings.fixed_delay_s)
        while not stop.is_set():
            self._last_tick_at = self._clock()
            try:
                # Shielded: a shutdown lets the tick in flight record its
                # outcome rather than leave a PROCESSING row for the timeout.
                await asyncio.shield(self.tick())
            except Exception as exc:  # the loop outlives database and provider outages
                log.warning("claimer_tick_failed", error=exc)
            delay = max(self._settings.fixed_delay_s, self._paused_until - self._clock())
            self._next_tick_at = self._clock() + delay
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), delay)
        log.info("claimer_stopped")

    def pace(self) -> tuple[float | None, float | None, float | None]:
        """(last tick started, next tick due, paused until) for the console; None = not yet/not."""
        paused = self._paused_until if self._paused_until > self._clock() else None
        return self._last_tick_at, self._next_tick_at, paused

    async def tick(self) -> TickOutcome:
        row = await self._store.claim_work(
            self._clock(), self._settings.retry_delay_s, self._settings.processing_timeout_s
        )
        if row is None:
            return "idle"
        crash_point("during_claim")
        bind = {"work_id": row.id, "website_id": row.website_id, "attempt": row.attempt_count}
        if row.attempt_count > self._settings.max_attempts:
            # A row whose holders keep dying (a crash loop) must still end:
            # it was reclaimed after its last allowed attempt.
            await self._store.fail_work(
                row, "attempts exhausted (the last holder stopped answering)", True, self._clock()
            )
            log.warning("classification_failed", reason="stale_after_last_attempt", **bind)
            self._metrics.claims.labels("failed").inc()
            return "failed"
        website = await self._store.website_by_id(row.website_id)
        if website is None or website.category is not None:
            # Applied idempotently: a website that has its category is never
            # sent to the provider again.
            await self._store.complete_work(row, None, self._clock())
            self._metrics.claims.labels("skipped").inc()
            return "skipped"
        try:
            category = await self._classifier.classify(website.domain, website.favicon_url)
        except RateLimited as exc:
            self._paused_until = self._clock() + exc.retry_after_s
            await self._store.give_back_work(row)
            log.warning("claimer_rate_limited", retry_after_s=exc.retry_after_s, **bind)
            self._metrics.claims.labels("rate_limited").inc()
            return "rate_limited"
        except ClassificationError as exc:
            final = row.attempt_count >= self._settings.max_attempts
            await self._store.fail_work(row, exc.message, final, self._clock())
            log.warning(
                "classification_failed" if final else "classification_retry_scheduled",
                error=exc.message,
                domain=website.domain,
                **bind,
            )
            outcome: TickOutcome = "failed" if final else "retry"
            self._metrics.claims.labels(outcome).inc()
            return outcome
        crash_point("after_classify_before_complete")
        if not await self._store.complete_work(row, category, self._clock()):
            log.warning("classification_outcome_lost_race", **bind)
            self._metrics.claims.labels("lost").inc()
            return "lost"
        log.info("website_classified", domain=website.domain, category=category, **bind)
        self._metrics.claims.labels("completed").inc()
        return "completed"
