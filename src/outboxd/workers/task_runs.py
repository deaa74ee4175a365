"""The tasks queue's messages: a task run looked up and its controller run, at least once.

A message whose run is gone or finished is deleted; an unknown task type fails the run;
a controller that raises is retried after the consumer's backoff, and at the last allowed
receive the run is FAILED and its message goes on to the DLQ. The consumer
(workers/consumer.py) receives the messages and hands each one's task id here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Protocol

import structlog

from outboxd.queue.sqs import QueueKind, ReceivedMessage
from outboxd.services.tasks import TASK_TYPES, Retention, TaskContext, TaskControllerStore
from outboxd.storage.ports import TERMINAL_TASK_STATUSES

log = structlog.get_logger(__name__)


class TaskQueues(Protocol):
    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None: ...
    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None: ...


class TaskRuns:
    """Runs the task a message names; `retry_later` makes the message visible again after
    the consumer's backoff."""

    def __init__(
        self,
        store: TaskControllerStore,
        queues: TaskQueues,
        clock: Callable[[], float],
        retention: Retention,
        max_receive_count: int,
        retry_later: Callable[[QueueKind, ReceivedMessage], Awaitable[int]],
    ) -> None:
        self._store = store
        self._queues = queues
        self._clock = clock
        self._task_ctx = TaskContext(store, clock, retention)
        self._max_receive_count = max_receive_count
        self._retry_later = retry_later

    async def run(self, task_id: str, msg: ReceivedMessage) -> str:
        """The message's outcome, as the consumer's handler metric names it."""
        bind = {"task_id": task_id, "message_id": msg.message_id}
        run = await self._store.get_task(task_id)
        if run is None or run.status in TERMINAL_TASK_STATUSES:
            await self._queues.delete("tasks", msg.receipt_handle)
            return "skipped"
        controller = TASK_TYPES.get(run.type)
        if controller is None:
            await self._store.finish_task(
                task_id, "FAILED", f"unknown task type {run.type}", self._clock()
            )
            await self._queues.delete("tasks", msg.receipt_handle)
            return "failed"
        try:
            await controller(self._task_ctx, run)
        except Exception as exc:
            log.warning("task_failed_attempt", task_type=run.type, error=exc, **bind)
            if msg.receive_count >= self._max_receive_count:
                await self._store.finish_task(
                    task_id, "FAILED", f"{type(exc).__name__}: {exc}"[:500], self._clock()
                )
                await self._queues.change_visibility("tasks", msg.receipt_handle, 0)
                return "dead"
            await self._retry_later("tasks", msg)
            return "retry"
        await self._queues.delete("tasks", msg.receipt_handle)
        log.info("task_succeeded", task_type=run.type, **bind)
        return "succeeded"
