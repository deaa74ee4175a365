"""Records to response bodies: each renderer builds the model its route table entry names."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import msgspec

from outboxd.http import console_models, models
from outboxd.security import Principal
from outboxd.services.admin import Stats
from outboxd.services.tasks import BUILTIN_TASKS
from outboxd.storage.ports import (
    JOB_STATUSES,
    RELAY_STATUSES,
    RELAY_UNSENT_STATUSES,
    TASK_STATUSES,
    WORK_STATUSES,
    JobEvent,
    JobRecord,
    PaceState,
    RelayRow,
    TaskRun,
)
from outboxd.storage.website_ports import Website


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_model(job: JobRecord, reader: Principal | None = None) -> models.Job:
    """The job as `reader` may see it: another user's result only for an admin."""
    error = None
    if job.error_code is not None and job.status != "SUCCEEDED":
        locked = iso(job.locked_until) if job.error_code == "PORTAL_LOGIN_LOCKED" else None
        error = models.JobError(
            job.error_code, job.error_message or "", locked if locked else msgspec.UNSET
        )
    waiting = None
    # Waiting (services/parking.py, services/breakers.py): shown while no run holds it.
    if job.wait_for is not None and not job.terminal and job.lease_until is None:
        waiting = models.WaitingFor(
            dependency=job.wait_for.get("dependency", "portal"),
            state=job.wait_for.get("state", "login_throttled"),
            until=iso(job.wait_until),
        )
    # progress and result are the stored JSON documents, sent as they are.
    progress: Any = dict(job.progress) if job.progress is not None else None
    result: Any = dict(job.result) if job.result is not None else None
    hidden = reader is not None and reader.user != job.user_id and not reader.is_admin
    if hidden:
        result = None
    return models.Job(
        job_id=job.id,
        kind=cast(Any, job.kind),
        portal=cast(Any, job.portal),
        status=job.status,
        attempts=job.attempts,
        created_at=cast(str, iso(job.created_at)),
        updated_at=cast(str, iso(job.updated_at)),
        finished_at=iso(job.finished_at),
        progress=progress,
        error=error,
        result=result,
        result_hidden=hidden,
        waiting_for=waiting,
        cancel_requested=job.cancel_requested,
    )


def event_model(event: JobEvent) -> models.JobEvent:
    detail: Any = dict(event.detail) if event.detail is not None else None
    return models.JobEvent(
        seq=event.seq,
        at=cast(str, iso(event.at)),
        type=event.type,
        status=event.status,
        attempt=event.attempt,
        instance=event.instance,
        detail=detail,
    )


def job_body(job: JobRecord) -> dict[str, Any]:
    return models.to_builtins(job_model(job))


def admin_job_model(job: JobRecord, reader: Principal | None = None) -> models.AdminJob:
    """The job with its owner (the administration's view)."""
    return models.AdminJob(**msgspec.structs.asdict(job_model(job, reader)), user=job.user_id)


def job_detail_model(
    job: JobRecord, rows: Sequence[RelayRow], reader: Principal | None = None
) -> console_models.JobDetail:
    """The job with its owner and relay outbox rows (the administration's view)."""
    return console_models.JobDetail(
        **msgspec.structs.asdict(admin_job_model(job, reader)),
        outbox=[relay_model(r) for r in rows],
    )


def dispatch_model(outbox: RelayRow | None) -> models.Dispatch | None:
    if outbox is None:
        return None
    return models.Dispatch(outbox.id, outbox.status, outbox.queue_message_id)


def dispatch_body(outbox: RelayRow | None) -> dict[str, Any] | None:
    model = dispatch_model(outbox)
    return None if model is None else models.to_builtins(model)


def relay_model(row: RelayRow) -> models.OutboxItem:
    next_at = iso(row.next_attempt_at) if row.status in RELAY_UNSENT_STATUSES else None
    fields: dict[str, Any] = {
        "id": row.id,
        "status": row.status,
        "attempts": row.attempt_count,
        "next_attempt_at": next_at,
        "last_error": row.last_error,
        "message_id": row.queue_message_id,
        "created_at": cast(str, iso(row.created_at)),
    }
    if row.kind == "job":
        return models.JobOutboxItem(job_id=cast(str, row.job_id), **fields)
    return models.TaskOutboxItem(task_id=cast(str, row.task_id), **fields)


def relay_item(row: RelayRow) -> dict[str, Any]:
    return models.to_builtins(relay_model(row))


def task_model(run: TaskRun) -> models.TaskRun:
    return models.TaskRun(
        task_id=run.id,
        type=run.type,
        dedup_id=run.dedup_id,
        status=run.status,
        enqueued_at=cast(str, iso(run.enqueued_at)),
        finished_at=iso(run.finished_at),
        error=run.error,
    )


def website_model(w: Website) -> models.Website:
    return models.Website(
        id=w.id,
        domain=w.domain,
        favicon_url=w.favicon_url,
        category=w.category,
        classification=models.Classification(w.work_status, w.work_attempts, w.work_last_error),
    )


def website_body(w: Website) -> dict[str, Any]:
    return models.to_builtins(website_model(w))


def readiness_model(checks: dict[str, str]) -> models.Readiness:
    ok = all(v == "ok" for v in checks.values())
    return models.Readiness("ok" if ok else "unavailable", checks)


def stats_model(stats: Stats) -> console_models.Stats:
    t, age = stats.tables, stats.oldest_pending_age_s
    queues: console_models.QueueDepths | None = None
    if stats.queues_error is not None:
        queues = console_models.QueueDepths(error=stats.queues_error)
    elif stats.queues is not None:
        depth = {
            k: console_models.QueueDepth(d.visible, d.in_flight, d.dlq_visible)
            for k, d in stats.queues.items()
        }
        queues = console_models.QueueDepths(
            jobs=depth.get("jobs", msgspec.UNSET), tasks=depth.get("tasks", msgspec.UNSET)
        )
    return console_models.Stats(
        tables=console_models.TableCounts(
            t["jobs"], t["relay_outbox"], t["work_outbox"], t["task_runs"]
        ),
        oldest_pending_age_seconds=console_models.PendingAges(
            age["jobs"], age["relay_outbox"], age["work_outbox"], age["task_runs"]
        ),
        oldest_running_job_age_seconds=stats.oldest_running_job_age_s,
        pace={p.name: pace_model(p) for p in stats.pace},
        queues=queues,
    )


def stats_body(stats: Stats) -> dict[str, Any]:
    return models.to_builtins(stats_model(stats))


def pace_model(p: PaceState) -> console_models.PaceSlot:
    """One cluster pace row (docs/pacing.md), times on the database's clock."""
    return console_models.PaceSlot(
        last_slot_at=p.last_at,
        next_slot_at=p.next_at if p.last_at is not None else None,
        next_slot_in_seconds=round(max(0.0, p.next_at - p.now), 3),
        paused_until=p.paused_until if p.paused_until > 0 else None,
        paused_for_seconds=round(p.paused_for_s, 3),
        sessions=p.sessions,
        database_now=p.now,
    )


def runtime_model(
    now: float,
    checks: dict[str, str],
    claimer: tuple[float | None, float | None, float | None] | None,
    schedules: Iterable[tuple[str, str, float]],
    throughput: Iterable[tuple[float, int, int, int]],
    caller: Principal,
) -> console_models.Runtime:
    """What only this process knows, for the console."""
    return console_models.Runtime(
        now=cast(str, iso(now)),
        readiness=readiness_model(checks),
        claimer=None
        if claimer is None
        else console_models.ClaimerPace(iso(claimer[0]), iso(claimer[1]), iso(claimer[2])),
        schedules=[
            console_models.Schedule(name, task, cast(str, iso(at))) for name, task, at in schedules
        ],
        throughput=[
            console_models.MinuteCount(cast(str, iso(at)), accepted, finished, failed)
            for at, accepted, finished, failed in throughput
        ],
        task_types=list(BUILTIN_TASKS),
        statuses=console_models.StatusNames(
            list(JOB_STATUSES), list(RELAY_STATUSES), list(WORK_STATUSES), list(TASK_STATUSES)
        ),
        user=caller.user,
        role=cast(Any, caller.role),
    )
