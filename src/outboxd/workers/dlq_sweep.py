"""The DLQ sweep: each dead-letter queue keeps exactly the work that is DEAD.

A message whose job or task is no longer DEAD (redriven, finished, pruned) is deleted; a
job whose message got there without its handler recording DEAD (the process died during
its last allowed attempt) is marked DEAD; everything else stays for inspection. The
consumer runs one sweep every consumer.dlq_sweep_s.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from outboxd.errors import InvalidState, StorageError
from outboxd.metrics import Metrics
from outboxd.queue.messages import id_field as _message_id_field
from outboxd.queue.sqs import KINDS, QueueError, QueueKind, ReceivedMessage
from outboxd.storage.ports import JobStore, TaskStore
from outboxd.workers.loops import sleep_or_stop

log = structlog.get_logger(__name__)


class DlqQueues(Protocol):
    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None: ...
    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None: ...
    async def receive_dlq(
        self, kind: QueueKind, max_messages: int, visibility_timeout_s: int
    ) -> list[ReceivedMessage]: ...


class DlqStore(JobStore, TaskStore, Protocol):
    pass


# A DLQ sweep holds each message it received out of sight while it reads the next ones,
# so it sees each once; the ones it keeps are made visible again when it ends (DLQ depth,
# in stats, /metrics and an operator's look, is under-reported only while a sweep runs).
DLQ_SWEEP_HOLD_S = 30
# Messages looked at per DLQ and sweep; the next sweep goes on where this one stopped.
DLQ_SWEEP_MAX_MESSAGES = 1000


@dataclass
class DlqSweep:
    """What one sweep of the DLQs did."""

    deleted: int = 0
    marked_dead: int = 0
    kept: int = 0


@dataclass(repr=False)
class DlqSweeper:
    queues: DlqQueues
    store: DlqStore
    metrics: Metrics
    clock: Callable[[], float] = field(default=time.time)

    async def sweep(self) -> DlqSweep:
        """One pass over both DLQs. A message whose job or task is no longer DEAD (redriven,
        finished, pruned) is deleted; a job whose message got there without its handler
        recording DEAD (the process died during the last allowed attempt) is marked DEAD;
        everything else stays for inspection."""
        done = DlqSweep()
        for kind in KINDS:
            await self._sweep(kind, done)
        if done.deleted or done.marked_dead:
            log.info(
                "dlq_swept", deleted=done.deleted, marked_dead=done.marked_dead, kept=done.kept
            )
        return done

    async def _sweep(self, kind: QueueKind, done: DlqSweep) -> None:
        seen: set[str] = set()
        held: list[ReceivedMessage] = []
        try:
            while len(seen) < DLQ_SWEEP_MAX_MESSAGES:
                batch: Sequence[ReceivedMessage] = await self.queues.receive_dlq(
                    kind, 10, DLQ_SWEEP_HOLD_S
                )
                fresh = [m for m in batch if m.message_id not in seen]
                held.extend(m for m in batch if m.message_id in seen)
                if not fresh:
                    break
                for msg in fresh:
                    seen.add(msg.message_id)
                    if kind == "jobs":
                        verdict = await self._job_verdict(msg, done)
                    else:
                        verdict = await self._task_verdict(msg)
                    if verdict is None:
                        held.append(msg)
                        done.kept += 1
                        continue
                    await self.queues.delete(kind, msg.receipt_handle, dlq=True)
                    done.deleted += 1
                    log.info(
                        "dlq_message_deleted",
                        queue=kind,
                        message_id=msg.message_id,
                        reason=verdict,
                        **_ids(msg),
                    )
        finally:
            for msg in held:
                # Visible again at once: the DLQ's depth counts what it keeps.
                with contextlib.suppress(QueueError):
                    await self.queues.change_visibility(kind, msg.receipt_handle, 0, dlq=True)

    async def _job_verdict(self, msg: ReceivedMessage, done: DlqSweep) -> str | None:
        """Why a jobs-DLQ message goes (its job is closed), or None: it stays."""
        job_id = _message_id_field(msg.body, "jobId")
        outbox_id = _message_id_field(msg.body, "outboxId")
        if job_id is None or outbox_id is None:
            return None  # not a message of ours: for a human
        current = await self.store.get_job(job_id)
        if current is None:
            return "job_pruned"
        latest = await self.store.latest_relay_row_for_job(job_id)
        if latest is not None and latest.id != outbox_id:
            return "job_redriven"  # a newer outbox row carries the job: this one is history
        if current.status in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return "job_finished"
        if current.status != "RUNNING":
            return None  # DEAD: the dead letter itself (or QUEUED: not ours to judge)
        if current.lease_until is not None and current.lease_until > self.clock():
            return None  # a live lease: another copy of its message is being worked on
        if current.cancel_requested:
            # Its cancel was requested: it ends as asked, not as dead.
            with contextlib.suppress(InvalidState):
                await self.store.cancel_job(job_id, self.clock(), "consumer")
            log.info("job_cancelled", job_id=job_id, message_id=msg.message_id, source="dlq")
            return "job_cancelled"
        job = await self.store.mark_job_dead(
            job_id,
            ("RETRIES_EXHAUSTED", "the message reached the dead-letter queue"),
            self.clock(),
        )
        if job is not None:
            done.marked_dead += 1
            self.metrics.dead.labels("jobs").inc()
            log.error("job_dead", job_id=job_id, message_id=msg.message_id, source="dlq")
        return None

    async def _task_verdict(self, msg: ReceivedMessage) -> str | None:
        """Why a tasks-DLQ message goes (its task ended or is gone), or None: it stays."""
        task_id = _message_id_field(msg.body, "taskId")
        if task_id is None:
            return None
        run = await self.store.get_task(task_id)
        if run is None:
            return "task_pruned"
        # A task that used its last receive is recorded FAILED by its handler.
        if run.status in ("SUCCEEDED", "FAILED"):
            return "task_finished"
        return None


def _ids(msg: ReceivedMessage) -> dict[str, str | None]:
    return {
        "job_id": _message_id_field(msg.body, "jobId"),
        "task_id": _message_id_field(msg.body, "taskId"),
        "outbox_id": _message_id_field(msg.body, "outboxId"),
    }


async def sweep_every(
    stop: asyncio.Event, interval_s: float, sweep_once: Callable[[], Awaitable[DlqSweep]]
) -> None:
    """The consumer's sweep loop: every consumer.dlq_sweep_s, each DLQ keeps exactly the
    work that is DEAD (a pass that cannot reach SQS or the database waits for the next)."""
    while not stop.is_set():
        with contextlib.suppress(QueueError, StorageError):
            await sweep_once()
        await sleep_or_stop(stop, interval_s)
