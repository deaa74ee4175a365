"""What the core asks of storage: records, and one Protocol per concern.

`storage.store.SqlStore` implements all of them on SQLite and Postgres; mypy
checks that it does (see the assignments in storage/store/__init__.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Generic, Literal, Protocol, TypeVar, get_args

from outboxd.errors import InvalidState, NotFound
from outboxd.storage.login_ports import LoginFailure

JobStatus = Literal["QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD", "CANCELLED"]
# SUPERSEDED: a DEAD row whose job was redriven since (a fresh row carries the retry): kept
# as history, no longer a dead letter.
RelayStatus = Literal["PENDING", "SENT", "RETRYABLE_FAILED", "DEAD", "SUPERSEDED"]
WorkStatus = Literal["PENDING", "PROCESSING", "COMPLETED", "FAILED"]
TaskStatus = Literal["PENDING", "SENT", "SUCCEEDED", "FAILED", "DEAD"]
# What a job's timeline records (GET /v1/jobs/{id}/events): one event per change of the job,
# committed with the change.
JobEventType = Literal[
    "accepted",
    "dispatched",
    "dispatch_failed",
    "started",
    "progress",
    "retry_scheduled",
    "released",
    "succeeded",
    "failed",
    "dead",
    "redriven",
    "cancel_requested",
    "cancelled",
    "parked",
    "waiting",
    "resumed",
]
# The one spelling of each status set: the API's filters, the OpenAPI enums and the
# CLI's choices all read these tuples.
JOB_STATUSES: Final[tuple[JobStatus, ...]] = get_args(JobStatus)
RELAY_STATUSES: Final[tuple[RelayStatus, ...]] = get_args(RelayStatus)
WORK_STATUSES: Final[tuple[WorkStatus, ...]] = get_args(WorkStatus)
TASK_STATUSES: Final[tuple[TaskStatus, ...]] = get_args(TaskStatus)
JOB_EVENT_TYPES: Final[tuple[JobEventType, ...]] = get_args(JobEventType)
TERMINAL_JOB_STATUSES: Final[tuple[JobStatus, ...]] = ("SUCCEEDED", "FAILED", "DEAD", "CANCELLED")
TERMINAL_TASK_STATUSES: Final[tuple[TaskStatus, ...]] = ("SUCCEEDED", "FAILED", "DEAD")
# Relay rows not on the queue yet: the ones a publish (now or by the relay loop) takes.
RELAY_UNSENT_STATUSES: Final[tuple[RelayStatus, ...]] = ("PENDING", "RETRYABLE_FAILED")
# Every status of every table, by table name (the stats, /metrics and `outboxd status`).
TABLE_STATUSES: Final[Mapping[str, tuple[str, ...]]] = {
    "jobs": JOB_STATUSES,
    "relay_outbox": RELAY_STATUSES,
    "work_outbox": WORK_STATUSES,
    "task_runs": TASK_STATUSES,
}
T = TypeVar("T")
# A wall clock (Unix seconds), passed where a transaction must read the time itself.
Clock = Callable[[], float]


@dataclass(frozen=True)
class JobRecord:
    id: str
    kind: str
    portal: str
    user_id: str
    idempotency_key: str
    fingerprint: str
    status: JobStatus
    attempts: int
    key_id: str | None
    sealed: bytes | None
    lease_until: float | None
    progress: Mapping[str, Any] | None
    error_code: str | None
    error_message: str | None
    result: Mapping[str, Any] | None
    created_at: float
    updated_at: float
    finished_at: float | None
    version: int
    # Set by a cancel; a worker holding the job stops at its next portal request.
    cancel_requested: bool = False
    # W3C trace context (`traceparent`) the job was accepted with, or the one it started.
    traceparent: str | None = None
    # Parked (services/parking.py): QUEUED until `wait_until`, waiting for `wait_for`
    # ({"dependency", "state"}); only the message of outbox row `wait_outbox_id` starts it.
    wait_until: float | None = None
    wait_for: Mapping[str, Any] | None = None
    wait_outbox_id: str | None = None
    # PORTAL_LOGIN_LOCKED: when the lock it ended with runs out.
    locked_until: float | None = None

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_JOB_STATUSES


@dataclass(frozen=True)
class RelayRow:
    id: str
    kind: Literal["job", "task"]
    job_id: str | None
    task_id: str | None
    status: RelayStatus
    attempt_count: int
    next_attempt_at: float
    last_error: str | None
    queue_message_id: str | None
    dedup_id: str
    created_at: float
    sent_at: float | None
    claimed_until: float | None
    version: int
    # The job's trace context, sent with the message as an SQS message attribute.
    traceparent: str | None = None


@dataclass(frozen=True)
class NewPortalJob:
    job_id: str
    outbox_id: str
    user_id: str
    idempotency_key: str
    fingerprint: str
    portal: str
    key_id: str
    sealed: bytes
    # Set when the request publishes the row itself right after the commit: the row is
    # inserted already claimed (its first attempt, leased until then), so the publish
    # needs no claim transaction. A crash before the publish leaves the lease to expire
    # and the row to the relay loop.
    claimed_until: float | None = None
    traceparent: str | None = None
    login_subject: str | None = None  # the username's keyed hash (security.py login_subject)


@dataclass(frozen=True)
class JobIntake:
    """What `create_portal_job` found or made: the job and its newest outbox row."""

    job: JobRecord
    outbox: RelayRow | None
    created: bool

    @property
    def replayed(self) -> bool:
        """The idempotency key's earlier job was found: nothing new was made."""
        return not self.created


@dataclass(frozen=True)
class JobEvent:
    """One entry of a job's timeline: what happened, and the job's status and attempts after it."""

    job_id: str
    seq: int  # orders a job's events; increasing, not contiguous
    at: float
    type: JobEventType
    status: JobStatus
    attempt: int
    instance: str  # the daemon (daemon.instance_id) that recorded it
    detail: Mapping[str, Any] | None


@dataclass(frozen=True)
class NewEvent:
    """An event to record with a job change; status and attempt come from the changed row."""

    type: JobEventType
    at: float
    detail: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class ProgressStep:
    """One step a run reported (`{"step", "done", "total"}`) and when. A worker holds the
    steps that come within `consumer.progress_interval_s` of its last write and writes
    them, each as its own `progress` event with its own time, with the job's next write
    (workers/progress.py, docs/decisions/0037-progress-written-per-interval.md)."""

    at: float
    progress: Mapping[str, Any]


def redriven_event(at: float, outbox_id: str, by: str | None) -> NewEvent:
    """A redrive's event: the fresh outbox row, and who asked for it when known."""
    detail: dict[str, Any] = {"outboxId": outbox_id}
    if by is not None:
        detail["by"] = by
    return NewEvent("redriven", at, detail)


CancelOutcome = Literal["cancelled", "requested", "unchanged"]


@dataclass(frozen=True)
class JobFilter:
    """The admin's search over jobs; each field applies when set (created times: [from, to))."""

    status: str | None = None
    user_id: str | None = None
    error_code: str | None = None
    created_from: float | None = None
    created_to: float | None = None
    login_subject: str | None = None  # a portal username's keyed hash: an equality


@dataclass(frozen=True)
class TaskRun:
    id: str
    type: str
    payload: Mapping[str, Any]
    dedup_id: str
    status: TaskStatus
    error: str | None
    enqueued_at: float
    finished_at: float | None
    version: int


@dataclass(frozen=True)
class RelayFailure:
    """A failed publish to record: the row backs off, or (`dead`) gives up.

    A dead job row takes its job with it, and `job_error` is what the job records:
    the relay decides it (see `daemon.relay.publish_failure`), storage only writes it.
    """

    row: RelayRow
    error: str
    next_attempt_at: float
    dead: bool
    job_error: tuple[str, str] | None = None
    # False: SQS was not reached (an outage), and the attempt the claim counted is given back.
    counted: bool = True

    def __post_init__(self) -> None:
        if self.dead and self.row.job_id is not None and self.job_error is None:
            raise ValueError("a dead job row needs the error its job records")


@dataclass(frozen=True)
class StatusCount:
    table: str
    status: str
    count: int
    oldest_created_at: float | None


@dataclass(frozen=True)
class PaceSlot:
    """A start time handed out by a pace row, and the database's clock when it was."""

    slot: float
    now: float
    paused_until: float

    @property
    def wait_s(self) -> float:
        return max(0.0, self.slot - self.now)


@dataclass(frozen=True)
class PaceState:
    """One pace row as the operator sees it; `now` is the database's clock."""

    name: str
    last_at: float | None
    next_at: float
    paused_until: float
    now: float
    sessions: int = 0

    @property
    def paused_for_s(self) -> float:
        return max(0.0, self.paused_until - self.now)


@dataclass(frozen=True)
class PaceLease:
    name: str
    slot: int
    holder: str
    expires_at: float


@dataclass(frozen=True)
class Page(Generic[T]):
    items: Sequence[T]
    next_cursor: str | None


# `<created_at as Python's repr of a float>_<row id>`. Every string this pattern
# matches decodes to a finite time and a plausible id (so the OpenAPI document can
# state it exactly); anything else is refused before it reaches a query.
CURSOR_PATTERN = r"^[0-9]{1,17}(?:\.[0-9]{1,17})?(?:e[-+]?[0-9]{1,2})?_[A-Za-z0-9-]{1,64}$"
_CURSOR_RE = re.compile(CURSOR_PATTERN)


def encode_cursor(created_at: float, row_id: str) -> str:
    """The keyset cursor of a `Page`: the last item's creation time and id."""
    return f"{float(created_at)!r}_{row_id}"


def decode_cursor(cursor: str | None) -> tuple[float | None, str | None]:
    """A cursor from `encode_cursor`; ValueError for anything else (forged cursors too)."""
    if not cursor:
        return None, None
    if not _CURSOR_RE.match(cursor):
        raise ValueError("cursor is not one this server issued")
    created, _, row_id = cursor.partition("_")
    when = float(created)
    if not math.isfinite(when):  # pragma: no cover - the pattern bounds the exponent
        raise ValueError("cursor is not one this server issued")
    return when, row_id


class JobStore(Protocol):
    async def create_portal_job(
        self, new: NewPortalJob, now: float, max_active: int = 0
    ) -> JobIntake:
        """The job and its outbox row, or the job the user's key names already (a replay).
        `max_active` > 0: CapReached, writing nothing, when the user has that many QUEUED or
        RUNNING jobs, counted in the intake's own transaction (a replay never is)."""
        ...

    async def get_job(self, job_id: str) -> JobRecord | None: ...
    async def latest_relay_row_for_job(self, job_id: str) -> RelayRow | None: ...
    async def get_job_and_relay_row(
        self, job_id: str, outbox_id: str
    ) -> tuple[JobRecord | None, RelayRow | None]:
        """A job and one of its outbox rows, read together (one hop, one snapshot)."""
        ...

    async def start_job_run(
        self,
        job_id: str,
        now: float,
        lease_s: float,
        receive_count: int | None = None,
        outbox_id: str | None = None,
    ) -> JobRecord | None:
        """A lease on the job, RUNNING (a parked one only for its own row's message)."""
        ...

    async def park_job(
        self, job: JobRecord, outbox_id: str, until: float, wait_for: Mapping[str, Any], now: float
    ) -> JobRecord | None:
        """A RUNNING job QUEUED until `until`, waiting for `wait_for`, with a fresh outbox
        row due then (the only message that starts it again); None: no longer ours."""
        ...

    async def extend_job_lease(self, job: JobRecord, lease_until: float) -> bool: ...
    async def update_job_progress(
        self,
        job: JobRecord,
        progress: Mapping[str, Any],
        now: float,
        held: Sequence[ProgressStep] = (),
    ) -> JobRecord | None:
        """The job's progress, with a `progress` event for each step `held` (in order,
        before this one's) and for this one, in one transaction; the job after the write
        (`cancel_requested` tells a worker to stop); None when the guard refused it."""
        ...

    async def finish_job(
        self,
        job: JobRecord,
        status: Literal["SUCCEEDED", "FAILED"],
        now: float,
        result: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
        login_failure: LoginFailure | None = None,
        login_success: str | None = None,
        locked_until: float | None = None,
        progress: Sequence[ProgressStep] = (),
    ) -> JobRecord | None:
        """The job's outcome; in its transaction (when written) `login_failure` is counted,
        or `login_success`'s (a subject's) failures and throttle are forgotten.
        `locked_until`: when the PORTAL_LOGIN_LOCKED it ends with runs out. `progress`: the
        steps the run held since its last progress write, their events before the
        outcome's; the job's progress becomes the last of them."""
        ...

    async def job_retry_later(
        self, job: JobRecord, error: tuple[str, str], now: float, delay_s: float | None = None
    ) -> JobRecord | None: ...
    async def release_job_lease(self, job: JobRecord, now: float) -> bool: ...
    async def mark_job_dead(
        self, job_id: str, error: tuple[str, str], now: float
    ) -> JobRecord | None: ...
    async def redrive_job(
        self, job_id: str, outbox_id: str, now: float, by: str | None = None
    ) -> JobRecord:
        """A DEAD job back to QUEUED with a fresh outbox row, its DEAD rows SUPERSEDED;
        NotFound or InvalidState. `by` (who asked) goes into the `redriven` event."""
        ...

    async def redrive_jobs(
        self, jobs: Sequence[tuple[str, str]], now: float, by: str | None = None
    ) -> list[JobRecord | NotFound | InvalidState]:
        """`redrive_job` for each (job id, fresh outbox id), in one transaction; each
        outcome in order (a refusal changes nothing and stops none of the others)."""
        ...

    async def cancel_job(self, job_id: str, now: float, by: str) -> tuple[JobRecord, CancelOutcome]:
        """Cancel a job at once when nobody runs it (QUEUED, or RUNNING without a live lease:
        its unsent outbox rows deleted, its credentials erased), else flag it for the worker
        holding it. NotFound; InvalidState for a job that finished otherwise."""
        ...

    async def finish_cancelled(self, job: JobRecord, now: float) -> JobRecord | None:
        """The worker holding a job whose cancel was requested stopped: CANCELLED."""
        ...

    async def job_events(
        self, job_id: str, after: int = 0, limit: int = 1000
    ) -> list[JobEvent]: ...
    async def list_jobs(
        self, status: str | None, limit: int, cursor: str | None, where: JobFilter | None = None
    ) -> Page[JobRecord]: ...


class JobChangeStore(Protocol):
    """What a daemon needs to learn that jobs changed in another process."""

    async def job_event_marks(self, job_ids: Sequence[str]) -> dict[str, int]:
        """The newest event's seq of each of `job_ids` that has events."""
        ...

    async def newest_job_event(self) -> int | None:
        """The newest event's seq of any job (None: no events)."""
        ...

    def listen_job_changes(
        self, on_change: Callable[[str], None]
    ) -> contextlib.AbstractAsyncContextManager[Listening] | None:
        """Where the database pushes changes (Postgres LISTEN): a context holding one
        listening connection that calls `on_change(job_id)` per notification. None where
        it cannot (SQLite: poll instead)."""
        ...


class Listening(Protocol):
    """One listening connection, as `JobChangeStore.listen_job_changes` holds it."""

    @property
    def lost(self) -> asyncio.Event:
        """Set once the connection is gone (its notifications with it)."""
        ...

    async def ping(self) -> None:
        """A round trip on the connection: StorageUnavailable (and `lost` set) if it is dead."""
        ...

        ...


class RelayStore(Protocol):
    async def claim_relay_due(self, now: float, limit: int, lease_s: float) -> list[RelayRow]: ...
    async def claim_relay_row(
        self, outbox_id: str, now: float, lease_s: float
    ) -> RelayRow | None: ...
    async def mark_relay_sent(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> list[RelayRow]: ...
    async def mark_relay_failed(self, failures: Sequence[RelayFailure], now: float) -> None: ...
    async def claim_relay_rows(
        self, outbox_ids: Sequence[str], now: float, lease_s: float
    ) -> list[RelayRow]:
        """Claim those of the rows that are due and not leased, in one transaction."""
        ...

    async def record_relay_outcome(
        self, sent: Sequence[tuple[RelayRow, str]], failures: Sequence[RelayFailure], now: float
    ) -> list[RelayRow]:
        """`mark_relay_sent` and `mark_relay_failed` in one transaction; the rows now SENT."""
        ...

    async def record_relay_outcome_and_claim_due(
        self,
        sent: Sequence[tuple[RelayRow, str]],
        failures: Sequence[RelayFailure],
        now: float,
        limit: int,
        lease_s: float,
    ) -> tuple[list[RelayRow], list[RelayRow]]:
        """`record_relay_outcome`, then `claim_relay_due` (none when `limit` is 0), in one
        transaction: the relay loop's one commit per round. (The rows now SENT, the claimed.)"""
        ...

    async def get_relay_row(self, outbox_id: str) -> RelayRow | None: ...
    async def redrive_relay_row(
        self, outbox_id: str, now: float, by: str | None = None
    ) -> RelayRow: ...
    async def list_relay_rows(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[RelayRow]: ...
    async def relay_rows_for_job(self, job_id: str, limit: int) -> list[RelayRow]: ...


class TaskStore(Protocol):
    async def enqueue_task(
        self,
        task_id: str,
        outbox_id: str,
        type_: str,
        payload: Mapping[str, Any],
        dedup_id: str,
        now: float,
    ) -> tuple[TaskRun, bool]: ...
    async def get_task(self, task_id: str) -> TaskRun | None: ...
    async def finish_task(
        self, task_id: str, status: Literal["SUCCEEDED", "FAILED"], error: str | None, now: float
    ) -> TaskRun | None: ...
    async def list_tasks(
        self, type_: str | None, limit: int, cursor: str | None
    ) -> Page[TaskRun]: ...


class StatsStore(Protocol):
    async def status_counts(self) -> list[StatusCount]: ...
    async def pace_states(self, now: float) -> list[PaceState]: ...


class PaceStore(Protocol):
    """Cluster pacing: slots and session leases shared by every instance on one database.

    Times come from the database (Postgres) or the one host holding the file
    (SQLite); callers only ever use differences against the returned `now`. The `now`
    a caller passes is its own clock: SQLite's time, which Postgres ignores.
    """

    async def pace_ensure(self, name: str, lease_slots: int = 0) -> None: ...
    # The writes take the caller's clock and read it inside their transaction: on SQLite
    # a slot is decided only once the write lock is held, so a wait for the lock cannot make
    # the time it records stale (Postgres reads clock_timestamp() in the statement instead).
    async def pace_take(self, name: str, delay_s: float, clock: Clock) -> PaceSlot: ...
    async def pace_pause(self, name: str, pause_s: float, clock: Clock) -> PaceState: ...
    async def pace_state(self, name: str, now: float) -> PaceState | None: ...
    async def lease_take(
        self, name: str, holder: str, limit: int, lease_s: float, clock: Clock
    ) -> PaceLease | None: ...
    async def lease_renew(self, lease: PaceLease, lease_s: float, clock: Clock) -> bool: ...
    async def lease_release(self, lease: PaceLease) -> bool: ...


class PruneStore(Protocol):
    async def prune(
        self,
        finished_before: float,
        dead_before: float,
        credentials_before: float,
        batch: int,
    ) -> dict[str, int]:
        """History finished before `finished_before` (DEAD jobs: `dead_before`; a DEAD
        job's credentials: `credentials_before`) deleted, at most `batch` rows a
        transaction; how many rows of each kind went."""
        ...

    async def give_back_space(self) -> int:
        """The database file's free pages given back to the file system (SQLite's
        incremental vacuum, a few megabytes a transaction); how many. 0 on Postgres."""
        ...
