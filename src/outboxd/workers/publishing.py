"""The relay's send path, shared by its two callers (workers/dispatch.py for requests,
workers/relay.py for the loop): SendMessageBatch calls within the send window, and the
outcome recorded in one transaction (the `Successful` entries SENT with their MessageId,
the rest backed off or DEAD as services/retries.py decides).

A row is claimed with a lease (`claimed_until`) before it is sent, with no transaction
open while it is: a crash between publish and SENT leaves the lease to expire and the
row to be published again. Delivery is at least once; the consumer's effects are
idempotent.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

import structlog

from outboxd.config import RelaySettings
from outboxd.crashpoints import crash_point
from outboxd.metrics import Metrics
from outboxd.observability import OutageLog, detached, log_info
from outboxd.queue import messages
from outboxd.queue.sqs import BatchResult, OutgoingMessage, QueueError, QueueKind
from outboxd.services.retries import publish_failure, publish_gives_up, publish_outage
from outboxd.storage.ports import RelayFailure, RelayRow, RelayStore, TaskStore
from outboxd.tracing import NO_TRACING, Tracing, trace_id_of
from outboxd.workers.loops import backoff
from outboxd.workers.send_window import SendWindow

log = structlog.get_logger(__name__)
T = TypeVar("T")


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


@dataclass(eq=False, repr=False)
class Publishing:
    """Sends rows and records their outcome; both the requests' batches and the loop's rounds
    go through one instance, so they share one send window."""

    store: RelayStoreWithTasks
    publisher: Publisher
    settings: RelaySettings
    metrics: Metrics
    clock: Callable[[], float]
    window_ceiling: int
    tracing: Tracing = NO_TRACING
    lease_s: float = field(init=False)
    window: SendWindow = field(init=False)
    # SQS unreachable as a whole: logged once for the dispatch and the loop together,
    # not once per row; the loop backs off while it lasts (workers/relay.py).
    sqs_outage: OutageLog = field(default_factory=lambda: OutageLog("sqs", "relay"), init=False)
    # Set when SQS answers again after an outage, whichever caller saw it: the loop's pause
    # ends then, not when its backoff runs out.
    sqs_back: asyncio.Event = field(default_factory=asyncio.Event, init=False)
    _tasks: set[asyncio.Future[Any]] = field(default_factory=set, init=False)
    _narrowed: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        # Long enough that a slow but successful publish is marked SENT by its
        # own holder before anyone else may take the row: the publish itself is cut
        # at publish_timeout_s, the rest is a few short transactions. Not longer: it
        # is also how long a row published by a process that then died waits to go
        # out again. Should a holder overrun it anyway, the worst case is a second
        # copy of the message (the consumer drops it); the version guard refuses
        # the stale holder's SENT.
        self.lease_s = max(2.0, self.settings.publish_timeout_s * 5)
        # The SendMessageBatch calls out at once, the loop's and the requests' together:
        # as many as the lanes' rounds and the dispatch batches make while SQS answers
        # in time, fewer once it slows (a call slower than a quarter of the publish
        # timeout is one that would soon pass it).
        self.window = SendWindow(
            self.window_ceiling,
            self.settings.publish_timeout_s / 4,
            on_change=self._window_changed,
        )
        self.metrics.send_window.set(self.window.limit)

    async def drain(self, timeout_s: float) -> None:
        """At shutdown, before the store closes: wait (at most `timeout_s`) for sends
        still at SQS to record their outcome, so a message that went out is not
        left looking unsent for a lease and published again after a restart."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout_s)

    def in_background(self, work: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
        """A task of its own, so a cancelled caller cannot cut it in half; `drain` waits for it.
        It starts from an empty context: a batch a request started is not that request's."""
        task = detached(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _window_changed(self, limit: int, latency_s: float, narrowed: bool) -> None:
        """The gauge follows every change; the log has a line when the window first
        narrows and one when it is back at its ceiling, not one per step (nor for the
        slow start's growth)."""
        self.metrics.send_window.set(limit)
        if narrowed and not self._narrowed:
            self._narrowed = True
            log.warning(
                "sqs_send_window_narrowed",
                limit=limit,
                ceiling=self.window.ceiling,
                latency_s=round(latency_s, 3),
            )
        elif limit == self.window.ceiling and self._narrowed:
            self._narrowed = False
            log.info("sqs_send_window_restored", limit=limit)

    async def publish(self, rows: Sequence[RelayRow]) -> list[RelayRow]:
        """A dispatch batch: send `rows` (ahead of the loop's calls for a slot in the send
        window) and record the outcome; the rows now SENT."""
        return await self.record(rows, await self.send_all(rows, urgent=True))

    async def send_all(self, rows: Sequence[RelayRow], urgent: bool = False) -> BatchResult:
        """Send `rows` in batches of `relay.batch_size`, at once as far as the send window
        lets them; every row's outcome."""
        size = self.settings.batch_size
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
                run = await self.store.get_task(r.task_id or "")
                group_id = run.type if run is not None else "tasks"
                dedup_id = r.dedup_id
            # The job's trace context travels beside the body (the consumer continues it).
            attributes = {"traceparent": r.traceparent} if r.traceparent else None
            messages.append(OutgoingMessage(r.id, message_body(r), group_id, dedup_id, attributes))
        # The timeout runs from the moment the call has its slot, not while it waits.
        started = await self.window.acquire(urgent)
        started_at = self.clock()
        rows, messages = self._still_held(rows, messages, started_at)
        failed: bool | None = None
        try:
            if not rows:
                return BatchResult(successful={}, failed={})
            # asyncio.timeout, not wait_for: no extra task per SendMessageBatch.
            async with asyncio.timeout(self.settings.publish_timeout_s):
                result = await self.publisher.send_batch(kind, messages)
            failed = False
            self._answered(result)
            if self.tracing.enabled:
                self._publish_spans(rows, result, started_at)
            return result
        except (QueueError, TimeoutError) as exc:
            failed = True
            error = (
                exc
                if isinstance(exc, QueueError)
                else QueueError(
                    f"SQS SendMessageBatch: no answer within {self.settings.publish_timeout_s:g} s "
                    "(relay.publish_timeout_s)"
                )
            )
            return self._request_failed(rows, error)
        finally:
            self.window.release(started, failed)

    def _still_held(
        self, rows: Sequence[RelayRow], messages: list[OutgoingMessage], now: float
    ) -> tuple[Sequence[RelayRow], list[OutgoingMessage]]:
        """The rows (and their messages) whose lease outlasts this call and the recording of
        its outcome. A row that waited for the send window so long that its lease could run
        out meanwhile may be claimed and sent by another holder: sending it too would be a
        second copy with no timeout behind it. It is left unsent and unrecorded, to whoever
        claims it once the lease is over."""
        need = 2 * self.settings.publish_timeout_s
        keep = [i for i, r in enumerate(rows) if (r.claimed_until or 0.0) - now > need]
        if len(keep) == len(rows):
            return rows, messages
        log.warning("outbox_lease_short_at_send", count=len(rows) - len(keep))
        return [rows[i] for i in keep], [messages[i] for i in keep]

    def _request_failed(self, rows: Sequence[RelayRow], error: QueueError) -> BatchResult:
        """Every row's outcome when the SendMessageBatch request as a whole failed: an
        outage (connection refused or reset, a timeout, a 5xx) spends none of their
        attempts; a refusal of the request (a 4xx naming it) counts against each."""
        ids = [r.id for r in rows]
        if error.outage:
            self.sqs_outage.failed(error)
        return BatchResult(
            successful={},
            failed={i: str(error) for i in ids},
            sender_fault={i: not error.outage for i in ids},
            outage=frozenset(ids) if error.outage else frozenset(),
        )

    def _answered(self, result: BatchResult) -> None:
        """SQS answered: an outage is over, unless a later request of a batch split by
        size failed as one."""
        if result.outage:
            entry = next(iter(result.outage))
            self.sqs_outage.failed(result.failed.get(entry, "SQS unavailable"))
        elif self.sqs_outage.down:
            self.sqs_outage.recovered()
            self.sqs_back.set()

    def _publish_spans(
        self, rows: Sequence[RelayRow], result: BatchResult, started_at: float
    ) -> None:
        """One span per published row, in its job's trace: one SendMessageBatch serves many."""
        ended_at = self.clock()
        for r in rows:
            if r.traceparent:
                self.tracing.record(
                    "outboxd.relay.publish",
                    r.traceparent,
                    started_at,
                    ended_at,
                    kind="producer",
                    attributes={
                        "messaging.system": "aws_sqs",
                        "outboxd.job_id": r.job_id or "",
                        "outboxd.outbox_id": r.id,
                        "outboxd.published": r.id in result.successful,
                    },
                )

    async def record(self, rows: Sequence[RelayRow], result: BatchResult) -> list[RelayRow]:
        """Mark the `Successful` entries SENT and back off the rest, in one transaction."""
        ok, failures = self.outcome(rows, result)
        # Recording the outcome is shielded: a shutdown must not cut it in half
        # and leave a published row looking unpublished for a whole lease.
        marked = await asyncio.shield(self.store.record_relay_outcome(ok, failures, self.clock()))
        self.report(marked, failures)
        return marked

    def outcome(
        self, rows: Sequence[RelayRow], result: BatchResult
    ) -> tuple[list[tuple[RelayRow, str]], list[RelayFailure]]:
        """The rows to mark SENT (with their MessageId) and the failures to back off."""
        crash_point("after_publish_before_sent")
        now = self.clock()
        by_id = {r.id: r for r in rows}
        ok = [(by_id[i], mid) for i, mid in result.successful.items() if i in by_id]
        failures = []
        for entry_id, reason in result.failed.items():
            row = by_id.get(entry_id)
            if row is None:
                continue
            if entry_id in result.outage:
                # SQS was not reached: the attempt is given back however long that lasts,
                # and the loop, not the row, backs off (a short, jittered delay here).
                failures.append(
                    publish_outage(
                        row,
                        reason,
                        now
                        + backoff(
                            1,
                            self.settings.backoff_base_s,
                            self.settings.backoff_max_s,
                            jitter=True,
                        ),
                    )
                )
                continue
            dead = publish_gives_up(row.attempt_count, self.settings.max_attempts)
            failures.append(
                publish_failure(
                    row,
                    reason,
                    # Jitter: rows that failed together (an SQS outage) must not all
                    # come back in the same second.
                    now
                    + backoff(
                        row.attempt_count,
                        self.settings.backoff_base_s,
                        self.settings.backoff_max_s,
                        jitter=True,
                    ),
                    dead,
                )
            )
        return ok, failures

    def report(self, marked: Sequence[RelayRow], failures: Sequence[RelayFailure]) -> None:
        """The log lines and metrics of a recorded outcome."""
        size = self.settings.batch_size
        for i in range(0, len(marked), size):
            log_info("outbox_sent", _sent_fields(marked[i : i + size]))
        for f in failures:
            if not f.counted:
                continue  # an SQS outage: self.sqs_outage has its lines
            log.warning(
                "outbox_dead" if f.dead else "outbox_publish_failed",
                outbox_id=f.row.id,
                job_id=f.row.job_id,
                task_id=f.row.task_id,
                trace_id=trace_id_of(f.row.traceparent),
                attempts=f.row.attempt_count,
                error=f.error[:300],
            )
        self.metrics.publishes.labels("sent").inc(len(marked))
        if failures:
            self.metrics.publishes.labels("failed").inc(sum(not f.dead for f in failures))
            self.metrics.publishes.labels("dead").inc(sum(f.dead for f in failures))
            dead = [f.row for f in failures if f.dead]
            if dead:
                # A DEAD row takes its job or task with it (storage/store/relay.py).
                self.metrics.dead.labels("relay_outbox").inc(len(dead))
                self.metrics.dead.labels("jobs").inc(sum(r.job_id is not None for r in dead))
                self.metrics.dead.labels("task_runs").inc(sum(r.task_id is not None for r in dead))


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
            "trace_id": trace_id_of(m.traceparent),
        }
    return {
        "count": len(part),
        "outbox_ids": [m.id for m in part],
        "job_ids": [m.job_id for m in part if m.job_id is not None],
        "task_ids": [m.task_id for m in part if m.task_id is not None],
        "message_ids": [m.queue_message_id for m in part],
        "trace_ids": [trace_id_of(m.traceparent) for m in part if m.job_id is not None],
    }
