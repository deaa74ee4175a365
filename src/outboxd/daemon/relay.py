"""The relay: publishes relay-outbox rows to SQS, now (for a request) and in a loop.

A row is claimed with a lease (`claimed_until`) in a short transaction, published
with no transaction open, then marked SENT (only the `Successful` entries, with
their MessageId) or backed off. A crash between publish and SENT leaves the
lease to expire and the row to be published again: delivery is at least once,
and the consumer's effects are idempotent.

Requests do not publish one message each: concurrent `publish_now` calls are
coalesced into shared SendMessageBatch calls (docs/architecture.md, "Coalesced
dispatch"), and the loop claims its next round while the current one is sent.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import structlog

from outboxd.config import RelaySettings
from outboxd.crashpoints import crash_point
from outboxd.daemon.loops import backoff, sleep_or_stop
from outboxd.daemon.send_window import SendWindow
from outboxd.observability import Metrics, log_info
from outboxd.queue import messages
from outboxd.queue.sqs import (
    MAX_BATCH_ENTRIES,
    BatchResult,
    OutgoingMessage,
    QueueError,
    QueueKind,
)
from outboxd.storage.ports import RelayFailure, RelayRow, RelayStore, TaskStore

log = structlog.get_logger(__name__)

# Coalesced batches in flight at once. Full batches leave at once while fewer than this
# are out. A partial batch leaves when no other batch is out: a request that finds
# batches out waits for them to return (or for its own batch to fill) and leaves with
# every request that arrived meanwhile, so the busier the API, the fuller the batches.
# When nothing is out a request does not wait at all (it leaves at the end of the event
# loop's turn): a lone request adds no delay.
DISPATCH_BATCHES_IN_FLIGHT = 4
# The longest a partial batch waits for the batches out before it leaves beside them:
# with a slow SQS (tens of milliseconds a call) waiting out a whole call would add that
# much to a request's answer.
DISPATCH_MAX_WAIT_S = 0.010
# Rounds one relay pass may chain (each claim overlapping the previous round's sends)
# before the loop looks at its stop event again.
ROUNDS_PER_PASS = 10


@dataclass(frozen=True)
class RelayShape:
    """How the relay loop runs on one backend: `relay_once` in `lanes` side by side, each
    round `batches_per_round` SendMessageBatch calls (`Relay.relay_pass`)."""

    lanes: int
    batches_per_round: int


def relay_shape(backend: str) -> RelayShape:
    """The relay loop's lanes and round size on `backend` (docs/architecture.md, "The relay
    loop").

    On Postgres a pass waits mostly on its round statement, and claims skip each other's
    rows (SKIP LOCKED): while one lane sends, the other keeps the database busy. Three
    lanes sent 10-20% more than two against the bench's instant stub, but a slow SQS then
    holds up to 30 calls at once: against moto, whose answers slow with the calls it
    holds, calls passed relay.publish_timeout_s, their rows were published again, and
    the relay fell to 61 msg/s with 1,582 rows left backing off, where two lanes sent 99
    with 80 (capping three lanes at 20 calls did not help: they kept all 20 out).

    SQLite has one writer, and the statements of a second lane would only queue behind
    it. There the writer thread is the limit, and each round's transaction costs a commit
    (an fsync) and a hop to that thread however many rows it records, so a round is twice
    as large: 200 rows sent 14,059-14,306 msg/s where 100 sent 11,797-12,298 (300 and
    400: 13,409-13,649). Its 20 calls at once are what two Postgres lanes make (against
    moto: 98 msg/s, 20 rows left backing off).
    """
    if backend == "postgres":
        return RelayShape(lanes=2, batches_per_round=10)
    return RelayShape(lanes=1, batches_per_round=20)


class Publisher(Protocol):
    async def send_batch(
        self, kind: QueueKind, messages: Sequence[OutgoingMessage]
    ) -> BatchResult: ...


class RelayStoreWithTasks(RelayStore, TaskStore, Protocol):
    pass


def message_body(row: RelayRow) -> str:
    """Ids only: the consumer reads everything else (credentials included) from the database."""
    if row.kind == "job":
        return messages.encode_job(row.job_id or "", row.id)
    return messages.encode_task(row.task_id or "", row.id)


# A request's outcome: its row as marked SENT, False when not (the row stays for the
# loop), None when the row was not ours to publish (SENT already, or another holder's lease).
_Outcome = RelayRow | Literal[False] | None
# The request's outbox id, its row when the intake inserted it claimed, and its future.
_Waiter = tuple[str, RelayRow | None, "asyncio.Future[_Outcome]"]
# A round the loop sent: its rows and what SQS answered for each.
_Round = tuple[Sequence[RelayRow], BatchResult]


class Relay:
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
    ) -> None:
        self._store = store
        self._lanes = max(1, lanes)
        self._batches_per_round = max(1, batches_per_round)
        self._publisher = publisher
        self._settings = settings
        self._metrics = metrics
        self._clock = clock
        # Long enough that a slow but successful publish is marked SENT by its
        # own holder before anyone else may take the row: the publish itself is cut
        # at publish_timeout_s, the rest is a few short transactions. Not longer: it
        # is also how long a row published by a process that then died waits to go
        # out again. Should a holder overrun it anyway, the worst case is a second
        # copy of the message (the consumer drops it); the version guard refuses
        # the stale holder's SENT.
        self._lease_s = max(2.0, settings.publish_timeout_s * 5)
        # Coalesced dispatch: requests waiting for a batch, and the batches out.
        self._stop = stop
        self._dispatch_size = min(settings.batch_size, MAX_BATCH_ENTRIES)
        self._max_in_flight = max(1, dispatch_batches_in_flight)
        self._max_wait_s = dispatch_max_wait_s
        self._waiting: list[_Waiter] = []
        self._open: set[asyncio.Future[_Outcome]] = set()
        self._in_flight = 0
        self._timer: asyncio.Handle | None = None
        self._tasks: set[asyncio.Future[Any]] = set()
        self._stop_watch: asyncio.Future[None] | None = None
        # The SendMessageBatch calls out at once, the loop's and the requests' together:
        # as many as the lanes' rounds and the dispatch batches make while SQS answers
        # in time, fewer once it slows (a call slower than a quarter of the publish
        # timeout is one that would soon pass it).
        self._window = SendWindow(
            self._lanes * self._batches_per_round + self._max_in_flight,
            settings.publish_timeout_s / 4,
            on_change=self._window_changed,
        )
        self._narrowed = False
        metrics.send_window.set(self._window.limit)

    # ------------------------------------------------------------ publish_now

    async def publish_now(self, outbox_id: str) -> bool:
        """Publish one row for the request that created it; True when it is SENT.

        The row joins the next coalesced batch. True only once SQS acknowledged this
        row's own entry and the row is marked SENT; False when that entry failed, or
        the daemon is stopping (the row then stays for the relay loop).
        """
        return await self.dispatch(outbox_id) is not None

    def intake_claim_until(self, now: float) -> float | None:
        """The lease a request's intake gives its new outbox row, so that `dispatch` needs
        no claim transaction; None while stopping (the row is then left to the loop)."""
        return None if self._stopping() else now + self._lease_s

    async def dispatch(self, outbox_id: str, claimed: RelayRow | None = None) -> RelayRow | None:
        """`publish_now` with the row as it was committed SENT (None when it is not SENT),
        so the request can answer from what its batch wrote instead of reading it back.

        `claimed`: the row as the request's own intake inserted it, claimed with
        `intake_claim_until`; it is published without claiming it again.
        """
        crash_point("after_commit_before_publish")
        if self._stopping():
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_Outcome] = loop.create_future()
        self._waiting.append((outbox_id, claimed, fut))
        self._open.add(fut)
        fut.add_done_callback(self._open.discard)
        self._watch_stop()
        self._schedule(loop)
        try:
            outcome = await fut
        except asyncio.CancelledError:
            self._forget(fut)
            raise
        if outcome is None:
            # SENT already, or another holder has it: most often the relay loop, which
            # can claim the row between the request's commit and this call.
            return await self._outcome_of_other_holder(outbox_id)
        return outcome or None

    async def drain(self, timeout_s: float) -> None:
        """At shutdown, before the store closes: wait (at most `timeout_s`) for coalesced
        batches still at SQS to record their outcome, so a message that went out is not
        left looking unsent for a lease and published again after a restart."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _watch_stop(self) -> None:
        """Once per relay: when the stop event is set, every request still waiting is
        answered "not dispatched" at once, whatever its batch is doing."""
        if self._stop is not None and self._stop_watch is None:
            self._stop_watch = asyncio.ensure_future(self._release_on_stop(self._stop))

    async def _release_on_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._waiting.clear()
        for fut in list(self._open):
            if not fut.done():
                fut.set_result(False)

    def _forget(self, fut: asyncio.Future[_Outcome]) -> None:
        self._waiting = [w for w in self._waiting if w[2] is not fut]

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if len(self._waiting) >= self._dispatch_size:
            self._flush()  # a full batch leaves now if a slot is free
        elif self._in_flight == 0 and self._timer is None:
            # Nothing is out: no one is about to return with company for this request.
            # It leaves at the end of this turn of the loop, with the requests that
            # became ready in the same turn.
            self._timer = loop.call_soon(self._timer_over)
        self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        # A batch is out: the waiting requests leave when it returns, with a batch that
        # fills up before then, or after DISPATCH_MAX_WAIT_S, whichever comes first.
        if self._waiting and self._timer is None:
            self._timer = loop.call_later(self._max_wait_s, self._timer_over)

    def _timer_over(self) -> None:
        self._timer = None
        self._flush(partial=True)

    def _flush(self, partial: bool = False) -> None:
        """Start batches from the waiting requests while fewer than the bound are out:
        full ones, and a partial one when no other batch is out (or `partial`)."""
        while self._waiting and self._in_flight < self._max_in_flight:
            if len(self._waiting) < self._dispatch_size and self._in_flight > 0 and not partial:
                break
            batch = self._waiting[: self._dispatch_size]
            del self._waiting[: self._dispatch_size]
            self._in_flight += 1
            task = asyncio.ensure_future(self._dispatch(batch))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        if not self._waiting and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm(asyncio.get_running_loop())

    async def _dispatch(self, batch: list[_Waiter]) -> None:
        """One coalesced batch: claim the rows its intakes did not claim already in one
        transaction, send them in one SendMessageBatch, record the outcome in one, and
        answer each request with its own entry's outcome."""
        try:
            # A lease taken at intake that is still good (it runs for seconds, a request
            # gets here within milliseconds) is ours; otherwise the row is claimed now.
            now = self._clock()
            rows = [c for _, c, _ in batch if c is not None and (c.claimed_until or 0) > now]
            held = {r.id for r in rows}
            unclaimed = [oid for oid, _, _ in batch if oid not in held]
            if unclaimed:
                rows += await self._store.claim_relay_rows(unclaimed, now, self._lease_s)
            claimed = {r.id for r in rows}
            sent = {r.id: r for r in await self._publish(rows)} if rows else {}
            for oid, _, fut in batch:
                if not fut.done():
                    fut.set_result(sent.get(oid, False) if oid in claimed else None)
        except Exception as exc:  # a database failure: each request sees it
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        finally:
            for _, _, fut in batch:
                if not fut.done():  # the batch was cancelled: nobody may hang on it
                    fut.set_result(False)
            self._in_flight -= 1
            if self._waiting:
                self._flush()

    async def _outcome_of_other_holder(self, outbox_id: str) -> RelayRow | None:
        """The row once it is SENT. Waits for a holder that is publishing it now (at
        most one publish timeout, plus a second for the holder to record the outcome),
        so the request's answer, and `api.require_dispatch`, reflect that publish
        rather than a moment in the middle of it."""
        deadline = time.monotonic() + self._settings.publish_timeout_s + 1.0
        while True:
            row = await self._store.get_relay_row(outbox_id)
            if row is None or row.status == "SENT":
                return row
            in_flight = row.claimed_until is not None and row.claimed_until > self._clock()
            if not in_flight or time.monotonic() >= deadline or self._stopping():
                return None
            await asyncio.sleep(0.05)

    # ------------------------------------------------------------ the loop

    async def run(self, stop: asyncio.Event) -> None:
        log.info("relay_started", interval_s=self._settings.interval_s)
        while not stop.is_set():
            try:
                n = await self.relay_pass()
            except Exception as exc:  # the loop must survive a database or SQS outage
                log.warning("relay_iteration_failed", error=exc)
                n = 0
            if n >= self._round_rows():
                continue  # a full round: there may be more due right now
            await sleep_or_stop(stop, self._settings.interval_s)
        log.info("relay_stopped")

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
                )
                db = self._in_background(self._record_then_claim(unrecorded, more))
                unrecorded = None
                result = await self._send_all(rows)
                unrecorded = (rows, result)
                rows = await asyncio.shield(db)
                db = None
        finally:
            # Sending failed or was cancelled: the rows the transaction claims wait out
            # their lease, but the outcome it records, and this round's, still count.
            if db is not None:
                await asyncio.shield(db)
            if unrecorded is not None:
                await asyncio.shield(self._in_background(self._record_then_claim(unrecorded)))
        return total

    def _in_background(self, work: Awaitable[list[RelayRow]]) -> asyncio.Future[list[RelayRow]]:
        """A task of its own, so a cancelled pass cannot cut it in half; `drain` waits for it."""
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _record_then_claim(self, sent: _Round | None, claim: bool = False) -> list[RelayRow]:
        """Store a sent round's outcome and claim the next round, in one transaction."""
        ok, failures = self._outcome(*sent) if sent is not None else ([], [])
        marked, claimed = await self._store.record_relay_outcome_and_claim_due(
            ok, failures, self._clock(), self._round_rows() if claim else 0, self._lease_s
        )
        self._report(marked, failures)
        return claimed

    async def _claim_due(self) -> list[RelayRow]:
        return await self._store.claim_relay_due(self._clock(), self._round_rows(), self._lease_s)

    def _round_rows(self) -> int:
        """The rows a round claims: `batches_per_round` batches, fewer while the send window
        is narrower than the lanes' rounds. A lane claims no more than its share of the
        window sends at once, so a claimed row does not queue for a slot while its lease
        runs."""
        share = max(1, self._window.limit // self._lanes)
        return self._settings.batch_size * min(self._batches_per_round, share)

    def _window_changed(self, limit: int, latency_s: float, narrowed: bool) -> None:
        """The gauge follows every change; the log has a line when the window first
        narrows and one when it is back at its ceiling, not one per step (nor for the
        slow start's growth)."""
        self._metrics.send_window.set(limit)
        if narrowed and not self._narrowed:
            self._narrowed = True
            log.warning(
                "sqs_send_window_narrowed",
                limit=limit,
                ceiling=self._window.ceiling,
                latency_s=round(latency_s, 3),
            )
        elif limit == self._window.ceiling and self._narrowed:
            self._narrowed = False
            log.info("sqs_send_window_restored", limit=limit)

    async def _publish(self, rows: Sequence[RelayRow]) -> list[RelayRow]:
        """A dispatch batch: send `rows` (ahead of the loop's calls for a slot in the send
        window) and record the outcome; the rows now SENT."""
        return await self._record(rows, await self._send_all(rows, urgent=True))

    async def _send_all(self, rows: Sequence[RelayRow], urgent: bool = False) -> BatchResult:
        """Send `rows` in batches of `relay.batch_size`, at once as far as the send window
        lets them; every row's outcome."""
        size = self._settings.batch_size
        chunks: list[tuple[QueueKind, Sequence[RelayRow]]] = []
        groups: tuple[tuple[QueueKind, list[RelayRow]], ...] = (
            ("jobs", [r for r in rows if r.kind == "job"]),
            ("tasks", [r for r in rows if r.kind != "job"]),
        )
        for kind, group in groups:
            chunks.extend((kind, group[i : i + size]) for i in range(0, len(group), size))
        if len(chunks) == 1:
            result = await self._send(*chunks[0], urgent)
        else:
            result = BatchResult(successful={}, failed={})
            for part in await asyncio.gather(*(self._send(k, c, urgent) for k, c in chunks)):
                result.successful.update(part.successful)
                result.failed.update(part.failed)
        return result

    async def _send(self, kind: QueueKind, rows: Sequence[RelayRow], urgent: bool) -> BatchResult:
        messages = []
        for r in rows:
            group_id = dedup_id = None
            if kind == "tasks":
                # One FIFO group per task type: tasks of one type run in order,
                # different types do not wait on each other.
                run = await self._store.get_task(r.task_id or "")
                group_id = run.type if run is not None else "tasks"
                dedup_id = r.dedup_id
            messages.append(OutgoingMessage(r.id, message_body(r), group_id, dedup_id))
        # The timeout runs from the moment the call has its slot, not while it waits.
        started = await self._window.acquire(urgent)
        failed: bool | None = None
        try:
            # asyncio.timeout, not wait_for: no extra task per SendMessageBatch.
            async with asyncio.timeout(self._settings.publish_timeout_s):
                result = await self._publisher.send_batch(kind, messages)
            failed = False
            return result
        except (QueueError, TimeoutError) as exc:
            failed = True
            reason = str(exc) if isinstance(exc, QueueError) else "publish timed out"
            return BatchResult(successful={}, failed={r.id: reason for r in rows})
        finally:
            self._window.release(started, failed)

    async def _record(self, rows: Sequence[RelayRow], result: BatchResult) -> list[RelayRow]:
        """Mark the `Successful` entries SENT and back off the rest, in one transaction."""
        ok, failures = self._outcome(rows, result)
        # Recording the outcome is shielded: a shutdown must not cut it in half
        # and leave a published row looking unpublished for a whole lease.
        marked = await asyncio.shield(self._store.record_relay_outcome(ok, failures, self._clock()))
        self._report(marked, failures)
        return marked

    def _outcome(
        self, rows: Sequence[RelayRow], result: BatchResult
    ) -> tuple[list[tuple[RelayRow, str]], list[RelayFailure]]:
        """The rows to mark SENT (with their MessageId) and the failures to back off."""
        crash_point("after_publish_before_sent")
        now = self._clock()
        by_id = {r.id: r for r in rows}
        ok = [(by_id[i], mid) for i, mid in result.successful.items() if i in by_id]
        failures = []
        for entry_id, reason in result.failed.items():
            row = by_id.get(entry_id)
            if row is None:
                continue
            dead = row.attempt_count >= self._settings.max_attempts
            failures.append(
                publish_failure(
                    row,
                    reason,
                    # Jitter: rows that failed together (an SQS outage) must not all
                    # come back in the same second.
                    now
                    + backoff(
                        row.attempt_count,
                        self._settings.backoff_base_s,
                        self._settings.backoff_max_s,
                        jitter=True,
                    ),
                    dead,
                )
            )
        return ok, failures

    def _report(self, marked: Sequence[RelayRow], failures: Sequence[RelayFailure]) -> None:
        """The log lines and metrics of a recorded outcome."""
        size = self._settings.batch_size
        for i in range(0, len(marked), size):
            log_info("outbox_sent", _sent_fields(marked[i : i + size]))
        for f in failures:
            log.warning(
                "outbox_dead" if f.dead else "outbox_publish_failed",
                outbox_id=f.row.id,
                job_id=f.row.job_id,
                task_id=f.row.task_id,
                attempts=f.row.attempt_count,
                error=f.error[:300],
            )
        self._metrics.publishes.labels("sent").inc(len(marked))
        if failures:
            self._metrics.publishes.labels("failed").inc(sum(not f.dead for f in failures))
            self._metrics.publishes.labels("dead").inc(sum(f.dead for f in failures))


def _sent_fields(part: Sequence[RelayRow]) -> dict[str, object]:
    """The fields of one `outbox_sent` line: one line per SendMessageBatch's worth of rows,
    not one per message. The ids are listed, so `grep <job_id>` still finds the line; a
    batch of a single row (a lone request) keeps the per-row fields it always had."""
    if len(part) == 1:
        m = part[0]
        return {
            "outbox_id": m.id,
            "job_id": m.job_id,
            "task_id": m.task_id,
            "message_id": m.queue_message_id,
        }
    return {
        "count": len(part),
        "outbox_ids": [m.id for m in part],
        "job_ids": [m.job_id for m in part if m.job_id is not None],
        "task_ids": [m.task_id for m in part if m.task_id is not None],
        "message_ids": [m.queue_message_id for m in part],
    }


def publish_failure(row: RelayRow, error: str, next_attempt_at: float, dead: bool) -> RelayFailure:
    """The failure to record for one row; a dead job row's job ends RETRIES_EXHAUSTED."""
    job_error = None
    if dead and row.job_id is not None:
        job_error = (
            "RETRIES_EXHAUSTED",
            f"publishing failed {row.attempt_count} times: {error[:300]}",
        )
    return RelayFailure(row, error, next_attempt_at, dead, job_error)
