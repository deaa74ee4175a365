"""Tasks: the registry of task types, and the task outbox's transaction boundary.

`TASK_TYPES` is the one list of the built-in task types: the consumer runs a task
through it, the admin API and the OpenAPI document take their enum from it. The
admin API and the scheduler both enqueue through `TaskService`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from outboxd.config import Settings
from outboxd.ids import new_id
from outboxd.services.audit import AuditLog
from outboxd.storage.audit_ports import AuditStore
from outboxd.storage.ports import PruneStore, TaskRun, TaskStore

log = structlog.get_logger(__name__)


class TaskControllerStore(TaskStore, PruneStore, AuditStore, Protocol):
    pass


@dataclass(frozen=True)
class Retention:
    """How long history stays (config `retention`, `security.dead_retention_s`,
    `audit.retention_s`): what `outbox.prune` removes, and how much a transaction."""

    finished_s: float = 30 * 86400.0
    dead_s: float = 90 * 86400.0
    batch_rows: int = 1000
    # A DEAD job's credentials go sooner than its row: it stays redrivable without them.
    credentials_s: float = 7 * 86400.0
    audit_s: float = 400 * 86400.0

    @classmethod
    def of(cls, settings: Settings) -> Retention:
        r = settings.retention
        return cls(
            r.finished_s,
            r.dead_s,
            r.batch_rows,
            settings.security.dead_retention_s,
            settings.audit.retention_s,
        )


@dataclass(frozen=True)
class TaskContext:
    """What a controller may use; the consumer builds it once and injects it."""

    store: TaskControllerStore
    clock: Callable[[], float]
    retention: Retention = Retention()


TaskController = Callable[[TaskContext, TaskRun], Awaitable[None]]


async def _noop(ctx: TaskContext, run: TaskRun) -> None:
    # The ledger row is the whole effect: recorded once per dedup id,
    # however often SQS delivers the message.
    await ctx.store.finish_task(run.id, "SUCCEEDED", None, ctx.clock())


async def _prune_outbox(ctx: TaskContext, run: TaskRun) -> None:
    """History past its retention (`Retention`); `older_than_days` in the payload overrides
    `retention.finished_s` for this run."""
    keep = ctx.retention
    finished_s = keep.finished_s
    if "older_than_days" in run.payload:
        days = run.payload["older_than_days"]
        # NaN passes `days < 0` and turns every "older than" into "everything".
        if (
            not isinstance(days, int | float)
            or isinstance(days, bool)
            or not math.isfinite(days)
            or days < 0
        ):
            await ctx.store.finish_task(
                run.id,
                "FAILED",
                "payload.older_than_days must be a finite number >= 0",
                ctx.clock(),
            )
            return
        finished_s = float(days) * 86400
    now = ctx.clock()
    # Deletes are idempotent, so running them again after a crash before
    # the ledger write is harmless.
    counts = await ctx.store.prune(
        finished_before=now - finished_s,
        dead_before=now - keep.dead_s,
        credentials_before=now - keep.credentials_s,
        batch=keep.batch_rows,
    )
    await _prune_audit(ctx, now - keep.audit_s)
    # The space the deleted rows held goes back to the file (SQLite; a no-op on Postgres,
    # whose autovacuum reuses it).
    pages = await ctx.store.give_back_space()
    log.info("outbox_pruned", task_id=run.id, pages_freed=pages, **counts)
    await ctx.store.finish_task(run.id, "SUCCEEDED", None, ctx.clock())


async def _prune_audit(ctx: TaskContext, before: float) -> None:
    """Audit rows older than `before`, `retention.batch_rows` a transaction (the only way
    rows leave the append-only log), and one row of its own saying how many went."""
    removed = 0
    while True:
        n = await ctx.store.prune_audit(before, ctx.retention.batch_rows)
        removed += n
        if n < ctx.retention.batch_rows:
            break
    if removed:
        await AuditLog(ctx.store, "outboxd").record(
            "outboxd",
            "admin",
            "outbox.prune",
            f"audit rows before {before:.0f}",
            200,
            reason=f"{removed} rows older than audit.retention_s removed",
        )


# Each controller finishes its run in the ledger itself; one that raises is retried
# by the consumer until the message's last allowed receive.
TASK_TYPES: Mapping[str, TaskController] = {
    "outbox.prune": _prune_outbox,
    "noop": _noop,
}
BUILTIN_TASKS = tuple(TASK_TYPES)


class TaskService:
    def __init__(self, store: TaskStore, clock: Callable[[], float] = time.time) -> None:
        self._store = store
        self._clock = clock

    async def enqueue(
        self,
        type_: str,
        payload: Mapping[str, Any],
        dedup_id: str | None = None,
        *,
        actor: str = "scheduler",
    ) -> tuple[TaskRun, bool]:
        """Insert a task run and its outbox row in one transaction; `actor` is who asked
        (an admin's principal, or the scheduler).

        A dedup id seen before makes this a no-op that returns the existing run.
        """
        task_id = new_id()
        run, created = await self._store.enqueue_task(
            task_id, new_id(), type_, payload, dedup_id or task_id, self._clock()
        )
        if created:
            log.info(
                "task_enqueued",
                task_id=run.id,
                task_type=type_,
                dedup_id=run.dedup_id,
                actor=actor,
            )
        return run, created
