"""The API's request and response bodies, defined once (msgspec Structs).

Each Struct is the single definition of one JSON body: its camelCase field names
(`rename="camel"`), its types, its limits (`Meta`) and its description. From it come

- the OpenAPI components (`openapi_components`, used by http/openapi.py);
- the request checks (http/checks.py), which read the same limits and answer with
  the field-by-field VALIDATION_FAILED messages the API has always used;
- the JSON the handlers send (`encode`; `to_builtins` for the dict renderers).

Patterns that a check implements in code rather than with a regex (the domain's IDNA
rules, "not blank") are documentation here and enforced by http/checks.py and the
handlers; a pattern is never the only guard.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Final, Literal

import msgspec
from msgspec import Meta, Struct

from outboxd.http.problems import PROBLEM_CODES, PROBLEM_TYPE, PROBLEMS, VALIDATION_FAILED
from outboxd.services.portal_jobs import PORTALS
from outboxd.services.tasks import BUILTIN_TASKS
from outboxd.storage.ports import CURSOR_PATTERN, JobStatus, RelayStatus, TaskStatus, WorkStatus

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
# What the document promises to accept as a domain: ASCII letter-digit-hyphen labels of
# 1-63 characters, no leading or trailing hyphen and no "--" in the 3rd and 4th place
# (the rules IDNA adds for ASCII labels, so never an invalid `xn--` label); two labels at
# least, the last starting with a letter. Every such name passes IDNA. IDN input
# (U-labels, valid A-labels) is accepted too and described in words.
_A: Final = "[A-Za-z0-9]"
_L: Final = "[A-Za-z0-9-]"
_LABEL_TAIL: Final = f"(?:{_L}?{_A})?|{_L}{_L}{_A}|{_L}(?:{_A}{_L}|-{_A}){_L}{{0,58}}{_A}"
HOST_NAME: Final = f"^(?:{_A}(?:{_LABEL_TAIL})\\.)+[A-Za-z](?:{_LABEL_TAIL})\\.?$"

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


_DATE_TIME: Final = Meta(extra_json_schema={"format": "date-time"})
_RFC3339: Final = " (RFC 3339, UTC, millisecond precision)."


Cursor = Annotated[str | None, Meta(description="Pass as `cursor` for the next page.")]


class _Body(Struct, rename="camel", forbid_unknown_fields=True):
    """Base of the bodies: camelCase on the wire, unknown fields refused."""


# ------------------------------------------------------------------ requests


class PortalLinkRequest(_Body):
    """Link a student's portal account; unknown fields are rejected."""

    portal: Annotated[PortalName, Meta(description="The portal.", extra={"max_length": 32})]
    username: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=64,
            pattern=VISIBLE_TEXT,
            description="Portal user id; not blank, no control characters.",
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
        ),
    ]


class WebsiteRequest(_Body):
    """Register a website (upsert by normalised domain); unknown fields are rejected."""

    domain: Annotated[
        str,
        Meta(
            min_length=1,
            max_length=253,
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
                pattern=f"^https?://[^{_CTRL}]*$",
                description="An http(s) URL, or null.",
            ),
        ]
        | None
    ) = None


class TaskPayload(Struct, forbid_unknown_fields=True):
    """The one payload field a built-in task reads."""

    older_than_days: Annotated[
        float,
        Meta(
            ge=0,
            le=36500,
            description="outbox.prune: the age of finished rows to delete (default 7); a "
            "finite number, never NaN or Infinity.",
        ),
    ] = 7


class TaskRequest(_Body):
    """Enqueue a task through the task outbox; unknown fields are rejected."""

    # The registry's order, not msgspec's sorted one: the enum lists the task types as
    # services/tasks.py does.
    type: Annotated[
        TaskType, Meta(extra_json_schema={"enum": list(BUILTIN_TASKS)}, extra={"max_length": 100})
    ]
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
# A bulk redrive names at most this many jobs, or redrives at most this many by status.
REDRIVE_MAX_IDS: Final = 500
REDRIVE_MAX_LIMIT: Final = 10_000


class JobRedriveRequest(_Body):
    """Redrive jobs in bulk: every job in `status` (at most `limit`), or the jobs named by
    `jobIds`; exactly one of the two. Unknown fields are rejected."""

    status: (
        Annotated[Literal["DEAD"], Meta(description="Every job in this state (newest first).")]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    job_ids: (
        Annotated[
            list[Annotated[str, Meta(pattern=JOB_ID_PATTERN)]],
            Meta(
                min_length=1,
                max_length=REDRIVE_MAX_IDS,
                description="These jobs; one that is not DEAD, unknown or whose credentials "
                "were erased is refused and changes nothing.",
            ),
        ]
        | msgspec.UnsetType
    ) = msgspec.UNSET
    limit: Annotated[
        int,
        Meta(
            ge=1,
            le=REDRIVE_MAX_LIMIT,
            description="With status: redrive at most this many (default 1000); `more` in "
            "the answer says whether any are left. Ignored with jobIds.",
        ),
    ] = 1000


# What JSON Schema says of JobRedriveRequest beyond its fields: status or jobIds, not both.
JOB_REDRIVE_ONE_OF: Final = [{"required": ["status"]}, {"required": ["jobIds"]}]


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


class JobError(Struct):
    """The last error; null once the job SUCCEEDED."""

    code: Annotated[
        str,
        Meta(
            description="PORTAL_AUTH_FAILED, PORTAL_UNAVAILABLE, PORTAL_SESSION_EXPIRED, "
            "PORTAL_BAD_RESPONSE or RETRIES_EXHAUSTED."
        ),
    ]
    message: str


class PortalStudent(Struct, rename="camel"):
    """The student's profile."""

    student_number: Annotated[str | None, Meta(description="Student number.")]
    name: Annotated[str | None, Meta(description="Name.")]
    college: Annotated[str | None, Meta(description="College.")]
    department: Annotated[str | None, Meta(description="Department.")]
    major: Annotated[str | None, Meta(description="Major.")]
    status: Annotated[str | None, Meta(description="Enrolment status, as the portal words it.")]
    year: Annotated[int | None, Meta(description="Year of study.")]


class PortalCourse(Struct, rename="camel"):
    """One course taken in a semester."""

    code: Annotated[str | None, Meta(description="Course code.")]
    title: Annotated[str | None, Meta(description="Course title.")]
    credits: Annotated[float | None, Meta(description="Credits.")]
    grade: Annotated[str | None, Meta(description="Letter grade (A+ ... F, or P).")]
    grade_points: Annotated[float | None, Meta(description="Grade points.")]
    category: Annotated[str | None, Meta(description="Category, e.g. 전공필수 or 교양선택.")]
    department: Annotated[str | None, Meta(description="Offering department.")]


class PortalSemester(Struct, rename="camel"):
    """One semester taken, with its courses."""

    year: Annotated[int | None, Meta(description="Academic year.")]
    term: Annotated[
        Literal["1", "summer", "2", "winter"],
        Meta(description="First, summer, second or winter term."),
    ]
    credits_attempted: Annotated[float | None, Meta(description="Credits attempted.")]
    credits_earned: Annotated[float | None, Meta(description="Credits earned.")]
    gpa: Annotated[float | None, Meta(description="Grade point average.")]
    percentile: Annotated[float | None, Meta(description="Percentile score.")]
    rank: Annotated[str | None, Meta(description='Rank in the department, e.g. "6/33".')]
    courses: list[PortalCourse]


class PortalTotals(Struct, rename="camel"):
    """Totals over all semesters."""

    credits_attempted: Annotated[float | None, Meta(description="Credits attempted.")]
    credits_earned: Annotated[float | None, Meta(description="Credits earned.")]
    gpa: Annotated[float | None, Meta(description="Grade point average.")]
    percentile: Annotated[float | None, Meta(description="Percentile score.")]


class PortalResult(Struct):
    """The academic record a SUCCEEDED portal job fetched."""

    student: PortalStudent
    semesters: list[PortalSemester]
    totals: PortalTotals


class Job(Struct, rename="camel"):
    """A portal link job, as its owner (or an admin) sees it."""

    job_id: Uuid
    kind: Literal["portal_link"]
    portal: PortalName
    status: JobStatus
    attempts: Annotated[int, Meta(ge=0, description="Processing attempts so far.")]
    created_at: Annotated[str, _DATE_TIME, Meta(description="When the job was accepted" + _RFC3339)]
    updated_at: Annotated[str, _DATE_TIME, Meta(description="Last change" + _RFC3339)]
    finished_at: Annotated[
        str | None,
        Meta(
            description="When it reached SUCCEEDED, FAILED or DEAD (RFC 3339, UTC, "
            "millisecond precision).",
            extra_json_schema={"format": "date-time"},
        ),
    ]
    # The stored JSON documents, rendered as they are (typed here for the document).
    progress: JobProgress | None
    error: JobError | None
    result: PortalResult | None


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
    enqueued_at: Annotated[str, _DATE_TIME, Meta(description="When it was enqueued" + _RFC3339)]
    finished_at: Annotated[
        str | None,
        Meta(
            description="When it finished (RFC 3339, UTC, millisecond precision).",
            extra_json_schema={"format": "date-time"},
        ),
    ]
    error: Annotated[str | None, Meta(description="Why it failed.")]


class OutboxItem(Struct, rename="camel", kw_only=True):
    """A relay outbox row (its payload is never shown): jobId for kind job, taskId for kind
    task."""

    id: Uuid
    kind: Literal["job", "task"]
    job_id: str | msgspec.UnsetType = msgspec.UNSET
    task_id: str | msgspec.UnsetType = msgspec.UNSET
    status: RelayStatus
    attempts: Annotated[int, Meta(ge=0, description="Publish attempts.")]
    next_attempt_at: Annotated[
        str | None,
        Meta(
            description="Next publish attempt; null unless PENDING or RETRYABLE_FAILED" + _RFC3339,
            extra_json_schema={"format": "date-time"},
        ),
    ]
    last_error: Annotated[str | None, Meta(description="The last publish error.")]
    message_id: Annotated[str | None, Meta(description="The SQS message id once published.")]
    created_at: Annotated[str, _DATE_TIME, Meta(description="When the row was created" + _RFC3339)]


# What JSON Schema says of OutboxItem beyond its fields: exactly one of jobId and taskId,
# the one its kind names.
OUTBOX_ITEM_ONE_OF: Final = [
    {
        "properties": {"kind": {"const": "job"}},
        "required": ["jobId"],
        "not": {"required": ["taskId"]},
    },
    {
        "properties": {"kind": {"const": "task"}},
        "required": ["taskId"],
        "not": {"required": ["jobId"]},
    },
]


class OutboxPage(Struct, rename="camel"):
    """Relay outbox rows, newest first."""

    items: list[OutboxItem]
    next_cursor: Cursor


class JobPage(Struct, rename="camel"):
    """Jobs, newest first."""

    items: list[Job]
    next_cursor: Cursor


class WebsitePage(Struct, rename="camel"):
    """Websites, newest first."""

    items: list[Website]
    next_cursor: Cursor


class TaskPage(Struct, rename="camel"):
    """Task runs, newest first."""

    items: list[TaskRun]
    next_cursor: Cursor


class RedriveRefusal(Struct, rename="camel"):
    """A job a bulk redrive did not redrive, and why."""

    job_id: str
    reason: str


class JobRedriveResult(Struct, rename="camel"):
    """What a bulk redrive did: each job is redriven (one transaction per hundred) or
    refused, and changes nothing when refused."""

    redriven: Annotated[int, Meta(ge=0, description="How many jobs went back to QUEUED.")]
    job_ids: Annotated[list[str], Meta(description="The jobs redriven, in order.")]
    refused: list[RedriveRefusal]
    more: Annotated[
        bool, Meta(description="The limit was reached and more jobs are in that state.")
    ]


class Health(Struct):
    """The event loop answers."""

    status: Literal["ok"]


class Readiness(Struct):
    """Whether the database and SQS answer."""

    status: Literal["ok", "unavailable"]
    checks: Annotated[dict[str, str], Meta(description='Component name -> "ok" or a short reason.')]


MODELS: Final = (
    Problem,
    FieldError,
    PortalLinkRequest,
    PortalLinkAccepted,
    Dispatch,
    Job,
    JobProgress,
    JobError,
    PortalResult,
    WebsiteRequest,
    Website,
    Classification,
    TaskRequest,
    TaskAccepted,
    JobRedriveRequest,
    JobRedriveResult,
    RedriveRefusal,
    TaskRun,
    TaskPage,
    OutboxPage,
    JobPage,
    WebsitePage,
    Health,
    Readiness,
)


def openapi_components(ref_prefix: str) -> dict[str, dict[str, Any]]:
    """The JSON Schema of every model, as OpenAPI components (refs under `ref_prefix`)."""
    _, components = msgspec.json.schema_components(MODELS, ref_template=ref_prefix + "{name}")
    for schema in components.values():
        schema.pop("title", None)
    components["OutboxItem"]["oneOf"] = OUTBOX_ITEM_ONE_OF
    components["JobRedriveRequest"]["oneOf"] = JOB_REDRIVE_ONE_OF
    # msgspec sorts a Literal's values; an enum given in Meta keeps its own order.
    for model in MODELS:
        info = msgspec.inspect.type_info(model)
        assert isinstance(info, msgspec.inspect.StructType)
        for f in info.fields:
            extra = getattr(f.type, "extra_json_schema", None) or {}
            if "enum" in extra:
                components[model.__name__]["properties"][f.encode_name]["enum"] = extra["enum"]
    return components


# ------------------------------------------------------------------ JSON out

_encoder = msgspec.json.Encoder()
encode = _encoder.encode


def to_builtins(value: Struct) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(value)
    return out
