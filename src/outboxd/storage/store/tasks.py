"""Task runs (`ports.TaskStore`): enqueued with their outbox row, deduplicated."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any, Literal

from outboxd.storage.db import Op
from outboxd.storage.ports import Page, TaskRun
from outboxd.storage.store.base import StoreBase
from outboxd.storage.store.records import dump, new_relay_params, task_record


class SqlTasks(StoreBase):
    async def enqueue_task(
        self,
        task_id: str,
        outbox_id: str,
        type_: str,
        payload: Mapping[str, Any],
        dedup_id: str,
        now: float,
    ) -> tuple[TaskRun, bool]:
        def body() -> Generator[Op, Any, tuple[TaskRun, bool]]:
            inserted = yield from self._one(
                "insert_task_run",
                {
                    "id": task_id,
                    "type": type_,
                    "payload": dump(payload),
                    "dedup_id": dedup_id,
                    "now": now,
                },
            )
            if inserted is not None:
                yield from self._insert_relay(
                    new_relay_params(outbox_id, "task", None, task_id, dedup_id, now)
                )
            row = yield from self._one("select_task_by_dedup", {"dedup_id": dedup_id})
            assert row is not None
            return task_record(row), inserted is not None

        return await self.db.run(body)

    async def get_task(self, task_id: str) -> TaskRun | None:
        return await self._record("select_task", {"id": task_id}, task_record, write=False)

    async def finish_task(
        self, task_id: str, status: Literal["SUCCEEDED", "FAILED"], error: str | None, now: float
    ) -> TaskRun | None:
        return await self._record(
            "finish_task",
            {"id": task_id, "status": status, "error": error, "now": now},
            task_record,
        )

    async def list_tasks(self, type_: str | None, limit: int, cursor: str | None) -> Page[TaskRun]:
        return await self._page(
            "list_tasks", {"type": type_}, limit, cursor, task_record, order_column="enqueued_at"
        )
