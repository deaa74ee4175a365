"""Records to response bodies: each renderer builds the model its route table entry names."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, cast

import msgspec

from outboxd.http import models
from outboxd.storage.ports import (
    RELAY_UNSENT_STATUSES,
    JobEvent,
    JobRecord,
    RelayRow,
    TaskRun,
    Website,
)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def job_model(job: JobRecord) -> models.Job:
    error = (
        models.JobError(job.error_code, job.error_message or "")
        if job.error_code is not None and job.status != "SUCCEEDED"
        else None
    )
    # progress and result are the stored JSON documents, sent as they are.
    progress: Any = dict(job.progress) if job.progress is not None else None
    result: Any = dict(job.result) if job.result is not None else None
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


def dispatch_model(outbox: RelayRow | None) -> models.Dispatch | None:
    if outbox is None:
        return None
    return models.Dispatch(outbox.id, outbox.status, outbox.queue_message_id)


def dispatch_body(outbox: RelayRow | None) -> dict[str, Any] | None:
    model = dispatch_model(outbox)
    return None if model is None else models.to_builtins(model)


def relay_model(row: RelayRow) -> models.OutboxItem:
    return models.OutboxItem(
        id=row.id,
        kind=row.kind,
        job_id=cast(str, row.job_id) if row.kind == "job" else msgspec.UNSET,
        task_id=cast(str, row.task_id) if row.kind == "task" else msgspec.UNSET,
        status=row.status,
        attempts=row.attempt_count,
        next_attempt_at=iso(row.next_attempt_at) if row.status in RELAY_UNSENT_STATUSES else None,
        last_error=row.last_error,
        message_id=row.queue_message_id,
        created_at=cast(str, iso(row.created_at)),
    )


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


def task_item(run: TaskRun) -> dict[str, Any]:
    return models.to_builtins(task_model(run))


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
