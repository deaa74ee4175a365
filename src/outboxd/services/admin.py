"""Operator actions shared by the admin API and the `outboxd` command: redrive and stats.

`POST /v1/admin/jobs/{id}/redrive` and `outboxd jobs redrive`, `POST
/v1/admin/outbox/{id}/redrive` and `outboxd outbox redrive` call the same methods;
`GET /v1/admin/stats`, `outboxd status` and the /metrics gauges read the same
`collect_stats` (the gauges through `database_stats` and `queue_stats`). Nothing here
logs: the API logs each redrive it made, the command prints its own line.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Protocol

from outboxd.ids import new_id
from outboxd.storage.ports import (
    RELAY_UNSENT_STATUSES,
    TABLE_STATUSES,
    JobRecord,
    JobStore,
    PaceState,
    RelayRow,
    RelayStore,
    StatsStore,
)


class QueueStats(Protocol):
    async def queue_stats(self) -> dict[str, dict[str, int]]: ...


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

    @property
    def has_queues(self) -> bool:
        return self._queues is not None

    async def redrive_job(self, job_id: str) -> JobRecord:
        """A DEAD job back to QUEUED with a fresh outbox row; NotFound or InvalidState."""
        return await self._store.redrive_job(job_id, new_id(), self._clock())

    async def redrive_outbox_row(self, outbox_id: str) -> RelayRow:
        """A DEAD outbox row back to PENDING, its job or task with it; NotFound or InvalidState."""
        return await self._store.redrive_relay_row(outbox_id, self._clock())

    async def stats(self) -> dict[str, Any]:
        return await collect_stats(self._store, self._queues)

    async def database_stats(self) -> dict[str, Any]:
        """The part of the stats read from the database: counts, oldest ages, the pace."""
        return await database_stats(self._store)

    async def queue_stats(self) -> dict[str, dict[str, int]] | None:
        """The SQS depths (None without queues); raises what the queue calls raise."""
        return None if self._queues is None else await self._queues.queue_stats()


async def database_stats(store: StatsStore) -> dict[str, Any]:
    """Row counts per table and status, oldest pending ages, cluster pace."""
    now = time.time()
    tables: dict[str, dict[str, int]] = {table: {} for table in TABLE_STATUSES}
    oldest: dict[str, float | None] = {}
    for sc in await store.status_counts():
        tables.setdefault(sc.table, {})[sc.status] = sc.count
        if sc.status in _PENDING_STATUSES.get(sc.table, ()) and sc.oldest_created_at is not None:
            prev = oldest.get(sc.table)
            oldest[sc.table] = min(prev, sc.oldest_created_at) if prev else sc.oldest_created_at
    return {
        "tables": tables,
        "oldestPendingAgeSeconds": {
            t: (round(max(0.0, now - ts), 3) if ts is not None else None)
            for t in tables
            for ts in [oldest.get(t)]
        },
        "pace": {p.name: pace_item(p) for p in await store.pace_states(now)},
    }


async def collect_stats(store: StatsStore, queues: QueueStats | None) -> dict[str, Any]:
    """Row counts per table and status, oldest pending ages, cluster pace, queue depths."""
    result = await database_stats(store)
    result["queues"] = None
    if queues is not None:
        try:
            result["queues"] = await queues.queue_stats()
        except Exception as exc:
            result["queues"] = {"error": str(exc)[:200]}
    return result


def pace_item(p: PaceState) -> dict[str, Any]:
    """One cluster pace row (docs/pacing.md), times on the database's clock."""
    return {
        "lastSlotAt": p.last_at,
        "nextSlotAt": p.next_at if p.last_at is not None else None,
        "nextSlotInSeconds": round(max(0.0, p.next_at - p.now), 3),
        "pausedUntil": p.paused_until if p.paused_until > 0 else None,
        "pausedForSeconds": round(p.paused_for_s, 3),
        "sessions": p.sessions,
        "databaseNow": p.now,
    }
