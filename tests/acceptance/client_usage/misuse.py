"""Mistakes the generated client's types must catch (each line commented as wrong is one
`mypy --strict` error): proof that the fields are typed, not `Any`."""

from __future__ import annotations

from outboxd_client.models import Job, OutboxPage, Stats


def misuse(job: Job, page: OutboxPage, stats: Stats) -> None:
    finished: str = job.finished_at  # wrong: a datetime or None
    for item in page.items:
        print(item.job_id)  # wrong: a task row has no job id
    print(stats.queues.jobs)  # wrong: null without a queue
    age: int = stats.oldest_pending_age_seconds.jobs  # wrong: a float or None
    print(finished, age)
