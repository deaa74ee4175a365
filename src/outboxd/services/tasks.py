"""Tasks: the task outbox's transaction boundary (admin API and scheduler both enqueue here)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any

import structlog

from outboxd.storage.ports import TaskRun, TaskStore

log = structlog.get_logger(__name__)

BUILTIN_TASKS = ("outbox.prune", "noop")


class TaskService:
    def __init__(self, store: TaskStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def enqueue(
        self, type_: str, payload: Mapping[str, Any], dedup_id: str | None = None
    ) -> tuple[TaskRun, bool]:
        """Insert a task run and its outbox row in one transaction.

        A dedup id seen before makes this a no-op that returns the existing run.
        """
        task_id = str(uuid.uuid4())
        run, created = await self._store.enqueue_task(
            task_id, str(uuid.uuid4()), type_, payload, dedup_id or task_id, self._clock()
        )
        if created:
            log.info("task_enqueued", task_id=run.id, task_type=type_, dedup_id=run.dedup_id)
        return run, created
