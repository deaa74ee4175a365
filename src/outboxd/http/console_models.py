"""The console's admin reads: a job with its outbox rows, the stats and the runtime state
(msgspec Structs, like http/models.py, whose shared field types they use)."""

from __future__ import annotations

from typing import Annotated, Final, Literal

from msgspec import UNSET, Meta, Struct, UnsetType

from outboxd.http.models import (
    RFC3339,
    AdminJob,
    Count,
    DateTime,
    OutboxItem,
    Readiness,
    TaskType,
)
from outboxd.storage.ports import JobStatus, RelayStatus, TaskStatus, WorkStatus


class JobDetail(AdminJob):
    """A job with its owner and its relay outbox rows (admin view)."""

    outbox: Annotated[
        list[OutboxItem],
        Meta(
            max_length=20,
            description="The job's relay outbox rows, newest first (SUPERSEDED ones are the "
            "history of a redriven job).",
        ),
    ]


_StatusCounts = Annotated[dict[str, Count], Meta(description="Row count per status.")]
_Age = Annotated[float, Meta(ge=0)]


class TableCounts(Struct):
    """Row counts per table and status."""

    jobs: _StatusCounts
    relay_outbox: _StatusCounts
    work_outbox: _StatusCounts
    task_runs: _StatusCounts


class PendingAges(Struct):
    """Age in seconds of each table's oldest pending row; null when it has none."""

    jobs: _Age | None
    relay_outbox: _Age | None
    work_outbox: _Age | None
    task_runs: _Age | None


class PaceSlot(Struct, rename="camel"):
    """One pace row, on the database's clock (Unix seconds); pausedUntil is set by a 429's
    Retry-After."""

    last_slot_at: float | None
    next_slot_at: float | None
    next_slot_in_seconds: _Age
    paused_until: float | None
    paused_for_seconds: _Age
    sessions: Count
    database_now: float


class QueueDepth(Struct, rename="camel"):
    """Approximate message counts of one queue."""

    visible: Annotated[Count, Meta(description="Messages waiting to be received.")]
    in_flight: Annotated[Count, Meta(description="Messages received and not yet deleted.")]
    dlq: Annotated[Count, Meta(description="Messages in its dead-letter queue.")]


class QueueDepths(Struct):
    """SQS depth per queue, or only `error` when SQS did not answer."""

    jobs: QueueDepth | UnsetType = UNSET
    tasks: QueueDepth | UnsetType = UNSET
    error: Annotated[str, Meta(description="Why SQS did not answer.")] | UnsetType = UNSET


class Stats(Struct, rename="camel"):
    """Counts and ages (shared with `outboxd status` and /metrics)."""

    tables: TableCounts
    oldest_pending_age_seconds: PendingAges
    oldest_running_job_age_seconds: Annotated[
        _Age | None,
        Meta(
            description="Age in seconds (since it was accepted) of the oldest RUNNING job: "
            "published, waiting in SQS or being scraped; null when none runs."
        ),
    ]
    pace: Annotated[
        dict[str, PaceSlot],
        Meta(
            description="Cluster pace per resource (`ai`, `suwon`): the slots every instance "
            "shares; empty until a cluster-scope instance takes a slot."
        ),
    ]
    queues: Annotated[QueueDepths | None, Meta(description="Null without a queue.")]


class ClaimerPace(Struct, rename="camel"):
    """This process's claimer pace."""

    last_tick_at: Annotated[DateTime | None, Meta(description="When the last tick started.")]
    next_tick_at: Annotated[DateTime | None, Meta(description="When the next tick is due.")]
    paused_until: Annotated[
        DateTime | None,
        Meta(description="End of a provider-asked pause (429); null when not paused."),
    ]


class Schedule(Struct, rename="camel"):
    """One schedule."""

    name: str
    task: str
    next_fire_at: Annotated[DateTime, Meta(description="The next fire time" + RFC3339)]


class MinuteCount(Struct):
    """One minute."""

    minute: Annotated[DateTime, Meta(description="The minute's start" + RFC3339)]
    accepted: Annotated[Count, Meta(description="Jobs accepted.")]
    finished: Annotated[Count, Meta(description="Jobs that reached SUCCEEDED, FAILED or DEAD.")]
    failed: Annotated[Count, Meta(description="Of the finished, those now FAILED or DEAD.")]


class StatusNames(Struct):
    """Every status of each table, in their order of life (the console's status names)."""

    jobs: list[JobStatus]
    relay_outbox: list[RelayStatus]
    work_outbox: list[WorkStatus]
    task_runs: list[TaskStatus]


class Runtime(Struct, rename="camel"):
    """What only the running process knows: readiness, claimer pace, schedules, throughput."""

    now: Annotated[DateTime, Meta(description="The server's clock" + RFC3339)]
    readiness: Readiness
    claimer: Annotated[
        ClaimerPace | None, Meta(description="Null when this process runs no claimer.")
    ]
    schedules: Annotated[list[Schedule], Meta(description="This process's scheduler entries.")]
    throughput: Annotated[
        list[MinuteCount],
        Meta(
            description="Portal jobs accepted by this process's API and finished by its "
            "consumer, per minute over the last hour, oldest first (kept in memory; empty "
            "after a restart)."
        ),
    ]
    task_types: Annotated[
        list[TaskType],
        Meta(description="The built-in task types POST /v1/admin/tasks accepts."),
    ]
    statuses: Annotated[
        StatusNames, Meta(description="The status names of each table, as the API uses them.")
    ]
    user: Annotated[
        str, Meta(description="The caller (the console hides what its role cannot do).")
    ]
    role: Annotated[
        Literal["user", "viewer", "operator", "admin"], Meta(description="The caller's role.")
    ]


MODELS: Final = (JobDetail, Stats, Runtime)
