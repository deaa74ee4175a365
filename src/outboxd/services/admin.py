"""Operator actions shared by the admin API and the `outboxd` command: redrive and stats.

`POST /v1/admin/jobs/{id}/redrive` and `outboxd jobs redrive`, `POST
/v1/admin/outbox/{id}/redrive` and `outboxd outbox redrive` call the same methods;
`GET /v1/admin/stats`, `outboxd status` and the /metrics gauges read the same
`collect_stats`. Every action is logged here, once, with the `actor` who asked: the
API's principal, or `cli:<user>` for the command.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from outboxd.ids import new_id
from outboxd.queue.sqs import QueueDepth, QueueKind
from outboxd.storage.ports import (
    RELAY_UNSENT_STATUSES,
    JobRecord,
    JobStore,
    PaceState,
    RelayRow,
    RelayStore,
    StatsStore,
)

log = structlog.get_logger(__name__)


class QueueStats(Protocol):
    async def queue_stats(self) -> dict[QueueKind, QueueDepth]: ...


class AdminStore(JobStore, RelayStore, StatsStore, Protocol):
    pass


# Per table, the statuses whose oldest row the stats report as "oldest pending".
_PENDING_STATUSES: dict[str, tuple[str, ...]] = {
    "jobs": ("QUEUED",),
    "relay_outbox": RELAY_UNSENT_STATUSES,
    "work_outbox": ("PENDING",),
    "task_runs": ("PENDING",),
}


class AdminService:
    def __init__(
        self,
        store: AdminStore,
        queues: QueueStats | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._store = store
        self._queues = queues
        self._clock = clock

    async def redrive_job(self, job_id: str, *, actor: str) -> JobRecord:
        """A DEAD job back to QUEUED with a fresh outbox row; NotFound or InvalidState."""
        job = await self._store.redrive_job(job_id, new_id(), self._clock())
        log.info("job_redriven", job_id=job.id, actor=actor)
        return job

    async def redrive_outbox_row(self, outbox_id: str, *, actor: str) -> RelayRow:
        """A DEAD outbox row back to PENDING, its job or task with it; NotFound or InvalidState."""
        row = await self._store.redrive_relay_row(outbox_id, self._clock())
        log.info(
            "outbox_redriven", outbox_id=row.id, job_id=row.job_id, task_id=row.task_id, actor=actor
        )
        return row

    async def stats(self) -> Stats:
        return await collect_stats(self._store, self._queues)


@dataclass(frozen=True)
class Stats:
    """What the operator reads: rows per table and status, ages, pace, queue depths."""

    tables: dict[str, dict[str, int]]  # table -> status -> rows
    oldest_pending_age_s: dict[str, float | None]  # table -> seconds; None when none pending
    pace: list[PaceState]
    queues: dict[QueueKind, QueueDepth] | None  # None without a queue or when SQS failed
    queues_error: str | None = None  # why SQS did not answer


async def collect_stats(store: StatsStore, queues: QueueStats | None) -> Stats:
    """Row counts per table and status, oldest pending ages, cluster pace, queue depths."""
    now = time.time()
    tables: dict[str, dict[str, int]] = {table: {} for table in _PENDING_STATUSES}
    oldest: dict[str, float | None] = {}
    for sc in await store.status_counts():
        tables.setdefault(sc.table, {})[sc.status] = sc.count
        if sc.status in _PENDING_STATUSES.get(sc.table, ()) and sc.oldest_created_at is not None:
            prev = oldest.get(sc.table)
            oldest[sc.table] = min(prev, sc.oldest_created_at) if prev else sc.oldest_created_at
    ages = {
        t: (round(max(0.0, now - ts), 3) if ts is not None else None)
        for t in tables
        for ts in [oldest.get(t)]
    }
    pace = await store.pace_states(now)
    depths: dict[QueueKind, QueueDepth] | None = None
    error: str | None = None
    if queues is not None:
        try:
            depths = await queues.queue_stats()
        except Exception as exc:
            error = str(exc)[:200]
    return Stats(tables, ages, pace, depths, error)
