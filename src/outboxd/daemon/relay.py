"""The relay: publishes relay-outbox rows to SQS, now (for a request) and in a loop.

A row is claimed with a lease (`claimed_until`) in a short transaction, published
with no transaction open, then marked SENT (only the `Successful` entries, with
their MessageId) or backed off. A crash between publish and SENT leaves the
lease to expire and the row to be published again: delivery is at least once,
and the consumer's effects are idempotent.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Sequence
from typing import Protocol

import structlog

from outboxd.config import RelaySettings
from outboxd.crashpoints import crash_point
from outboxd.daemon.loops import backoff, sleep_or_stop
from outboxd.observability import Metrics
from outboxd.queue.sqs import BatchResult, OutgoingMessage, QueueError, QueueKind
from outboxd.storage.ports import RelayFailure, RelayRow, RelayStore, TaskStore

log = structlog.get_logger(__name__)


class Publisher(Protocol):
    async def send_batch(
        self, kind: QueueKind, messages: Sequence[OutgoingMessage]
    ) -> BatchResult: ...


class RelayStoreWithTasks(RelayStore, TaskStore, Protocol):
    pass


def message_body(row: RelayRow) -> str:
    """Ids only: the consumer reads everything else (credentials included) from the database."""
    if row.kind == "job":
        return json.dumps({"type": "portal_link", "jobId": row.job_id, "outboxId": row.id})
    return json.dumps({"type": "task", "taskId": row.task_id, "outboxId": row.id})


class Relay:
    def __init__(
        self,
        store: RelayStoreWithTasks,
        publisher: Publisher,
        settings: RelaySettings,
        metrics: Metrics,
        clock: Callable[[], float] = time.time,
        batches_per_round: int = 10,
    ) -> None:
        self._store = store
        self._round_size = settings.batch_size * batches_per_round
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

    async def publish_now(self, outbox_id: str) -> bool:
        """Publish one row for the request that created it; True when it is SENT."""
        crash_point("after_commit_before_publish")
        row = await self._store.claim_relay_row(outbox_id, self._clock(), self._lease_s)
        if row is None:
            # SENT already, or another holder has it: most often the relay loop, which
            # can claim the row between the request's commit and this call.
            return await self._outcome_of_other_holder(outbox_id)
        sent = await self._publish([row])
        return sent == 1

    async def _outcome_of_other_holder(self, outbox_id: str) -> bool:
        """True once the row is SENT. Waits for a holder that is publishing it now (at
        most one publish timeout, plus a second for the holder to record the outcome),
        so the request's answer, and `api.require_dispatch`, reflect that publish
        rather than a moment in the middle of it."""
        deadline = time.monotonic() + self._settings.publish_timeout_s + 1.0
        while True:
            row = await self._store.get_relay_row(outbox_id)
            if row is None or row.status == "SENT":
                return row is not None
            in_flight = row.claimed_until is not None and row.claimed_until > self._clock()
            if not in_flight or time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.05)

    async def run(self, stop: asyncio.Event) -> None:
        log.info("relay_started", interval_s=self._settings.interval_s)
        while not stop.is_set():
            try:
                n = await self.relay_once()
            except Exception as exc:  # the loop must survive a database or SQS outage
                log.warning("relay_iteration_failed", error=exc)
                n = 0
            if n >= self._round_size:
                continue  # a full round: there may be more due right now
            await sleep_or_stop(stop, self._settings.interval_s)
        log.info("relay_stopped")

    async def relay_once(self) -> int:
        """Claim and publish one round of due rows; returns how many were claimed.

        A round is up to `batches_per_round` SendMessageBatch calls made at once:
        one claim and one outcome transaction serve them all, so the database's
        commit cost is shared by up to a hundred messages instead of ten.
        """
        rows = await self._store.claim_relay_due(self._clock(), self._round_size, self._lease_s)
        if rows:
            await self._publish(rows)
        return len(rows)

    async def _publish(self, rows: Sequence[RelayRow]) -> int:
        size = self._settings.batch_size
        chunks: list[tuple[QueueKind, Sequence[RelayRow]]] = []
        for kind in ("jobs", "tasks"):
            group = [r for r in rows if (r.kind == "job") == (kind == "jobs")]
            chunks.extend((kind, group[i : i + size]) for i in range(0, len(group), size))
        results = await asyncio.gather(*(self._send(kind, chunk) for kind, chunk in chunks))
        result = BatchResult(successful={}, failed={})
        for part in results:
            result.successful.update(part.successful)
            result.failed.update(part.failed)
        return await self._record(rows, result)

    async def _send(self, kind: QueueKind, rows: Sequence[RelayRow]) -> BatchResult:
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
        try:
            return await asyncio.wait_for(
                self._publisher.send_batch(kind, messages), self._settings.publish_timeout_s
            )
        except (QueueError, TimeoutError) as exc:
            reason = str(exc) if isinstance(exc, QueueError) else "publish timed out"
            return BatchResult(successful={}, failed={r.id: reason for r in rows})

    async def _record(self, rows: Sequence[RelayRow], result: BatchResult) -> int:
        """Mark the `Successful` entries SENT and back off the rest, in two transactions."""
        crash_point("after_publish_before_sent")
        now = self._clock()
        by_id = {r.id: r for r in rows}
        ok = [(by_id[i], mid) for i, mid in result.successful.items() if i in by_id]
        # Recording the outcome is shielded: a shutdown must not cut it in half
        # and leave a published row looking unpublished for a whole lease.
        marked = await asyncio.shield(self._store.mark_relay_sent(ok, now))
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
        await asyncio.shield(self._store.mark_relay_failed(failures, now))
        for m in marked:
            log.info(
                "outbox_sent",
                outbox_id=m.id,
                job_id=m.job_id,
                task_id=m.task_id,
                message_id=m.queue_message_id,
            )
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
        self._metrics.publishes.labels("failed").inc(sum(not f.dead for f in failures))
        self._metrics.publishes.labels("dead").inc(sum(f.dead for f in failures))
        return len(marked)


def publish_failure(row: RelayRow, error: str, next_attempt_at: float, dead: bool) -> RelayFailure:
    """The failure to record for one row; a dead job row's job ends RETRIES_EXHAUSTED."""
    job_error = None
    if dead and row.job_id is not None:
        job_error = (
            "RETRIES_EXHAUSTED",
            f"publishing failed {row.attempt_count} times: {error[:300]}",
        )
    return RelayFailure(row, error, next_attempt_at, dead, job_error)
