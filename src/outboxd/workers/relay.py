"""The relay: publishes relay-outbox rows to SQS, now (for a request) and in a loop.

Its two jobs live apart and share one send path (workers/publishing.py): the
synchronous dispatch of the rows requests just committed (workers/dispatch.py), and
the loop here, which picks up every row still due (new rows whose synchronous publish
did not happen, backed-off rows, rows whose holder died) and claims its next round
while the current one is sent. `Relay` wires the two and is what the daemon runs.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog

from outboxd.config import RelaySettings
from outboxd.errors import StorageError
from outboxd.metrics import Metrics
from outboxd.queue.sqs import BatchResult
from outboxd.services.breakers import Breaker
from outboxd.storage.ports import RelayRow
from outboxd.tracing import NO_TRACING, Tracing
from outboxd.workers.dispatch import DISPATCH_BATCHES_IN_FLIGHT, DISPATCH_MAX_WAIT_S, Dispatch
from outboxd.workers.loops import LoopFailures, backoff, sleep_or_stop
from outboxd.workers.publishing import Publisher, Publishing, RelayStoreWithTasks

log = structlog.get_logger(__name__)

# Rounds one relay pass may chain (each claim overlapping the previous round's sends)
# before the loop looks at its stop event again.
ROUNDS_PER_PASS = 10
# The longest the loop waits between passes while SQS cannot be reached: how soon after
# SQS returns the backlog starts to go out, unless a request's publish sees it first.
SQS_PAUSE_CAP_S = 30.0


@dataclass(frozen=True)
class RelayShape:
    """How the relay loop runs on one backend: `relay_once` in `lanes` side by side, each
    round `batches_per_round` SendMessageBatch calls (`Relay.relay_pass`)."""

    lanes: int
    batches_per_round: int


def relay_shape(backend: str) -> RelayShape:
    """The relay loop's lanes and round size on `backend`
    (docs/decisions/0005-relay-rounds.md).

    On Postgres a pass waits mostly on its round statement, and claims skip each other's
    rows (SKIP LOCKED): while one lane sends, the other keeps the database busy. A third
    lane sent a little more to an instant SQS but held so many calls at a slow one that
    they passed relay.publish_timeout_s and were published again
    (docs/decisions/0020-tried-and-dropped.md).

    SQLite has one writer, and the statements of a second lane would only queue behind
    it. There the writer thread is the limit, and each round's transaction costs a commit
    (an fsync) and a hop to that thread however many rows it records, so a round is twice
    as large, the size that sent the most. Its 20 calls at once are what two Postgres
    lanes make.
    """
    if backend == "postgres":
        return RelayShape(lanes=2, batches_per_round=10)
    return RelayShape(lanes=1, batches_per_round=20)


# A round the loop sent: its rows and what SQS answered for each.
_Round = tuple[Sequence[RelayRow], BatchResult]


class RelayLoop:
    """Claims due rows a round at a time, in `lanes` side by side, and publishes them."""

    def __init__(
        self,
        send: Publishing,
        lanes: int,
        batches_per_round: int,
        stop: asyncio.Event | None = None,
    ) -> None:
        self._send = send
        self._lanes = lanes
        self._batches_per_round = batches_per_round
        self._stop = stop
        self._failures = LoopFailures("relay", "relay_iteration_failed")
        self._sqs_pauses = 0
        # SQS's breaker (services/breakers.py): its state told what the loop sees, and while
        # an operator paused it nothing is published.
        self.breaker: Breaker | None = None

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    async def run(self, stop: asyncio.Event) -> None:
        log.info("relay_started", interval_s=self._send.settings.interval_s)
        interval = self._send.settings.interval_s
        while not stop.is_set():
            if self.breaker is not None and self.breaker.chosen_off():
                await sleep_or_stop(stop, interval)
                continue
            try:
                n = await self.relay_pass()
            except Exception as exc:  # the loop must survive a database outage
                await self._failures.pause(stop, exc)
                continue
            self._failures.ok()
            await self._tell_breaker()
            if self._send.sqs_outage.down:
                # SQS could not be reached: no row spent an attempt on it, and the loop
                # tries again later and later (up to SQS_PAUSE_CAP_S) while it lasts, or
                # at once when a request's publish finds SQS back.
                self._sqs_pauses += 1
                self._send.sqs_back.clear()
                await sleep_or_stop(
                    stop,
                    backoff(self._sqs_pauses, interval, SQS_PAUSE_CAP_S, jitter=False),
                    self._send.sqs_back,
                )
                continue
            self._sqs_pauses = 0
            if n >= self._round_rows():
                continue  # a full round: there may be more due right now
            await sleep_or_stop(stop, interval)
        log.info("relay_stopped")

    async def _tell_breaker(self) -> None:
        if self.breaker is None:
            return
        with contextlib.suppress(StorageError):
            if self._send.sqs_outage.down:
                await self.breaker.outage("SQS did not answer (see sqs_unavailable)")
            else:
                await self.breaker.through()

    async def relay_pass(self) -> int:
        """`relay_once` in each lane at once; how many rows they claimed in all. Every
        lane runs to its end before this returns (or raises a lane's first error)."""
        if self._lanes == 1:
            return await self.relay_once()
        done = await asyncio.gather(
            *(self.relay_once() for _ in range(self._lanes)), return_exceptions=True
        )
        for d in done:
            if isinstance(d, BaseException):
                raise d
        return sum(d for d in done if isinstance(d, int))

    async def relay_once(self) -> int:
        """Claim and publish due rows, a round at a time; returns how many were claimed.

        A round is up to `batches_per_round` SendMessageBatch calls made at once, so
        one transaction serves up to a hundred messages instead of ten. While a round
        is at SQS, one transaction on the database thread records the previous round's
        outcome and claims the next round (up to ROUNDS_PER_PASS rounds): the commit
        leaves the send path, and a pass of n full rounds commits n + 2 times, not
        2n. Every row this pass claimed is published and recorded before it returns.
        """
        rows = await self._claim_due()
        total = 0
        rounds = 0
        unrecorded: _Round | None = None  # the round sent last, its outcome not yet stored
        db: asyncio.Future[list[RelayRow]] | None = None
        try:
            while rows:
                total += len(rows)
                rounds += 1
                more = (
                    len(rows) >= self._round_rows()
                    and rounds < ROUNDS_PER_PASS
                    and not self._stopping()
                    and not self._send.sqs_outage.down
                )
                db = self._send.in_background(self._record_then_claim(unrecorded, more))
                unrecorded = None
                result = await self._send.send_all(rows)
                unrecorded = (rows, result)
                rows = await asyncio.shield(db)
                db = None
        finally:
            # Sending failed or was cancelled: the rows the transaction claims wait out
            # their lease, but the outcome it records, and this round's, still count.
            if db is not None:
                await asyncio.shield(db)
            if unrecorded is not None:
                await asyncio.shield(self._send.in_background(self._record_then_claim(unrecorded)))
        return total

    async def _record_then_claim(self, sent: _Round | None, claim: bool = False) -> list[RelayRow]:
        """Store a sent round's outcome and claim the next round, in one transaction."""
        ok, failures = self._send.outcome(*sent) if sent is not None else ([], [])
        marked, claimed = await self._send.store.record_relay_outcome_and_claim_due(
            ok, failures, self._send.clock(), self._round_rows() if claim else 0, self._send.lease_s
        )
        self._send.report(marked, failures)
        return claimed

    async def _claim_due(self) -> list[RelayRow]:
        return await self._send.store.claim_relay_due(
            self._send.clock(), self._round_rows(), self._send.lease_s
        )

    def _round_rows(self) -> int:
        """The rows a round claims: `batches_per_round` batches, fewer while the send window
        is narrower than the lanes' rounds. A lane claims no more than its share of the
        window sends at once, so a claimed row does not queue for a slot while its lease
        runs."""
        share = max(1, self._send.window.limit // self._lanes)
        return self._send.settings.batch_size * min(self._batches_per_round, share)


class Relay:
    """The relay as the daemon runs it: the dispatch the API calls and the loop, sharing
    one send path and so one send window."""

    def __init__(
        self,
        store: RelayStoreWithTasks,
        publisher: Publisher,
        settings: RelaySettings,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        batches_per_round: int = 10,
        stop: asyncio.Event | None = None,
        dispatch_batches_in_flight: int = DISPATCH_BATCHES_IN_FLIGHT,
        dispatch_max_wait_s: float = DISPATCH_MAX_WAIT_S,
        lanes: int = 1,
        tracing: Tracing = NO_TRACING,
    ) -> None:
        lanes = max(1, lanes)
        batches_per_round = max(1, batches_per_round)
        in_flight = max(1, dispatch_batches_in_flight)
        self._send = Publishing(
            store,
            publisher,
            settings,
            metrics,
            clock,
            lanes * batches_per_round + in_flight,
            tracing,
        )
        self._dispatch = Dispatch(self._send, stop, in_flight, dispatch_max_wait_s)
        self._loop = RelayLoop(self._send, lanes, batches_per_round, stop)
        self._held: Callable[[], bool] = _never

    def use_breaker(self, breaker: Breaker) -> None:
        """SQS's breaker: the loop tells it what it sees, and while an operator paused SQS
        nothing is published, on the request or in the loop (rows wait in the outbox,
        unspent, and go out once it is resumed)."""
        self._held = breaker.chosen_off
        self._loop.breaker = breaker

    @classmethod
    def shaped(
        cls,
        backend: str,
        store: RelayStoreWithTasks,
        publisher: Publisher,
        settings: RelaySettings,
        metrics: Metrics,
        stop: asyncio.Event | None = None,
        tracing: Tracing = NO_TRACING,
    ) -> Relay:
        """The relay in the lanes and rounds the daemon runs on `backend` (`relay_shape`)."""
        shape = relay_shape(backend)
        return cls(
            store,
            publisher,
            settings,
            metrics,
            stop=stop,
            lanes=shape.lanes,
            batches_per_round=shape.batches_per_round,
            tracing=tracing,
        )

    # ------------------------------------------------------------ for the API (Dispatcher)

    async def publish_now(self, outbox_id: str) -> bool:
        if self._held():
            return False
        return await self._dispatch.publish_now(outbox_id)

    async def dispatch(self, outbox_id: str, claimed: RelayRow | None = None) -> RelayRow | None:
        if self._held():
            return None
        return await self._dispatch.dispatch(outbox_id, claimed)

    def intake_claim_until(self, now: float) -> float | None:
        if self._held():
            return None
        return self._dispatch.intake_claim_until(now)

    # ------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event) -> None:
        await self._loop.run(stop)

    async def relay_pass(self) -> int:
        return await self._loop.relay_pass()

    async def relay_once(self) -> int:
        return await self._loop.relay_once()

    async def drain(self, timeout_s: float) -> None:
        """At shutdown: wait for sends still at SQS to record their outcome."""
        await self._send.drain(timeout_s)


def _never() -> bool:
    return False
