"""A caller of outboxd through a client generated from /openapi.json, written as one
naturally would: no casts, no `Any`. tests/acceptance/test_generated_client.py
type-checks it with `mypy --strict` and runs it against a live daemon; it prints what it
saw as one JSON line.
"""

from __future__ import annotations

import json
import sys
import uuid
from datetime import datetime

from outboxd_client import AuthenticatedClient
from outboxd_client.api.admin import enqueue_task, get_stats, list_outbox
from outboxd_client.api.jobs import create_portal_link_job, get_job
from outboxd_client.models import (
    Job,
    JobOutboxItem,
    OutboxPage,
    PortalLinkAccepted,
    PortalLinkRequest,
    PortalLinkRequestPortal,
    QueueDepth,
    Stats,
    TaskAccepted,
    TaskRequest,
    TaskRequestType,
)


def when(at: datetime | None) -> str | None:
    return None if at is None else at.isoformat()


def main(base_url: str, token: str) -> dict[str, object]:
    with AuthenticatedClient(base_url=base_url, token=token) as client:
        accepted = create_portal_link_job.sync(
            client=client,
            body=PortalLinkRequest(
                portal=PortalLinkRequestPortal.SUWON, username="20201234", password="pw"
            ),
            idempotency_key=str(uuid.uuid4()),
        )
        assert isinstance(accepted, PortalLinkAccepted), accepted
        job = get_job.sync(str(accepted.job_id), client=client)
        assert isinstance(job, Job), job
        finished: datetime | None = job.finished_at
        created: datetime = job.created_at

        task = enqueue_task.sync(client=client, body=TaskRequest(type_=TaskRequestType.NOOP))
        assert isinstance(task, TaskAccepted), task

        page = list_outbox.sync(client=client, limit=100)
        assert isinstance(page, OutboxPage), page
        kinds: dict[str, str] = {}
        for item in page.items:
            if isinstance(item, JobOutboxItem):
                kinds[str(item.job_id)] = "job"
            else:
                kinds[item.task_id] = "task"
            next_at: datetime | None = item.next_attempt_at
            assert next_at is None or next_at.tzinfo is not None

        stats = get_stats.sync(client=client)
        assert isinstance(stats, Stats), stats
        jobs_waiting: int | None = None
        if stats.queues is not None and isinstance(stats.queues.jobs, QueueDepth):
            jobs_waiting = stats.queues.jobs.visible + stats.queues.jobs.in_flight
        oldest: float | None = stats.oldest_pending_age_seconds.jobs
        queued: int = stats.tables.jobs.additional_properties.get("QUEUED", 0)
        return {
            "job_id": str(job.job_id),
            "job_status": job.status.value,
            "finished": when(finished),
            "created_utc_offset": str(created.utcoffset()),
            "task_id": str(task.task_id),
            "kinds": kinds,
            "jobs_waiting": jobs_waiting,
            "oldest_pending_job_s": oldest,
            "queued_jobs": queued,
        }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
