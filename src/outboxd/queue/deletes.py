"""A job message's delete, sent with others: up to ten receipt handles to a DeleteMessageBatch.

The consumer deletes a job's message once the job's outcome committed (or the message turned
out to have nothing to run). The delete need not hold the handler: `CoalescedDeletes.add`
queues the receipt handle and returns, and a batch leaves

- at once when ten wait (the DeleteMessageBatch limit),
- else when the oldest has waited `window_s` (DELETE_WINDOW_S, at most a quarter of the
  visibility timeout, so the message is still invisible when its delete arrives),
- and whatever waits when the consumer stops (`close()`).

A delete that never arrives (the process died first, or SQS refused it) costs a redelivery
and nothing else: the redelivered message finds its job finished (or parked, or held for
another row) and is deleted unrun, without a second portal run. So a refused entry (its
receipt handle no longer valid) is logged and left to that; a request that failed as an
outage is tried again after a backoff, until its messages are visible again anyway
(docs/decisions/0036-fewer-sqs-requests-per-job.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

import structlog

from outboxd.crashpoints import crash_point
from outboxd.queue.sqs import MAX_BATCH_ENTRIES as MAX_BATCH
from outboxd.queue.sqs import QueueError, QueueKind, ReceivedMessage

log = structlog.get_logger(__name__)

# The longest a job message's delete waits for others to share its request.
DELETE_WINDOW_S: Final = 1.0
# After a request that failed as an outage, the next try waits this long, doubling.
_RETRY_FIRST_S: Final = 1.0
_RETRY_MAX_S: Final = 30.0


class BatchDeleter(Protocol):
    async def delete_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], dlq: bool = False
    ) -> dict[str, str]: ...


@dataclass(frozen=True)
class _Waiting:
    handle: str
    since: float  # monotonic: when it was queued


class CoalescedDeletes:
    """The deletes of one queue's messages, ten to a DeleteMessageBatch (module docstring).

    `add()` inside a running loop; `close()` sends what waits and stops.
    """

    def __init__(
        self,
        queues: BatchDeleter,
        kind: QueueKind,
        *,
        window_s: float = DELETE_WINDOW_S,
        give_up_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._queues = queues
        self._kind: QueueKind = kind
        self._window_s = window_s
        # A delete still failing this long after it was queued is dropped: its message is
        # visible again by then and comes back (to be deleted unrun).
        self._give_up_s = give_up_s
        self._clock = clock
        self._waiting: deque[_Waiting] = deque()
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._streak = 0  # requests failed in a row as an outage
        self._retry_at = 0.0  # after such a failure, the next try waits until then

    @classmethod
    def of_jobs(cls, queues: BatchDeleter, visibility_timeout_s: int) -> CoalescedDeletes:
        """The jobs queue's: a window of DELETE_WINDOW_S, at most a quarter of the visibility
        timeout; a delete given up once its message is visible again."""
        visibility_s = max(1, visibility_timeout_s)
        window_s = min(DELETE_WINDOW_S, visibility_s / 4)
        return cls(queues, "jobs", window_s=window_s, give_up_s=visibility_s)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def add(self, receipt_handle: str) -> None:
        """Queue one message's delete; it leaves within `window_s` (module docstring)."""
        self._waiting.append(_Waiting(receipt_handle, self._clock()))
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
        if len(self._waiting) == 1 or len(self._waiting) >= MAX_BATCH:
            self._wake.set()

    async def close(self) -> None:
        """Send everything that waits (each batch tried once more at most) and stop."""
        self._closing = True
        self._wake.set()
        if self._task is not None:
            await self._task

    async def _run(self) -> None:
        while self._waiting:
            if (self._streak or len(self._waiting) < MAX_BATCH) and not self._closing:
                due = self._waiting[0].since + self._window_s
                wait_s = max(due, self._retry_at) - self._clock()
                if wait_s > 0:
                    self._wake.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), wait_s)
                    continue
            batch = [self._waiting.popleft() for _ in range(min(MAX_BATCH, len(self._waiting)))]
            await self._send(batch)

    async def _send(self, batch: list[_Waiting]) -> None:
        crash_point("before_delete_batch")  # queued, not sent: their messages come back
        try:
            failed = await self._queues.delete_batch(self._kind, [w.handle for w in batch])
        except QueueError as exc:
            now = self._clock()
            again = [w for w in batch if now - w.since < self._give_up_s]
            if not exc.outage or self._closing:
                again = []
            if self._streak == 0 or not again:
                log.warning(
                    "sqs_delete_failed",
                    queue=self._kind,
                    messages=len(batch),
                    retried=bool(again),
                    error=str(exc),
                )
            if again:
                # Back at the head, their times kept; the next try waits a backoff.
                self._streak += 1
                self._retry_at = now + min(_RETRY_MAX_S, _RETRY_FIRST_S * 2.0 ** (self._streak - 1))
                self._waiting.extendleft(reversed(again))
            return
        if self._streak:
            log.info("sqs_deletes_resumed", queue=self._kind, failed_requests=self._streak)
            self._streak = 0
        if failed:
            # Refused entries (a receipt handle no longer valid): their messages come back
            # and are deleted unrun.
            log.warning(
                "sqs_delete_failed",
                queue=self._kind,
                messages=len(failed),
                retried=False,
                error=next(iter(failed.values())),
            )


class ConsumerQueues(BatchDeleter, Protocol):
    """What the consumer asks of SQS (SqsQueues has it all)."""

    async def receive(
        self,
        kind: QueueKind,
        max_messages: int,
        wait_time_s: int | None = None,
        visibility_timeout_s: int | None = None,
    ) -> list[ReceivedMessage]: ...
    async def receive_dlq(
        self, kind: QueueKind, max_messages: int, visibility_timeout_s: int
    ) -> list[ReceivedMessage]: ...
    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None: ...
    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None: ...
    async def change_visibility_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], timeout_s: int, dlq: bool = False
    ) -> dict[str, str]: ...


class JobDeletesCoalesced:
    """`queues` with the deletes of job messages (the jobs queue's, not its DLQ's) handed to
    `deletes`: `delete()` returns once the delete is queued. Everything else goes through."""

    def __init__(self, queues: ConsumerQueues, deletes: CoalescedDeletes) -> None:
        self._inner = queues
        self._deletes = deletes

    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None:
        if kind == "jobs" and not dlq:
            self._deletes.add(receipt_handle)
            return
        await self._inner.delete(kind, receipt_handle, dlq)

    async def receive(
        self,
        kind: QueueKind,
        max_messages: int,
        wait_time_s: int | None = None,
        visibility_timeout_s: int | None = None,
    ) -> list[ReceivedMessage]:
        return await self._inner.receive(kind, max_messages, wait_time_s, visibility_timeout_s)

    async def receive_dlq(
        self, kind: QueueKind, max_messages: int, visibility_timeout_s: int
    ) -> list[ReceivedMessage]:
        return await self._inner.receive_dlq(kind, max_messages, visibility_timeout_s)

    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None:
        await self._inner.change_visibility(kind, receipt_handle, timeout_s, dlq)

    async def delete_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], dlq: bool = False
    ) -> dict[str, str]:
        return await self._inner.delete_batch(kind, receipt_handles, dlq)

    async def change_visibility_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], timeout_s: int, dlq: bool = False
    ) -> dict[str, str]:
        return await self._inner.change_visibility_batch(kind, receipt_handles, timeout_s, dlq)
