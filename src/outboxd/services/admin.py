"""Operator actions shared by the admin API and the `outboxd` command: redrive and stats.

`POST /v1/admin/jobs/{id}/redrive` and `outboxd jobs redrive`, `POST
/v1/admin/outbox/{id}/redrive` and `outboxd outbox redrive`, `POST /v1/admin/jobs/redrive`
and `outboxd jobs redrive --status DEAD` call the same methods; `GET /v1/admin/stats`,
`outboxd status` and the /metrics gauges read the same counts. Every action is logged
here, once, with the `actor` who asked (the API's principal, or `cli:<user>` for the
command): each single redrive, and each batch of the bulk redrive.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, Literal, Protocol

import structlog

from outboxd.errors import InvalidState, NotFound
from outboxd.ids import new_id
from outboxd.queue.sqs import QueueDepth, QueueKind
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
# Jobs per transaction of a bulk redrive: one commit per batch, short enough that the
# relay and intakes never wait long behind it.
REDRIVE_BATCH: Final = 100


@dataclass
class BulkRedrive:
    """What a bulk redrive did so far: the jobs redriven, the ones refused and why, and
    whether it stopped at its limit with more DEAD jobs perhaps left."""

    redriven: list[str] = field(default_factory=list)
    refused: list[tuple[str, str]] = field(default_factory=list)
    more: bool = False


@dataclass(eq=False, repr=False)
class AdminService:
    store: AdminStore
    queues: QueueStats | None = None
    clock: Callable[[], float] = time.time

    @property
    def has_queues(self) -> bool:
        return self.queues is not None

    async def redrive_job(self, job_id: str, *, actor: str) -> JobRecord:
        """A DEAD job back to QUEUED with a fresh outbox row; NotFound or InvalidState."""
        job = await self.store.redrive_job(job_id, new_id(), self.clock(), by=actor)
        log.info("job_redriven", job_id=job.id, actor=actor)
        return job

    async def redrive_outbox_row(self, outbox_id: str, *, actor: str) -> RelayRow:
        """A DEAD outbox row back to PENDING, its job or task with it; NotFound or InvalidState."""
        row = await self.store.redrive_relay_row(outbox_id, self.clock(), by=actor)
        log.info(
            "outbox_redriven", outbox_id=row.id, job_id=row.job_id, task_id=row.task_id, actor=actor
        )
        return row

    async def redrive_jobs(
        self,
        *,
        actor: str,
        job_ids: Sequence[str] | None = None,
        status: Literal["DEAD"] | None = None,
        limit: int | None = None,
        on_progress: Callable[[BulkRedrive], None] | None = None,
    ) -> BulkRedrive:
        """Redrive the jobs named by `job_ids`, or every job in `status` (at most `limit`),
        a batch per transaction. A job that cannot be redriven (not DEAD, unknown, its
        credentials erased) is listed as refused and changes nothing. `on_progress` sees
        the running totals after each batch; `actor` is logged with every batch."""
        if (job_ids is None) == (status is None):
            raise ValueError("name the jobs or a status, not both")
        done = BulkRedrive()
        if job_ids is not None:
            wanted = list(dict.fromkeys(job_ids))  # each job once, in the caller's order
            for start in range(0, len(wanted), REDRIVE_BATCH):
                await self._redrive_batch(wanted[start : start + REDRIVE_BATCH], done, actor)
                if on_progress is not None:
                    on_progress(done)
            return done
        cursor: str | None = None
        while True:
            room = REDRIVE_BATCH if limit is None else min(REDRIVE_BATCH, limit - _seen(done))
            if room <= 0:
                # At the limit: say whether a DEAD job is left beyond it.
                done.more = bool((await self.store.list_jobs(status, 1, cursor)).items)
                return done
            page = await self.store.list_jobs(status, room, cursor)
            if page.items:
                await self._redrive_batch([j.id for j in page.items], done, actor)
                if on_progress is not None:
                    on_progress(done)
            if page.next_cursor is None:
                return done
            # Keyset pages walk back in time: the jobs just redriven are behind the cursor.
            cursor = page.next_cursor

    async def _redrive_batch(self, ids: list[str], done: BulkRedrive, actor: str) -> None:
        outcomes = await self.store.redrive_jobs(
            [(i, new_id()) for i in ids], self.clock(), by=actor
        )
        redriven: list[str] = []
        for job_id, outcome in zip(ids, outcomes, strict=True):
            if isinstance(outcome, NotFound):
                done.refused.append((job_id, "no such job"))
            elif isinstance(outcome, InvalidState):
                done.refused.append((job_id, str(outcome)))
            else:
                redriven.append(job_id)
        done.redriven.extend(redriven)
        log.info(
            "jobs_redriven",
            actor=actor,
            count=len(redriven),
            job_ids=redriven,
            refused=len(ids) - len(redriven),
        )

    async def stats(self) -> Stats:
        return await collect_stats(self.store, self.queues)

    async def database_stats(self) -> Stats:
        """The part of the stats read from the database (counts, oldest ages, the pace),
        with no queue depths."""
        return await database_stats(self.store)

    async def queue_stats(self) -> dict[QueueKind, QueueDepth] | None:
        """The SQS depths (None without queues); raises what the queue calls raise."""
        return None if self.queues is None else await self.queues.queue_stats()


def _seen(done: BulkRedrive) -> int:
    return len(done.redriven) + len(done.refused)


@dataclass(frozen=True)
class Stats:
    """What the operator reads: rows per table and status, ages, pace, queue depths."""

    tables: dict[str, dict[str, int]]  # table -> status -> rows
    oldest_pending_age_s: dict[str, float | None]  # table -> seconds; None when none pending
    pace: list[PaceState]
    queues: dict[QueueKind, QueueDepth] | None  # None without a queue or when SQS failed
    queues_error: str | None = None  # why SQS did not answer
    # The oldest RUNNING job's age since it was accepted; None when none runs. RUNNING is
    # published: waiting in SQS or being scraped (a backlog in SQS shows here, not above).
    oldest_running_job_age_s: float | None = None


async def database_stats(store: StatsStore) -> Stats:
    """Row counts per table and status, oldest pending ages, the oldest running job's age,
    cluster pace (no queues)."""
    now = time.time()
    tables: dict[str, dict[str, int]] = {table: {} for table in TABLE_STATUSES}
    oldest: dict[str, float | None] = {}
    running: float | None = None
    for sc in await store.status_counts():
        tables.setdefault(sc.table, {})[sc.status] = sc.count
        if sc.table == "jobs" and sc.status == "RUNNING":
            running = sc.oldest_created_at
        if sc.status in _PENDING_STATUSES.get(sc.table, ()) and sc.oldest_created_at is not None:
            prev = oldest.get(sc.table)
            oldest[sc.table] = min(prev, sc.oldest_created_at) if prev else sc.oldest_created_at
    ages = {
        t: (round(max(0.0, now - ts), 3) if ts is not None else None)
        for t in tables
        for ts in [oldest.get(t)]
    }
    return Stats(
        tables,
        ages,
        await store.pace_states(now),
        None,
        oldest_running_job_age_s=None if running is None else round(max(0.0, now - running), 3),
    )


async def collect_stats(store: StatsStore, queues: QueueStats | None) -> Stats:
    """Row counts per table and status, oldest pending ages, cluster pace, queue depths."""
    stats = await database_stats(store)
    if queues is None:
        return stats
    try:
        return replace(stats, queues=await queues.queue_stats())
    except Exception as exc:
        return replace(stats, queues_error=str(exc)[:200])
