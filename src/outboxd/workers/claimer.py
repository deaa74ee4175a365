"""The fixed-delay claimer: one work-outbox row per tick, per instance.

The pace toward the AI provider is set by construction: a tick claims at most
one row, calls the provider with no transaction or connection held, records
the outcome, then waits `fixed_delay_s` from the end of the tick. A 429 pauses
this instance for the provider's `Retry-After` without spending an attempt.

With `pace_scope = "cluster"` the pace is the database's instead (docs/pacing.md):
a tick that holds a row takes the next slot of the shared "ai" pace row, sleeps
until it, and calls then; a 429 pauses the pace row, so every instance waits.
A slot is only ever taken while holding a row, so idle instances spend none.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import structlog

from outboxd.config import ClaimerSettings
from outboxd.crashpoints import crash_point
from outboxd.errors import OutboxdError, StorageError
from outboxd.metrics import Metrics
from outboxd.scrapers.classifier import (
    ClassificationError,
    Classifier,
    ProviderUnavailable,
    RateLimited,
)
from outboxd.services.breakers import PROBE, Breaker
from outboxd.services.retries import classification_gives_up
from outboxd.storage.ports import PaceStore
from outboxd.storage.website_ports import WebsiteStore, WorkRow
from outboxd.workers.loops import LoopFailures, sleep_or_stop
from outboxd.workers.pacing import DbClock, late_limit, spacing

log = structlog.get_logger(__name__)

TickOutcome = Literal[
    "idle",
    "completed",
    "skipped",
    "retry",
    "failed",
    "rate_limited",
    "lost",
    "paused",
    "stopped",
    "waiting",
]
# The resource name of the provider's pace row (`pace` table, /metrics, status).
AI_PACE = "ai"


@dataclass(eq=False, repr=False)
class Claimer:
    store: WebsiteStore
    classifier: Classifier
    settings: ClaimerSettings
    metrics: Metrics
    clock: Callable[[], float] = time.time
    # Cluster scope: the shared pace row; None (always, with instance scope) keeps this
    # instance's own pace.
    pace: PaceStore | None = None
    # The AI provider's breaker (services/breakers.py): while it is not up no row is
    # claimed, but the cluster's one probe; an outage failure then spends no attempt.
    breaker: Breaker | None = None
    instance: str = "claimer"
    _paused_until: float = field(default=0.0, init=False)
    _db_clock: DbClock = field(default_factory=DbClock, init=False)
    _last_tick_at: float | None = field(default=None, init=False)
    _next_tick_at: float | None = field(default=None, init=False)
    _failures: LoopFailures = field(
        default_factory=lambda: LoopFailures("claimer", "claimer_tick_failed"), init=False
    )

    def __post_init__(self) -> None:
        if self.settings.pace_scope != "cluster":
            self.pace = None
        elif self.pace is None:
            raise ValueError("claimer.pace_scope = 'cluster' needs a PaceStore")

    async def run(self, stop: asyncio.Event) -> None:
        log.info(
            "claimer_started",
            fixed_delay_s=self.settings.fixed_delay_s,
            pace_scope=self.settings.pace_scope,
        )
        while not stop.is_set():
            outcome: TickOutcome | None = None
            self._last_tick_at = self.clock()
            failed_delay = 0.0
            try:
                # Shielded: a shutdown lets the tick in flight record its
                # outcome rather than leave a PROCESSING row for the timeout.
                outcome = await asyncio.shield(self.tick(stop))
                self.metrics.claimer_last_tick.set_to_current_time()
                self._failures.ok()
            except Exception as exc:  # the loop outlives database and provider outages
                failed_delay = self._failures.failed(exc)
            delay = max(
                self.settings.fixed_delay_s, failed_delay, self._paused_until - self.clock()
            )
            if self.pace is not None and outcome not in (None, "idle"):
                # The shared slots space the calls: the next tick claims a row
                # at once and queues for its slot, so the pace has no holes.
                delay = max(0.0, self._paused_until - self.clock())
            self._next_tick_at = self.clock() + delay
            await sleep_or_stop(stop, delay)
        log.info("claimer_stopped")

    def timing(self) -> tuple[float | None, float | None, float | None]:
        """(last tick started, next tick due, paused until) for the console; None = not yet/not."""
        paused = self._paused_until if self._paused_until > self.clock() else None
        return self._last_tick_at, self._next_tick_at, paused

    async def tick(self, stop: asyncio.Event | None = None) -> TickOutcome:
        probe = False
        if self.breaker is not None and self.breaker.waiting() is not None:
            if not await self._probe_turn():
                return "waiting"
            probe = True
        if self.pace is not None:
            state = await self.pace.pace_state(AI_PACE, time.time())
            if state is not None and state.paused_for_s > 0:
                # Every instance sees the pause: claim nothing until it ends.
                self._paused_until = self.clock() + state.paused_for_s
                return "paused"
        row = await self.store.claim_work(
            self.clock(), self.settings.retry_delay_s, self.settings.processing_timeout_s
        )
        if row is None:
            return "idle"
        crash_point("during_claim")
        bind = {"work_id": row.id, "website_id": row.website_id, "attempt": row.attempt_count}
        if row.attempt_count > self.settings.max_attempts:
            # A row whose holders keep dying (a crash loop) must still end:
            # it was reclaimed after its last allowed attempt.
            await self.store.fail_work(
                row, "attempts exhausted (the last holder stopped answering)", True, self.clock()
            )
            log.warning("classification_failed", reason="stale_after_last_attempt", **bind)
            self.metrics.claims.labels("failed").inc()
            return "failed"
        website = await self.store.website_by_id(row.website_id)
        if website is None or website.category is not None:
            # Applied idempotently: a website that has its category is never
            # sent to the provider again.
            await self.store.complete_work(row, None, self.clock())
            self.metrics.claims.labels("skipped").inc()
            return "skipped"
        if self.pace is not None:
            waited = await self._wait_for_slot(stop)
            if waited != "go":
                # Stopping, or a 429 paused the pace while this row waited:
                # the row goes back unspent, its slot goes unused.
                await self.store.give_back_work(row)
                self.metrics.claims.labels(waited).inc()
                return waited
        # The pace's moment on the wall clock, comparable across instances on one host.
        called_at = time.time()
        try:
            category = await self.classifier.classify(website.domain, website.favicon_url)
        except (RateLimited, ProviderUnavailable) as exc:
            # The row's outcome first, then the breaker is told (a shutdown may cut the
            # tick short after it: the row is settled either way).
            outcome = await self._no_answer(row, exc, probe, website.domain, bind)
            await self._tell_breaker(exc, probe)
            return outcome
        except ClassificationError as exc:
            outcome = await self._failed(row, exc, website.domain, bind)
            await self._tell_breaker(None, probe)
            return outcome
        crash_point("after_classify_before_complete")
        if not await self.store.complete_work(row, category, self.clock()):
            log.warning("classification_outcome_lost_race", **bind)
            self.metrics.claims.labels("lost").inc()
            return "lost"
        log.info(
            "website_classified",
            domain=website.domain,
            category=category,
            called_at=round(called_at, 6),
            **bind,
        )
        self.metrics.claims.labels("completed").inc()
        await self._tell_breaker(None, probe)
        return "completed"

    async def _failed(
        self, row: WorkRow, exc: ClassificationError, domain: str, bind: dict[str, Any]
    ) -> TickOutcome:
        final = classification_gives_up(row.attempt_count, self.settings.max_attempts)
        await self.store.fail_work(row, exc.message, final, self.clock())
        log.warning(
            "classification_failed" if final else "classification_retry_scheduled",
            error=exc.message,
            domain=domain,
            **bind,
        )
        outcome: TickOutcome = "failed" if final else "retry"
        self.metrics.claims.labels(outcome).inc()
        return outcome

    async def _probe_turn(self) -> bool:
        """While the provider is not up: whether this tick is the cluster's one probe."""
        assert self.breaker is not None
        admitted = await self.breaker.admit(self.instance)
        if admitted is None or admitted == PROBE:
            return True
        if admitted.state != "down":
            return False
        return await self.breaker.take_probe(self.instance, self._probe_hold_s()) is not None

    def _probe_hold_s(self) -> float:
        assert self.breaker is not None
        return self.breaker.settings.probe_s + self.settings.processing_timeout_s

    async def _no_answer(
        self,
        row: WorkRow,
        exc: RateLimited | ProviderUnavailable,
        probe: bool,
        domain: str,
        bind: dict[str, Any],
    ) -> TickOutcome:
        """A call that got no answer (a 5xx, a timeout, a 429): while the provider is away
        (this was the probe, or its breaker is open) the row waits, unspent; else a 5xx
        spends its attempt and a 429 pauses for Retry-After, as always."""
        if probe or (self.breaker is not None and self.breaker.waiting() is not None):
            await self.store.give_back_work(row)
            log.debug("classification_waiting", **bind)
            self.metrics.claims.labels("waiting").inc()
            return "waiting"
        if isinstance(exc, ProviderUnavailable):
            return await self._failed(row, exc, domain, bind)
        self._paused_until = self.clock() + exc.retry_after_s
        if self.pace is not None:
            state = await self.pace.pace_pause(AI_PACE, exc.retry_after_s, time.time)
            self._paused_until = self.clock() + state.paused_for_s
        await self.store.give_back_work(row)
        log.warning("claimer_rate_limited", retry_after_s=exc.retry_after_s, **bind)
        self.metrics.claims.labels("rate_limited").inc()
        return "rate_limited"

    async def _tell_breaker(self, outage: OutboxdError | None, probe: bool) -> None:
        """An outage failure counted, or an answer (which resets the count); a database
        that does not answer loses the tally, not the tick."""
        if self.breaker is None:
            return
        with contextlib.suppress(StorageError):
            if outage is None:
                await self.breaker.through()
            else:
                await self.breaker.outage(str(outage), self.instance if probe else None)

    async def _wait_for_slot(
        self, stop: asyncio.Event | None
    ) -> Literal["go", "paused", "stopped"]:
        """Take the next shared slot and sleep until it (cluster scope only).

        The slot is a time on the database's clock, turned into a deadline on
        this host's monotonic clock through `DbClock`. The pause is looked at
        shortly before the slot, so the call itself starts on a plain timer.
        """
        assert self.pace is not None
        delay_s = self.settings.fixed_delay_s
        lead_s = min(_PAUSE_CHECK_LEAD_S, delay_s / 4)
        while True:
            # Slots `spacing` apart: a call started anywhere in its window is `delay_s` from
            # the next (workers/pacing.py).
            _slot, deadline = await self._db_clock.take(self.pace, AI_PACE, spacing(delay_s))
            if await _sleep_or_stop(stop, deadline - lead_s - time.monotonic()):
                return "stopped"
            state = await self.pace.pace_state(AI_PACE, time.time())
            if state is not None and state.paused_for_s > 0:
                self._paused_until = self.clock() + state.paused_for_s
                return "paused"
            if await _sleep_or_stop(stop, deadline - time.monotonic()):
                return "stopped"
            late_s = time.monotonic() - deadline
            if late_s <= late_limit(delay_s):
                return "go"
            # Woken too late (a descheduled process): calling now would start
            # within fixed_delay_s of the next slot's holder. Skip this slot.
            log.info("claimer_slot_missed", late_ms=round(late_s * 1000))


# How long before its slot a cluster claimer looks whether a 429 paused the pace.
_PAUSE_CHECK_LEAD_S = 0.1


async def _sleep_or_stop(stop: asyncio.Event | None, delay_s: float) -> bool:
    """`sleep_or_stop` that also serves a tick run without a stop Event; True when stopping."""
    if stop is None:
        await asyncio.sleep(max(0.0, delay_s))
        return False
    if delay_s > 0:
        await sleep_or_stop(stop, delay_s)
    return stop.is_set()
