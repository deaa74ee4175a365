"""The API's request and response bodies, defined once (msgspec Structs).

Each Struct is the single definition of one JSON body: its camelCase field names
(`rename="camel"`), its types, its limits (`Meta`) and its description. From it come

- the OpenAPI components (http/openapi.py renders `MODELS`, and the console's
  `console_models.MODELS`, nothing by hand);
- the request checks (http/checks.py), which read the same limits and answer with
  the field-by-field VALIDATION_FAILED messages the API has always used;
- the JSON the handlers send (`encode`; `to_builtins` for the dict renderers).

Patterns that a check implements in code rather than with a regex (the domain's IDNA
rules in services/websites.py, "not blank") are documentation here and enforced by
http/checks.py and the services; a pattern is never the only guard.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal, TypeAlias

import msgspec
from msgspec import Meta, Struct

from outboxd.http.portal_models import PortalResult
from outboxd.http.problems import PROBLEM_CODES, PROBLEM_TYPE, PROBLEMS, VALIDATION_FAILED
from outboxd.services.portal_jobs import PORTALS
from outboxd.services.tasks import BUILTIN_TASKS
from outboxd.services.websites import HOST_NAME, MAX_DOMAIN_CHARS
from outboxd.storage.ports import (
    CURSOR_PATTERN,
    JobEventType,
    JobStatus,
    RelayStatus,
    TaskStatus,
    WorkStatus,
)

__all__ = ["CURSOR_PATTERN", "PROBLEM_TYPE"]

# ------------------------------------------------------------------ the shared rules

# An incoming X-Request-Id is echoed when it matches this, else replaced.
REQUEST_ID_PATTERN: Final = "^[A-Za-z0-9._:-]{1,128}$"
REQUEST_ID_RE: Final = re.compile(REQUEST_ID_PATTERN)
IDEMPOTENCY_KEY_PATTERN: Final = "^[!-~]{1,255}$"
IDEMPOTENCY_KEY_RE: Final = re.compile(IDEMPOTENCY_KEY_PATTERN)
# What SQS accepts as a MessageDeduplicationId: a task whose id holds anything else
# could never be sent to AWS.
DEDUP_ID_PATTERN: Final = "^[A-Za-z0-9!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]{1,128}$"
DEDUP_ID_RE: Final = re.compile(DEDUP_ID_PATTERN)
# No C0 or C1 control characters, no DEL; and not blank (the server strips whitespace
# before its emptiness check).
_CTRL: Final = "\\u0000-\\u001f\\u007f-\\u009f"
VISIBLE_TEXT: Final = f"^[^{_CTRL}]*[^\\s{_CTRL}][^{_CTRL}]*$"
# The same without bidirectional controls (U+202A-U+202E, U+2066-U+2069): every text field a
# person may read (http/inputs.py `bad_char` refuses them; only the password may hold them).
NO_CONTROLS: Final = _CTRL + "\\u202a-\\u202e\\u2066-\\u2069"
SHOWN_TEXT: Final = f"^[^{NO_CONTROLS}]*[^\\s{NO_CONTROLS}][^{NO_CONTROLS}]*$"
# A portal username as the login lock counts it, and so as intake takes it: printable ASCII
# without capital letters, no surrounding space. NFKC, stripping and case folding leave such
# a name unchanged, so no one person has two spellings (docs/decisions/0028-login-lock-per-user.md).
USERNAME_TEXT: Final = r"^[!-@\[-~]([ -@\[-~]*[!-@\[-~])?$"

if TYPE_CHECKING:
    PortalName = str
    TaskType = str
    ProblemCode = str
else:
    # The enums come from where portals and task types are defined.
    PortalName = Literal[PORTALS]
    TaskType = Literal[BUILTIN_TASKS]
    ProblemCode = Literal[PROBLEM_CODES]

# ------------------------------------------------------------------ field types

Uuid = Annotated[str, Meta(extra_json_schema={"format": "uuid"})]
Count = Annotated[int, Meta(ge=0)]


# A timestamp; `DateTime | None` keeps the format inside the nullable alternative, so a
# generated client reads both as a datetime.
DateTime = Annotated[str, Meta(extra_json_schema={"format": "date-time"})]
RFC3339: Final = " (RFC 3339, UTC, millisecond precision)."


Cursor = Annotated[str | None, Meta(description="Pass as `cursor` for the next page.")]


class Body(Struct, rename="camel", forbid_unknown_fields=True):
    """Base of the bodies: camelCase on the wire, unknown fields refused."""


# ------------------------------------------------------------------ requests


class PortalLinkRequest(Body):
    """Link a student's portal account; unknown fields are rejected."""

    portal: Annotated[PortalName, Meta(description="The portal.", extra={"max_length": 32})]
    username: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            pattern=USERNAME_TEXT,
            description="Portal user id in its one spelling: printable ASCII without capital "
            "letters and without surrounding spaces (a student number is); any other form "
            "(other scripts, full-width or capital letters) is refused, since the login lock "
            "counts a person by this name.",
        ),
    ]
    password: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=256,
            pattern=VISIBLE_TEXT,
            description="Portal password; encrypted at rest and never echoed.",
            extra_json_schema={"format": "password", "writeOnly": True},
            extra={"allow_bidi": True},
        ),
    ]


class WebsiteRequest(Body):
    """Register a website (upsert by normalised domain); unknown fields are rejected."""

    domain: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=MAX_DOMAIN_CHARS,
            pattern=HOST_NAME,
            description="A bare host name: lowercased, IDNA-encoded, one trailing dot dropped. "
            "The pattern states the ASCII names every IDNA implementation accepts; an "
            "internationalised name (U-labels or valid xn-- A-labels) is accepted too and "
            "stored in its ASCII form. A scheme, path, port, IP address, empty label or "
            "label over 63 characters is rejected "
            f"({VALIDATION_FAILED.status} {VALIDATION_FAILED.code}), not stripped.",
        ),
    ]
    favicon_url: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=2048,
                pattern=f"^https?://[^{NO_CONTROLS}]*$",
                description="An http(s) URL, or null; no control or bidirectional control "
                "characters.",
            ),
        ]
        | None
    ) = None


class TaskPayload(Struct, forbid_unknown_fields=True):
    """The one payload field a built-in task reads."""

    older_than_days: (
        Annotated[
            float,
            Meta(
                ge=0,
                le=36500,
                description="outbox.prune: for this run, the age in days past which finished "
                "history goes, instead of retention.finished_s; a finite number, never NaN or "
                "Infinity.",
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET


class TaskRequest(Body):
    """Enqueue a task through the task outbox; unknown fields are rejected."""

    type: Annotated[TaskType, Meta(extra={"max_length": 100})]
    payload: TaskPayload = msgspec.field(default_factory=TaskPayload)
    dedup_id: (
        Annotated[
            str,
            Meta(
                min_length=1,
                max_length=128,
                pattern=DEDUP_ID_PATTERN,
                description="Deduplication id; defaults to the task id.",
            ),
        ]
        | None
    ) = None


# A job id as the API issues it (a UUID, lowercase).
JOB_ID_PATTERN: Final = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
JOB_ID_RE: Final = re.compile(JOB_ID_PATTERN)
# ------------------------------------------------------------------ responses


class FieldError(Struct):
    """One invalid field."""

    field: str
    message: str


class Problem(Struct, rename="camel", omit_defaults=True):
    """RFC 9457 problem details. Never echoes secrets."""

    type: Annotated[
        str,
        Meta(
            description="urn:outboxd:problem:<NAME>, e.g. urn:outboxd:problem:VALIDATION_FAILED.",
            extra_json_schema={"format": "uri"},
        ),
    ]
    title: str
    status: Annotated[int, Meta(ge=400, le=599)]
    detail: str
    code: Annotated[
        ProblemCode,
        Meta(description=", ".join(f"{p.code} {p.name}" for p in PROBLEMS) + "."),
    ]
    request_id: Annotated[str, Meta(description="Also in X-Request-Id.")]
    errors: Annotated[
        list[FieldError] | None, Meta(description="Present for validation failures.")
    ] = None


class Dispatch(Struct, rename="camel"):
    """The job's relay outbox row after the synchronous publish attempt."""

    outbox_id: Uuid
    status: Annotated[RelayStatus, Meta(description="Relay outbox state.")]
    message_id: Annotated[str | None, Meta(description="The SQS message id once published.")]


class PortalLinkAccepted(Struct, rename="camel"):
    """Normally RUNNING/SENT; QUEUED with a RETRYABLE_FAILED row when the publish failed and
    the relay will deliver it later."""

    job_id: Uuid
    status: JobStatus
    dispatch: Dispatch | None


class JobProgress(Struct):
    """Where a running job is."""

    step: Annotated[str, Meta(description="LOGIN, SSO, PROFILE, SEMESTERS or GRADES.")]
    done: Annotated[
        int, Meta(ge=0, description="Units done in this step (semesters fetched in GRADES).")
    ]
    total: Annotated[int, Meta(ge=0, description="Units in this step (0 when not counted).")]


class JobError(Struct, rename="camel"):
    """The last error; null once the job SUCCEEDED."""

    code: Annotated[
        str,
        Meta(
            description="PORTAL_AUTH_FAILED, PORTAL_LOGIN_LOCKED, PORTAL_UNAVAILABLE, "
            "PORTAL_SESSION_EXPIRED, PORTAL_BAD_RESPONSE, HANDLER_ERROR, "
            "CREDENTIALS_UNREADABLE or RETRIES_EXHAUSTED."
        ),
    ]
    message: str
    locked_until: (
        Annotated[
            DateTime,
            Meta(
                description="PORTAL_LOGIN_LOCKED only: when this user's lock on the portal "
                "username runs out; a job submitted after it is tried" + RFC3339
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET


class WaitingFor(Struct):
    """What a job waits for before it runs again."""

    dependency: Annotated[Literal["portal", "ai", "sqs"], Meta(description="The outside system.")]
    state: Annotated[
        Literal["login_throttled", "login_busy", "down", "maintenance", "paused"],
        Meta(
            description="login_throttled: the portal username had too many failed logins; "
            "its jobs try one login at a time, spaced by a doubling delay. login_busy: "
            "the same user's other jobs for the username are logging in (should they all "
            "fail, this one would be locked); it looks again shortly. down: the "
            "system stopped answering (its breaker is open; one probe at a time). "
            "maintenance: inside a configured maintenance window. paused: an operator "
            "paused calls to it."
        ),
    ]
    until: Annotated[
        DateTime | None,
        Meta(description="When it is tried next, null when unknown" + RFC3339),
    ]


class Job(Struct, rename="camel"):
    """A portal link job, as its owner (or an admin) sees it."""

    job_id: Uuid
    kind: Literal["portal_link"]
    portal: PortalName
    status: JobStatus
    attempts: Annotated[int, Meta(ge=0, description="Processing attempts so far.")]
    created_at: Annotated[DateTime, Meta(description="When the job was accepted" + RFC3339)]
    updated_at: Annotated[DateTime, Meta(description="Last change" + RFC3339)]
    finished_at: Annotated[
        DateTime | None,
        Meta(description="When it reached SUCCEEDED, FAILED, DEAD or CANCELLED" + RFC3339),
    ]
    # The stored JSON documents, rendered as they are (typed here for the document).
    progress: JobProgress | None
    error: JobError | None
    result: PortalResult | None
    result_hidden: Annotated[
        bool,
        Meta(
            description="true: the job is another user's and only an admin reads its result "
            "(a student's academic record): `result` is null."
        ),
    ]
    waiting_for: Annotated[
        WaitingFor | None,
        Meta(description="Set while the job waits for an outside system, else null."),
    ]
    cancel_requested: Annotated[
        bool,
        Meta(
            description="A cancel was requested (POST /v1/jobs/{jobId}/cancel): a RUNNING job "
            "stops before its next portal request and ends CANCELLED; true on every CANCELLED "
            "job."
        ),
    ]


class JobEvent(Struct, rename="camel"):
    """One entry of a job's timeline: what happened, and the job's state right after it."""

    seq: Annotated[int, Meta(ge=1, description="Orders the job's events; increasing, with gaps.")]
    at: Annotated[DateTime, Meta(description="When it happened" + RFC3339)]
    type: Annotated[
        JobEventType,
        Meta(
            description="accepted, dispatched (detail: messageId, outboxId), dispatch_failed "
            "(error), started (receiveCount), progress (step, done, total), retry_scheduled "
            "(code, delayS), released (given back at a shutdown), succeeded, failed (code), "
            "dead (code), redriven (outboxId), cancel_requested and cancelled (by: owner, "
            "admin or consumer), parked (dependency, state, waitS, outboxId), waiting "
            "(dependency, state, outboxId: the job waits for an outside system that is away) "
            "and resumed (dependency, state: its run starts again)."
        ),
    ]
    status: Annotated[JobStatus, Meta(description="The job's status after the event.")]
    attempt: Annotated[int, Meta(ge=0, description="The job's processing attempts after it.")]
    instance: Annotated[
        str, Meta(description="The daemon that recorded it (its daemon.instance_id).")
    ]
    detail: Annotated[
        dict[str, Any] | None, Meta(description="What the type names, or null; never a secret.")
    ]


class JobTimeline(Struct, rename="camel"):
    """A job's events, oldest first (at most 1000 per answer: ask again with `after`)."""

    job_id: Uuid
    events: list[JobEvent]


class Classification(Struct, rename="camel"):
    """The website's classification work."""

    status: Annotated[WorkStatus | None, Meta(description="The classification work row's state.")]
    attempts: Annotated[int, Meta(ge=0, description="Classification attempts so far.")]
    last_error: Annotated[str | None, Meta(description="The last classification error.")]


class Website(Struct, rename="camel"):
    """A registered website and its category."""

    id: Uuid
    domain: Annotated[str, Meta(description="The normalised (ASCII, lowercase) host name.")]
    favicon_url: Annotated[str | None, Meta(description="The favicon URL given at registration.")]
    category: Annotated[str | None, Meta(description="The category, once classified.")]
    classification: Classification


class TaskAccepted(Struct, rename="camel"):
    """The enqueued task."""

    task_id: Uuid


class TaskRun(Struct, rename="camel"):
    """One task run."""

    task_id: Uuid
    type: str
    dedup_id: str
    status: TaskStatus
    enqueued_at: Annotated[DateTime, Meta(description="When it was enqueued" + RFC3339)]
    finished_at: Annotated[DateTime | None, Meta(description="When it finished" + RFC3339)]
    error: Annotated[str | None, Meta(description="Why it failed.")]


# Closed (additionalProperties: false in the document): a row with the other kind's id
# matches neither variant.
class _OutboxItem(
    Struct, rename="camel", kw_only=True, forbid_unknown_fields=True, tag_field="kind"
):
    """What every relay outbox row shows (its payload is never shown)."""

    id: Uuid
    status: RelayStatus
    attempts: Annotated[int, Meta(ge=0, description="Publish attempts.")]
    next_attempt_at: Annotated[
        DateTime | None,
        Meta(description="Next publish attempt; null unless PENDING or RETRYABLE_FAILED" + RFC3339),
    ]
    last_error: Annotated[str | None, Meta(description="The last publish error.")]
    message_id: Annotated[str | None, Meta(description="The SQS message id once published.")]
    created_at: Annotated[DateTime, Meta(description="When the row was created" + RFC3339)]


class JobOutboxItem(_OutboxItem, tag="job"):
    """A relay outbox row that publishes a portal job."""

    job_id: Uuid


class TaskOutboxItem(_OutboxItem, tag="task"):
    """A relay outbox row that publishes a task run."""

    task_id: str


# A relay outbox row: its `kind` says which id it carries.
OutboxItem: TypeAlias = JobOutboxItem | TaskOutboxItem


class OutboxPage(Struct, rename="camel"):
    """Relay outbox rows, newest first."""

    items: list[OutboxItem]
    next_cursor: Cursor


class AdminJob(Job):
    """A job as an admin sees it: with its owner."""

    user: Annotated[str, Meta(description="The job's owner: the user of the token that made it.")]


class JobPage(Struct, rename="camel"):
    """Jobs, newest first."""

    items: list[AdminJob]
    next_cursor: Cursor


class WebsitePage(Struct, rename="camel"):
    """Websites, newest first."""

    items: list[Website]
    next_cursor: Cursor


class TaskPage(Struct, rename="camel"):
    """Task runs, newest first."""

    items: list[TaskRun]
    next_cursor: Cursor


class Health(Struct):
    """The event loop answers."""

    status: Literal["ok"]


class Readiness(Struct):
    """Whether the database and SQS answer."""

    status: Literal["ok", "unavailable"]
    checks: Annotated[dict[str, str], Meta(description='Component name -> "ok" or a short reason.')]


class OpenApiDocument(Struct):
    """An OpenAPI 3.1 document (this one)."""

    openapi: str
    info: dict[str, Any]
    paths: dict[str, Any]


MODELS: Final = (
    Problem,
    FieldError,
    PortalLinkRequest,
    PortalLinkAccepted,
    Dispatch,
    Job,
    JobProgress,
    JobError,
    WaitingFor,
    JobEvent,
    JobTimeline,
    PortalResult,
    WebsiteRequest,
    Website,
    Classification,
    TaskRequest,
    TaskAccepted,
    TaskRun,
    TaskPage,
    JobOutboxItem,
    TaskOutboxItem,
    OutboxPage,
    JobPage,
    WebsitePage,
    Health,
    Readiness,
    OpenApiDocument,
)

# ------------------------------------------------------------------ JSON out

_encoder = msgspec.json.Encoder()
encode = _encoder.encode


def to_builtins(value: Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(value)
    return out
