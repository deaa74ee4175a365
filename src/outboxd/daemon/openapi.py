"""The OpenAPI 3.1 document served at `GET /openapi.json`.

It describes the routes exactly as `outboxd.daemon.api` implements them: the
handlers' status codes and the renderers' (`job_body`, `relay_item`, ...) shapes.
Nullable fields use the 3.1 form (`"type": ["string", "null"]`), never `nullable`.
The document is built once; every call returns a deep copy, so a caller that
mutates its copy cannot change what the next caller gets.
"""

from __future__ import annotations

import copy
from functools import cache
from importlib import metadata
from typing import Any, Final

from outboxd.services.tasks import BUILTIN_TASKS as TASK_TYPES
from outboxd.storage.ports import (
    CURSOR_PATTERN,
    JOB_STATUSES,
    RELAY_STATUSES,
    TASK_STATUSES,
    WORK_STATUSES,
)

Schema = dict[str, Any]

_SCHEMAS: Final = "#/components/schemas/"
_RESPONSES: Final = "#/components/responses/"
_PROBLEM_MEDIA: Final = "application/problem+json"
_JSON_MEDIA: Final = "application/json"

PROBLEM_CODES: Final = (
    "C01",
    "C02",
    "C03",
    "C04",
    "C05",
    "C06",
    "C07",
    "C08",
    "C09",
    "C10",
    "C11",
    "C99",
)

# The handlers' `_string` check: no C0 or C1 control characters, no DEL.
_NO_CONTROL_CHARS: Final = "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
# Not blank (the server strips whitespace before its emptiness check) and no C0/C1
# control characters.
_CTRL: Final = "\\u0000-\\u001f\\u007f-\\u009f"
_VISIBLE_TEXT: Final = f"^[^{_CTRL}]*[^\\s{_CTRL}][^{_CTRL}]*$"
# What SQS accepts in a MessageDeduplicationId.
_DEDUP_ID: Final = "^[A-Za-z0-9!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~]{1,128}$"
# What the document promises to accept: ASCII letter-digit-hyphen labels of 1-63
# characters, no leading or trailing hyphen and no "--" in the 3rd and 4th place
# (the rules IDNA adds for ASCII labels, so never an invalid `xn--` label); two
# labels at least, the last starting with a letter. Every such name passes IDNA.
# IDN input (U-labels, valid A-labels) is accepted too and described in words.
_A: Final = "[A-Za-z0-9]"
_L: Final = "[A-Za-z0-9-]"
_LABEL_TAIL: Final = f"(?:{_L}?{_A})?|{_L}{_L}{_A}|{_L}(?:{_A}{_L}|-{_A}){_L}{{0,58}}{_A}"
_HOST_NAME: Final = f"^(?:{_A}(?:{_LABEL_TAIL})\\.)+[A-Za-z](?:{_LABEL_TAIL})\\.?$"
_REQUEST_ID_PATTERN: Final = "^[A-Za-z0-9._:-]{1,128}$"


def _ref(name: str) -> Schema:
    return {"$ref": _SCHEMAS + name}


def _nullable(schema: Schema) -> Schema:
    """`schema` or null, in the OpenAPI 3.1 / JSON Schema 2020-12 form."""
    return {"anyOf": [schema, {"type": "null"}]}


def _timestamp(description: str, *, nullable: bool = False) -> Schema:
    return {
        "type": ["string", "null"] if nullable else "string",
        "format": "date-time",
        "description": description + " (RFC 3339, UTC, millisecond precision).",
    }


def _text(description: str, *, nullable: bool = False) -> Schema:
    return {"type": ["string", "null"] if nullable else "string", "description": description}


def _count(description: str) -> Schema:
    return {"type": "integer", "minimum": 0, "description": description}


def _number(description: str) -> Schema:
    return {"type": ["number", "null"], "description": description}


def _object(properties: dict[str, Schema], *, description: str, closed: bool = False) -> Schema:
    """An object whose every listed property is always present (the renderers emit them all)."""
    schema: Schema = {
        "type": "object",
        "description": description,
        "required": list(properties),
        "properties": properties,
    }
    if closed:
        schema["additionalProperties"] = False
    return schema


# ------------------------------------------------------------------ schemas


def _portal_result_schemas() -> dict[str, Schema]:
    """The portal job's result (docs/portal.md#the-jobs-result).

    A source leaf that is absent is null.
    """
    return {
        "PortalStudent": _object(
            {
                "studentNumber": _text("Student number.", nullable=True),
                "name": _text("Name.", nullable=True),
                "college": _text("College.", nullable=True),
                "department": _text("Department.", nullable=True),
                "major": _text("Major.", nullable=True),
                "status": _text("Enrolment status, as the portal words it.", nullable=True),
                "year": {"type": ["integer", "null"], "description": "Year of study."},
            },
            description="The student's profile.",
        ),
        "PortalCourse": _object(
            {
                "code": _text("Course code.", nullable=True),
                "title": _text("Course title.", nullable=True),
                "credits": _number("Credits."),
                "grade": _text("Letter grade (A+ ... F, or P).", nullable=True),
                "gradePoints": _number("Grade points."),
                "category": _text("Category, e.g. 전공필수 or 교양선택.", nullable=True),
                "department": _text("Offering department.", nullable=True),
            },
            description="One course taken in a semester.",
        ),
        "PortalSemester": _object(
            {
                "year": {"type": ["integer", "null"], "description": "Academic year."},
                "term": {
                    "type": "string",
                    "enum": ["1", "summer", "2", "winter"],
                    "description": "First, summer, second or winter term.",
                },
                "creditsAttempted": _number("Credits attempted."),
                "creditsEarned": _number("Credits earned."),
                "gpa": _number("Grade point average."),
                "percentile": _number("Percentile score."),
                "rank": _text('Rank in the department, e.g. "6/33".', nullable=True),
                "courses": {"type": "array", "items": _ref("PortalCourse")},
            },
            description="One semester taken, with its courses.",
        ),
        "PortalTotals": _object(
            {
                "creditsAttempted": _number("Credits attempted."),
                "creditsEarned": _number("Credits earned."),
                "gpa": _number("Grade point average."),
                "percentile": _number("Percentile score."),
            },
            description="Totals over all semesters.",
        ),
        "PortalResult": _object(
            {
                "student": _ref("PortalStudent"),
                "semesters": {"type": "array", "items": _ref("PortalSemester")},
                "totals": _ref("PortalTotals"),
            },
            description="The academic record a SUCCEEDED portal job fetched.",
        ),
    }


def _job_schemas() -> dict[str, Schema]:
    relay_status: Schema = {
        "type": "string",
        "enum": list(RELAY_STATUSES),
        "description": "Relay outbox state.",
    }
    return {
        "JobStatus": {
            "type": "string",
            "enum": list(JOB_STATUSES),
            "description": "QUEUED (committed, not yet on the queue), RUNNING (on the queue or "
            "being worked), SUCCEEDED, FAILED (not retryable) or DEAD (retries exhausted).",
        },
        "RelayStatus": relay_status,
        "PortalLinkRequest": {
            "type": "object",
            "description": "Link a student's portal account; unknown fields are rejected.",
            "required": ["portal", "username", "password"],
            "additionalProperties": False,
            "properties": {
                "portal": {"type": "string", "enum": ["suwon"], "description": "The portal."},
                "username": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 64,
                    "pattern": _VISIBLE_TEXT,
                    "description": "Portal user id; not blank, no control characters.",
                },
                "password": {
                    "type": "string",
                    "format": "password",
                    "writeOnly": True,
                    "minLength": 1,
                    "maxLength": 256,
                    "pattern": _VISIBLE_TEXT,
                    "description": "Portal password; encrypted at rest and never echoed.",
                },
            },
        },
        "Dispatch": _object(
            {
                "outboxId": {"type": "string", "format": "uuid"},
                "status": _ref("RelayStatus"),
                "messageId": _text("The SQS message id once published.", nullable=True),
            },
            description="The job's relay outbox row after the synchronous publish attempt.",
        ),
        "PortalLinkAccepted": _object(
            {
                "jobId": {"type": "string", "format": "uuid"},
                "status": _ref("JobStatus"),
                "dispatch": _nullable(_ref("Dispatch")),
            },
            description="Normally RUNNING/SENT; QUEUED with a RETRYABLE_FAILED row when the "
            "publish failed and the relay will deliver it later.",
        ),
        "JobProgress": _object(
            {
                "step": _text("LOGIN, SSO, PROFILE, SEMESTERS or GRADES."),
                "done": _count("Units done in this step (semesters fetched in GRADES)."),
                "total": _count("Units in this step (0 when not counted)."),
            },
            description="Where a running job is.",
        ),
        "JobError": _object(
            {
                "code": _text(
                    "PORTAL_AUTH_FAILED, PORTAL_UNAVAILABLE, PORTAL_SESSION_EXPIRED, "
                    "PORTAL_BAD_RESPONSE or RETRIES_EXHAUSTED."
                ),
                "message": {"type": "string"},
            },
            description="The last error; null once the job SUCCEEDED.",
        ),
        "Job": _object(
            {
                "jobId": {"type": "string", "format": "uuid"},
                "kind": {"type": "string", "enum": ["portal_link"]},
                "portal": {"type": "string", "enum": ["suwon"]},
                "status": _ref("JobStatus"),
                "attempts": _count("Processing attempts so far."),
                "createdAt": _timestamp("When the job was accepted"),
                "updatedAt": _timestamp("Last change"),
                "finishedAt": _timestamp(
                    "When it reached SUCCEEDED, FAILED or DEAD", nullable=True
                ),
                "progress": _nullable(_ref("JobProgress")),
                "error": _nullable(_ref("JobError")),
                "result": _nullable(_ref("PortalResult")),
            },
            description="A portal link job, as its owner (or an admin) sees it.",
        ),
    }


def _website_schemas() -> dict[str, Schema]:
    return {
        "WebsiteRequest": {
            "type": "object",
            "description": "Register a website (upsert by normalised domain); unknown fields "
            "are rejected.",
            "required": ["domain"],
            "additionalProperties": False,
            "properties": {
                "domain": {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 253,
                    "pattern": _HOST_NAME,
                    "description": "A bare host name: lowercased, IDNA-encoded, "
                    "one trailing dot dropped. The pattern states the ASCII names every IDNA "
                    "implementation accepts; an internationalised name (U-labels or valid "
                    "xn-- A-labels) is accepted too and stored in its ASCII form. "
                    "A scheme, path, port, IP address, empty label or "
                    "label over 63 characters is rejected (400 C01), not stripped.",
                },
                "faviconUrl": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "maxLength": 2048,
                    "pattern": "^https?://[^\\u0000-\\u001f\\u007f-\\u009f]*$",
                    "description": "An http(s) URL, or null.",
                },
            },
        },
        "Classification": _object(
            {
                "status": {
                    "type": ["string", "null"],
                    "enum": [*WORK_STATUSES, None],
                    "description": "The classification work row's state.",
                },
                "attempts": _count("Classification attempts so far."),
                "lastError": _text("The last classification error.", nullable=True),
            },
            description="The website's classification work.",
        ),
        "Website": _object(
            {
                "id": {"type": "string", "format": "uuid"},
                "domain": _text("The normalised (ASCII, lowercase) host name."),
                "faviconUrl": _text("The favicon URL given at registration.", nullable=True),
                "category": _text("The category, once classified.", nullable=True),
                "classification": _ref("Classification"),
            },
            description="A registered website and its category.",
        ),
    }


def _admin_schemas() -> dict[str, Schema]:
    counts: Schema = {
        "type": "object",
        "description": "Row count per status.",
        "additionalProperties": {"type": "integer", "minimum": 0},
    }
    table_names = ("jobs", "relay_outbox", "work_outbox", "task_runs")
    return {
        "OutboxItem": {
            "type": "object",
            "description": "A relay outbox row (its payload is never shown): jobId for "
            "kind job, taskId for kind task.",
            "required": [
                "id",
                "kind",
                "status",
                "attempts",
                "nextAttemptAt",
                "lastError",
                "messageId",
                "createdAt",
            ],
            "properties": {
                "id": {"type": "string", "format": "uuid"},
                "kind": {"type": "string", "enum": ["job", "task"]},
                "jobId": {"type": "string"},
                "taskId": {"type": "string"},
                "status": _ref("RelayStatus"),
                "attempts": _count("Publish attempts."),
                "nextAttemptAt": _timestamp(
                    "Next publish attempt; null unless PENDING or RETRYABLE_FAILED",
                    nullable=True,
                ),
                "lastError": _text("The last publish error.", nullable=True),
                "messageId": _text("The SQS message id once published.", nullable=True),
                "createdAt": _timestamp("When the row was created"),
            },
            "oneOf": [
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
            ],
        },
        "OutboxPage": _object(
            {
                "items": {"type": "array", "items": _ref("OutboxItem")},
                "nextCursor": _text("Pass as `cursor` for the next page.", nullable=True),
            },
            description="Relay outbox rows, newest first.",
        ),
        "Stats": _object(
            {
                "tables": {
                    "type": "object",
                    "description": "Row counts per table and status.",
                    "required": list(table_names),
                    "properties": {name: counts for name in table_names},
                    "additionalProperties": counts,
                },
                "oldestPendingAgeSeconds": {
                    "type": "object",
                    "description": "Age of each table's oldest pending row; null when none.",
                    "required": list(table_names),
                    "additionalProperties": {"type": ["number", "null"], "minimum": 0},
                },
                "pace": {
                    "type": "object",
                    "description": "Cluster pace per resource (`ai`, `suwon`): the slots "
                    "every instance shares, on the database's clock (Unix seconds); empty "
                    "until a cluster-scope instance takes a slot.",
                    "additionalProperties": _object(
                        {
                            "lastSlotAt": {"type": ["number", "null"]},
                            "nextSlotAt": {"type": ["number", "null"]},
                            "nextSlotInSeconds": {"type": "number", "minimum": 0},
                            "pausedUntil": {"type": ["number", "null"]},
                            "pausedForSeconds": {"type": "number", "minimum": 0},
                            "sessions": {"type": "integer", "minimum": 0},
                            "databaseNow": {"type": "number"},
                        },
                        description="One pace row; pausedUntil is set by a 429's Retry-After.",
                    ),
                },
                "queues": {
                    "type": ["object", "null"],
                    "description": "SQS depth per queue (main, DLQ) and state, "
                    '{"error": "..."} when SQS did not answer, null without a queue.',
                    "additionalProperties": {
                        "anyOf": [
                            {"type": "object", "additionalProperties": {"type": "integer"}},
                            {"type": "string"},
                        ]
                    },
                },
            },
            description="Counts and ages (shared with `outboxd status` and /metrics).",
        ),
        "TaskRequest": {
            "type": "object",
            "description": "Enqueue a task through the task outbox; unknown fields are rejected.",
            "required": ["type"],
            "additionalProperties": False,
            "properties": {
                "type": {"type": "string", "enum": list(TASK_TYPES)},
                "payload": {
                    "type": "object",
                    "default": {},
                    "additionalProperties": False,
                    "properties": {
                        "older_than_days": {
                            "type": "number",
                            "minimum": 0,
                            "maximum": 36500,
                            "description": "outbox.prune: the age of finished rows to delete "
                            "(default 7); a finite number, never NaN or Infinity.",
                        }
                    },
                },
                "dedupId": {
                    "type": ["string", "null"],
                    "minLength": 1,
                    "maxLength": 128,
                    "pattern": _DEDUP_ID,
                    "description": "Deduplication id; defaults to the task id.",
                },
            },
        },
        "TaskAccepted": _object(
            {"taskId": {"type": "string", "format": "uuid"}},
            description="The enqueued task.",
        ),
        "TaskStatus": {"type": "string", "enum": list(TASK_STATUSES)},
        "TaskRun": _object(
            {
                "taskId": {"type": "string", "format": "uuid"},
                "type": {"type": "string"},
                "dedupId": {"type": "string"},
                "status": _ref("TaskStatus"),
                "enqueuedAt": _timestamp("When it was enqueued"),
                "finishedAt": _timestamp("When it finished", nullable=True),
                "error": _text("Why it failed.", nullable=True),
            },
            description="One task run.",
        ),
        "TaskPage": _object(
            {
                "items": {"type": "array", "items": _ref("TaskRun")},
                "nextCursor": _text("Pass as `cursor` for the next page.", nullable=True),
            },
            description="Task runs, newest first.",
        ),
    }


def _console_schemas() -> dict[str, Schema]:
    """The admin reads the operator console (/ui/) is built on."""
    return {
        "JobPage": _object(
            {
                "items": {"type": "array", "items": _ref("Job")},
                "nextCursor": _text("Pass as `cursor` for the next page.", nullable=True),
            },
            description="Jobs, newest first.",
        ),
        "JobDetail": {
            "allOf": [
                _ref("Job"),
                {
                    "type": "object",
                    "required": ["outbox"],
                    "properties": {
                        "outbox": {
                            "type": "array",
                            "items": _ref("OutboxItem"),
                            "maxItems": 20,
                            "description": "The job's relay outbox rows, newest first.",
                        }
                    },
                },
            ],
            "description": "A job with its relay outbox rows (admin view).",
        },
        "WebsitePage": _object(
            {
                "items": {"type": "array", "items": _ref("Website")},
                "nextCursor": _text("Pass as `cursor` for the next page.", nullable=True),
            },
            description="Websites, newest first.",
        ),
        "Runtime": _object(
            {
                "now": _timestamp("The server's clock"),
                "readiness": _ref("Readiness"),
                "claimer": {
                    "anyOf": [
                        _object(
                            {
                                "lastTickAt": _timestamp(
                                    "When the last tick started", nullable=True
                                ),
                                "nextTickAt": _timestamp(
                                    "When the next tick is due", nullable=True
                                ),
                                "pausedUntil": _timestamp(
                                    "End of a provider-asked pause (429); null when not paused",
                                    nullable=True,
                                ),
                            },
                            description="This process's claimer pace.",
                        ),
                        {"type": "null"},
                    ],
                    "description": "Null when this process runs no claimer.",
                },
                "schedules": {
                    "type": "array",
                    "description": "This process's scheduler entries.",
                    "items": _object(
                        {
                            "name": {"type": "string"},
                            "task": {"type": "string"},
                            "nextFireAt": _timestamp("The next fire time"),
                        },
                        description="One schedule.",
                    ),
                },
                "throughput": {
                    "type": "array",
                    "description": "Portal jobs accepted by this process's API and finished by "
                    "its consumer, per minute over the last hour, oldest first (kept in memory; "
                    "empty after a restart).",
                    "items": _object(
                        {
                            "minute": _timestamp("The minute's start"),
                            "accepted": _count("Jobs accepted."),
                            "finished": _count("Jobs that reached SUCCEEDED, FAILED or DEAD."),
                        },
                        description="One minute.",
                    ),
                },
                "taskTypes": {
                    "type": "array",
                    "items": {"type": "string", "enum": list(TASK_TYPES)},
                    "description": "The built-in task types POST /v1/admin/tasks accepts.",
                },
            },
            description="What only the running process knows: readiness, claimer pace, "
            "schedules, throughput.",
        ),
    }


def _operations_schemas() -> dict[str, Schema]:
    return {
        "Health": _object(
            {"status": {"type": "string", "const": "ok"}},
            description="The event loop answers.",
        ),
        "Readiness": _object(
            {
                "status": {"type": "string", "enum": ["ok", "unavailable"]},
                "checks": {
                    "type": "object",
                    "description": 'Component name -> "ok" or a short reason.',
                    "additionalProperties": {"type": "string"},
                },
            },
            description="Whether the database and SQS answer.",
        ),
    }


def _problem_schemas() -> dict[str, Schema]:
    return {
        "FieldError": _object(
            {"field": {"type": "string"}, "message": {"type": "string"}},
            description="One invalid field.",
        ),
        "Problem": {
            "type": "object",
            "description": "RFC 9457 problem details. Never echoes secrets.",
            "required": ["type", "title", "status", "detail", "code", "requestId"],
            "properties": {
                "type": {
                    "type": "string",
                    "format": "uri",
                    "description": "urn:outboxd:problem:<NAME>, e.g. "
                    "urn:outboxd:problem:VALIDATION_FAILED.",
                },
                "title": {"type": "string"},
                "status": {"type": "integer", "minimum": 400, "maximum": 599},
                "detail": {"type": "string"},
                "code": {
                    "type": "string",
                    "enum": list(PROBLEM_CODES),
                    "description": "C01 VALIDATION_FAILED, C02 UNAUTHENTICATED, C03 FORBIDDEN, "
                    "C04 NOT_FOUND, C05 PAYLOAD_TOO_LARGE, C06 IDEMPOTENCY_KEY_REQUIRED, "
                    "C07 IDEMPOTENCY_KEY_CONFLICT, C08 ENQUEUE_FAILED, C09 STORAGE_UNAVAILABLE, "
                    "C10 METHOD_NOT_ALLOWED, C11 INVALID_STATE, C99 INTERNAL_ERROR.",
                },
                "requestId": {"type": "string", "description": "Also in X-Request-Id."},
                "errors": {
                    "type": "array",
                    "description": "Present for validation failures.",
                    "items": _ref("FieldError"),
                },
            },
        },
    }


def _schemas() -> dict[str, Schema]:
    return {
        **_problem_schemas(),
        **_job_schemas(),
        **_portal_result_schemas(),
        **_website_schemas(),
        **_admin_schemas(),
        **_console_schemas(),
        **_operations_schemas(),
    }


# ------------------------------------------------------------------ responses


def _headers(**extra: Schema) -> dict[str, Schema]:
    return {"X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"}, **extra}


def _header(description: str, *, required: bool = False) -> Schema:
    return {"description": description, "required": required, "schema": {"type": "string"}}


def _json_response(
    description: str,
    schema_name: str,
    *,
    links: dict[str, Schema] | None = None,
    **headers: Schema,
) -> Schema:
    response: Schema = {
        "description": description,
        "headers": _headers(**headers),
        "content": {_JSON_MEDIA: {"schema": _ref(schema_name)}},
    }
    if links:
        response["links"] = links
    return response


def _link(operation_id: str, param: str, pointer: str) -> Schema:
    """An OpenAPI link: `param` of `operation_id` comes from this response's body."""
    return {"operationId": operation_id, "parameters": {param: f"$response.body#{pointer}"}}


def _website_links() -> dict[str, Schema]:
    return {"GetWebsite": _link("getWebsite", "domain", "/domain")}


def _job_links() -> dict[str, Schema]:
    return {
        "GetJob": _link("getJob", "job_id", "/jobId"),
        "RedriveJob": _link("redriveJob", "job_id", "/jobId"),
    }


def _problem_response(description: str, **headers: Schema) -> Schema:
    return {
        "description": description,
        "headers": _headers(**headers),
        "content": {_PROBLEM_MEDIA: {"schema": _ref("Problem")}},
    }


def _shared(name: str) -> Schema:
    return {"$ref": _RESPONSES + name}


def _component_responses() -> dict[str, Schema]:
    retry_after = _header("Seconds to wait before retrying.")
    return {
        "BadRequest": _problem_response("C01: the request is not valid."),
        "Unauthorized": _problem_response(
            "C02: a valid bearer token is required.",
            **{"WWW-Authenticate": _header("The Bearer challenge.", required=True)},
        ),
        "Forbidden": _problem_response("C03: the admin role is required."),
        "NotFound": _problem_response("C04: not found (or not yours)."),
        "PayloadTooLarge": _problem_response("C05: the body is over server.max_body_bytes."),
        "UnsupportedMediaType": _problem_response("C01: Content-Type must be application/json."),
        "MethodNotAllowed": _problem_response(
            "C10: the path exists, the method does not (every path answers this for methods "
            "it does not list).",
            Allow=_header("The methods the path accepts.", required=True),
        ),
        "InvalidState": _problem_response("C11: the operation does not apply (not DEAD)."),
        "InternalError": _problem_response("C99: internal error."),
        "StorageUnavailable": _problem_response(
            "C09: the database is unavailable; nothing was half-written.",
            **{"Retry-After": retry_after},
        ),
    }


def _responses(ok: dict[str, Schema], *shared: str) -> dict[str, Schema]:
    """Success responses plus the named shared error responses, keyed by status code."""
    codes = {
        "BadRequest": "400",
        "Unauthorized": "401",
        "Forbidden": "403",
        "NotFound": "404",
        "InvalidState": "409",
        "PayloadTooLarge": "413",
        "UnsupportedMediaType": "415",
        "InternalError": "500",
        "StorageUnavailable": "503",
    }
    out = dict(ok)
    for name in shared:
        out[codes[name]] = _shared(name)
    return dict(sorted(out.items()))


# ------------------------------------------------------------------ paths


def _path_param(name: str, description: str) -> Schema:
    return {
        "name": name,
        "in": "path",
        "required": True,
        "description": description,
        "schema": {"type": "string", "minLength": 1},
    }


def _query_param(name: str, schema: Schema, description: str) -> Schema:
    return {
        "name": name,
        "in": "query",
        "required": False,
        "description": description,
        "schema": schema,
    }


_LIMIT: Final[Schema] = _query_param(
    "limit", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}, "Page size."
)
_CURSOR: Final[Schema] = _query_param(
    "cursor",
    {"type": "string", "pattern": CURSOR_PATTERN},
    "The nextCursor of the previous page; leave it out for the first page (an empty or "
    "malformed value is 400 C01).",
)
_REQUEST_ID: Final[Schema] = {"$ref": "#/components/parameters/X-Request-Id"}
_PUBLIC: Final[list[dict[str, list[str]]]] = []
_ADMIN_ERRORS: Final = ("Unauthorized", "Forbidden", "InternalError", "StorageUnavailable")
_JOB_ID_PATTERN: Final = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$"
_CONSOLE_PAGES: Final = (
    ("/ui/", "consoleOverview", "Overview: counts, queues, readiness, pace, schedules, chart."),
    ("/ui/jobs", "consoleJobs", "Jobs: lookup by id and list by status."),
    ("/ui/jobs/{job_id}", "consoleJob", "One job: status, progress, error, result, outbox rows."),
    ("/ui/dead-letters", "consoleDeadLetters", "DEAD jobs and relay rows, with redrive."),
    ("/ui/websites", "consoleWebsites", "Classification states and FAILED rows."),
    ("/ui/tasks", "consoleTasks", "Recent task runs and an enqueue form."),
)
_CONSOLE_ASSETS: Final = (
    ("/ui/assets/app.js", "consoleScript", "text/javascript", "The console's script."),
    ("/ui/assets/app.css", "consoleStyles", "text/css", "The console's stylesheet."),
)


def _json_body(schema_name: str) -> Schema:
    return {"required": True, "content": {_JSON_MEDIA: {"schema": _ref(schema_name)}}}


def _console_static(operation_id: str, summary: str, media: str, *errors: str) -> Schema:
    csp = _header("default-src 'self' and no inline script or style.", required=True)
    return {
        "operationId": operation_id,
        "tags": ["console"],
        "summary": summary,
        "description": "Static; public, like every /ui/ response: the page asks for an admin "
        "token and sends it to the admin API as a bearer token (no cookies).",
        "security": _PUBLIC,
        "responses": _responses(
            {
                "200": {
                    "description": "The file.",
                    "headers": _headers(
                        **{
                            "Content-Security-Policy": csp,
                            "X-Content-Type-Options": _header("nosniff", required=True),
                            "Referrer-Policy": _header("no-referrer", required=True),
                        }
                    ),
                    "content": {media: {"schema": {"type": "string"}}},
                }
            },
            *errors,
            "InternalError",
        ),
    }


def _console_paths() -> dict[str, Schema]:
    paths: dict[str, Schema] = {}
    for path, op_id, summary in _CONSOLE_PAGES:
        item: Schema = {"parameters": [_REQUEST_ID]}
        errors: tuple[str, ...] = ()
        if "{job_id}" in path:
            job_id = _path_param("job_id", "The job id (a UUID as the API issues it).")
            job_id["schema"] = {"type": "string", "pattern": _JOB_ID_PATTERN}
            item["parameters"].insert(0, job_id)
            errors = ("NotFound",)
        item["get"] = _console_static(op_id, summary, "text/html", *errors)
        paths[path] = item
    for path, op_id, media, summary in _CONSOLE_ASSETS:
        paths[path] = {"parameters": [_REQUEST_ID], "get": _console_static(op_id, summary, media)}
    return paths


def _admin_console_paths() -> dict[str, Schema]:
    status = {"type": "string", "enum": list(JOB_STATUSES)}
    return {
        "/v1/admin/jobs": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "listJobs",
                "tags": ["admin"],
                "summary": "Jobs, newest first (keyset pagination), any user's.",
                "parameters": [
                    _query_param("status", status, "Only jobs in this state."),
                    _LIMIT,
                    _CURSOR,
                ],
                "responses": _responses(
                    {"200": _json_response("A page of jobs.", "JobPage")},
                    "BadRequest",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/jobs/{job_id}": {
            "parameters": [_path_param("job_id", "The job id."), _REQUEST_ID],
            "get": {
                "operationId": "getJobDetail",
                "tags": ["admin"],
                "summary": "Any user's job with its relay outbox rows.",
                "responses": _responses(
                    {"200": _json_response("The job.", "JobDetail")},
                    "NotFound",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/websites": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "listWebsites",
                "tags": ["admin"],
                "summary": "Websites by classification state, newest first (keyset pagination).",
                "parameters": [
                    _query_param(
                        "status",
                        {"type": "string", "enum": list(WORK_STATUSES)},
                        "Only websites whose classification is in this state.",
                    ),
                    _LIMIT,
                    _CURSOR,
                ],
                "responses": _responses(
                    {"200": _json_response("A page of websites.", "WebsitePage")},
                    "BadRequest",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/websites/{domain}/retry": {
            "parameters": [
                _path_param("domain", "The host name (normalised before the lookup)."),
                _REQUEST_ID,
            ],
            "post": {
                "operationId": "retryWebsite",
                "tags": ["admin"],
                "summary": "A FAILED classification back to PENDING, its attempts reset.",
                "responses": _responses(
                    {"200": _json_response("The website after the retry.", "Website")},
                    "NotFound",
                    "InvalidState",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/runtime": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "getRuntime",
                "tags": ["admin"],
                "summary": "Readiness, claimer pace, schedules and per-minute throughput "
                "of this process.",
                "responses": _responses(
                    {"200": _json_response("This process's state.", "Runtime")},
                    *_ADMIN_ERRORS,
                ),
            },
        },
    }


def _paths() -> dict[str, Schema]:
    location = _header("/v1/jobs/{jobId}", required=True)
    return {
        **_admin_console_paths(),
        **_console_paths(),
        "/v1/portal-link-jobs": {
            "parameters": [_REQUEST_ID],
            "post": {
                "operationId": "createPortalLinkJob",
                "tags": ["jobs"],
                "summary": "Start a portal link job (idempotent per user and Idempotency-Key).",
                "parameters": [{"$ref": "#/components/parameters/Idempotency-Key"}],
                "requestBody": _json_body("PortalLinkRequest"),
                "responses": _responses(
                    {
                        "202": _json_response(
                            "Accepted: stored, and normally already on the queue.",
                            "PortalLinkAccepted",
                            links=_job_links(),
                            Location=location,
                            **{
                                "Idempotent-Replayed": {
                                    "description": "Present on a replay of an earlier request.",
                                    "required": False,
                                    "schema": {"type": "string", "enum": ["true"]},
                                }
                            },
                        ),
                        "400": _problem_response(
                            "C01: the body is not valid; C06: the Idempotency-Key is missing, "
                            "empty, over 255 characters or not visible ASCII."
                        ),
                        "409": _problem_response(
                            "C07: the Idempotency-Key was used with a different request."
                        ),
                        "503": _problem_response(
                            "C08: stored but not queued (api.require_dispatch = true; retry "
                            "with the same key); C09: the database is unavailable.",
                            **{"Retry-After": _header("Seconds to wait before retrying.")},
                        ),
                    },
                    "Unauthorized",
                    "PayloadTooLarge",
                    "UnsupportedMediaType",
                    "InternalError",
                ),
            },
        },
        "/v1/jobs/{job_id}": {
            "parameters": [_path_param("job_id", "The job id."), _REQUEST_ID],
            "get": {
                "operationId": "getJob",
                "tags": ["jobs"],
                "summary": "A job's state, progress and result (owner or admin).",
                "responses": _responses(
                    {"200": _json_response("The job.", "Job")},
                    "Unauthorized",
                    "NotFound",
                    "InternalError",
                    "StorageUnavailable",
                ),
            },
        },
        "/v1/websites": {
            "parameters": [_REQUEST_ID],
            "post": {
                "operationId": "registerWebsite",
                "tags": ["websites"],
                "summary": "Register a website for classification (upsert by domain).",
                "requestBody": _json_body("WebsiteRequest"),
                "responses": _responses(
                    {
                        "200": _json_response(
                            "Already registered.", "Website", links=_website_links()
                        ),
                        "201": _json_response(
                            "Registered; classification queued.", "Website", links=_website_links()
                        ),
                    },
                    "BadRequest",
                    "Unauthorized",
                    "PayloadTooLarge",
                    "UnsupportedMediaType",
                    "InternalError",
                    "StorageUnavailable",
                ),
            },
        },
        "/v1/websites/{domain}": {
            "parameters": [
                _path_param("domain", "The host name (normalised before the lookup)."),
                _REQUEST_ID,
            ],
            "get": {
                "operationId": "getWebsite",
                "tags": ["websites"],
                "summary": "A website and its category.",
                "responses": _responses(
                    {"200": _json_response("The website.", "Website")},
                    "Unauthorized",
                    "NotFound",
                    "InternalError",
                    "StorageUnavailable",
                ),
            },
        },
        "/v1/admin/outbox": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "listOutbox",
                "tags": ["admin"],
                "summary": "Relay outbox rows, newest first (keyset pagination).",
                "parameters": [
                    _query_param(
                        "status",
                        {"type": "string", "enum": list(RELAY_STATUSES)},
                        "Only rows in this state.",
                    ),
                    _LIMIT,
                    _CURSOR,
                ],
                "responses": _responses(
                    {"200": _json_response("A page of rows.", "OutboxPage")},
                    "BadRequest",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/outbox/{outbox_id}/redrive": {
            "parameters": [_path_param("outbox_id", "The relay outbox row id."), _REQUEST_ID],
            "post": {
                "operationId": "redriveOutbox",
                "tags": ["admin"],
                "summary": "A DEAD row back to PENDING (attempts reset), its job to QUEUED.",
                "responses": _responses(
                    {"200": _json_response("The row after the redrive.", "OutboxItem")},
                    "NotFound",
                    "InvalidState",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/jobs/{job_id}/redrive": {
            "parameters": [_path_param("job_id", "The job id."), _REQUEST_ID],
            "post": {
                "operationId": "redriveJob",
                "tags": ["admin"],
                "summary": "A DEAD job back to QUEUED with a fresh PENDING outbox row.",
                "responses": _responses(
                    {
                        "202": _json_response(
                            "The job after the redrive.",
                            "Job",
                            links={"GetJob": _link("getJob", "job_id", "/jobId")},
                            Location=location,
                        )
                    },
                    "NotFound",
                    "InvalidState",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/v1/admin/stats": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "getStats",
                "tags": ["admin"],
                "summary": "Counts per table and status, oldest pending ages, SQS depth.",
                "responses": _responses(
                    {"200": _json_response("The numbers.", "Stats")}, *_ADMIN_ERRORS
                ),
            },
        },
        "/v1/admin/tasks": {
            "parameters": [_REQUEST_ID],
            "post": {
                "operationId": "enqueueTask",
                "tags": ["admin"],
                "summary": "Enqueue a task through the task outbox.",
                "requestBody": _json_body("TaskRequest"),
                "responses": _responses(
                    {"202": _json_response("Enqueued.", "TaskAccepted")},
                    "BadRequest",
                    "InvalidState",
                    "PayloadTooLarge",
                    "UnsupportedMediaType",
                    *_ADMIN_ERRORS,
                ),
            },
            "get": {
                "operationId": "listTasks",
                "tags": ["admin"],
                "summary": "Task runs, newest first (keyset pagination).",
                "parameters": [
                    _query_param(
                        "type",
                        {"type": "string", "maxLength": 100, "pattern": _NO_CONTROL_CHARS},
                        "Only tasks of this type.",
                    ),
                    _LIMIT,
                    _CURSOR,
                ],
                "responses": _responses(
                    {"200": _json_response("A page of task runs.", "TaskPage")},
                    "BadRequest",
                    *_ADMIN_ERRORS,
                ),
            },
        },
        "/healthz": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "healthz",
                "tags": ["operations"],
                "summary": "Liveness: 200 while the event loop answers.",
                "security": _PUBLIC,
                "responses": _responses(
                    {"200": _json_response("Alive.", "Health")}, "InternalError"
                ),
            },
        },
        "/readyz": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "readyz",
                "tags": ["operations"],
                "summary": "Readiness: the database and SQS answer.",
                "security": _PUBLIC,
                "responses": _responses(
                    {
                        "200": _json_response("Ready.", "Readiness"),
                        "503": _json_response("Not ready; checks say which failed.", "Readiness"),
                    },
                    "InternalError",
                ),
            },
        },
        "/metrics": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "metrics",
                "tags": ["operations"],
                "summary": "Prometheus metrics (text exposition format).",
                "security": _PUBLIC,
                "responses": _responses(
                    {
                        "200": {
                            "description": "The metrics.",
                            "headers": _headers(),
                            "content": {"text/plain": {"schema": {"type": "string"}}},
                        }
                    },
                    "InternalError",
                    "StorageUnavailable",
                ),
            },
        },
        "/openapi.json": {
            "parameters": [_REQUEST_ID],
            "get": {
                "operationId": "openapi",
                "tags": ["operations"],
                "summary": "This document.",
                "security": _PUBLIC,
                "responses": _responses(
                    {
                        "200": {
                            "description": "The OpenAPI 3.1 document.",
                            "headers": _headers(),
                            "content": {
                                _JSON_MEDIA: {
                                    "schema": {
                                        "type": "object",
                                        "required": ["openapi", "info", "paths"],
                                    }
                                }
                            },
                        }
                    },
                    "InternalError",
                ),
            },
        },
    }


# ------------------------------------------------------------------ document


def _version() -> str:
    try:
        return metadata.version("outboxd")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"


@cache
def _build() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "outboxd",
            "version": _version(),
            "summary": "Transactional-outbox daemon: portal link jobs, website classification, "
            "administration.",
            "description": "JSON in and out. Every error is RFC 9457 application/problem+json "
            "(the Problem schema). Every response carries X-Request-Id (the caller's, when it "
            "is 1-128 characters of [A-Za-z0-9._:-], else a fresh one). A method a path does "
            "not list answers 405 C10 with an Allow header (components.responses."
            "MethodNotAllowed). /healthz, /readyz, /metrics, /openapi.json and the console's "
            "static files under /ui/ need no token. "
            "Bodies are RFC 8259 JSON: NaN, Infinity, numbers beyond a double, integers over 64 "
            "digits, nesting deeper than 32, NUL characters and lone surrogates are 400 C01, as "
            "is a body that is not the gzip or deflate stream its Content-Encoding says. "
            "Authorization must be sent once. Connection limits (server.read_timeout_s, "
            "server.keepalive_timeout_s, server.max_connections): a request whose headers and "
            "body do not arrive within the read timeout is answered 408 and closed; beyond "
            "max_connections a new connection is answered 503 C09 and closed. HTTP the parser "
            "cannot read (a header over 8 KB, bytes that are not HTTP) is 400 C01, never echoed. "
            "Responses carry Server: outboxd (no version).",
        },
        "tags": [
            {"name": "jobs", "description": "Portal link jobs."},
            {"name": "websites", "description": "Websites and their category."},
            {"name": "admin", "description": "Administration (role admin)."},
            {"name": "operations", "description": "Health, readiness, metrics, this document."},
            {"name": "console", "description": "The operator console's static pages (/ui/)."},
        ],
        "security": [{"bearer": []}],
        "paths": _paths(),
        "components": {
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "A token from [[auth.tokens]] (matched by SHA-256). With no "
                    "tokens configured, every caller is user `local` with role admin.",
                }
            },
            "schemas": _schemas(),
            "responses": _component_responses(),
            "parameters": {
                "Idempotency-Key": {
                    "name": "Idempotency-Key",
                    "in": "header",
                    "required": True,
                    "description": "1-255 visible ASCII characters; same user + key + request "
                    "replays the same job, a different request is 409 C07.",
                    "schema": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 255,
                        "pattern": "^[!-~]{1,255}$",
                    },
                },
                "X-Request-Id": {
                    "name": "X-Request-Id",
                    "in": "header",
                    "required": False,
                    "description": "A caller-chosen id, echoed back when it is 1-128 characters "
                    "of [A-Za-z0-9._:-]; any other value is replaced by a fresh id (never "
                    "rejected).",
                    "schema": {"type": "string"},
                },
            },
            "headers": {
                "X-Request-Id": {
                    "description": "The request's id (also in logs and in problem bodies).",
                    "required": True,
                    "schema": {"type": "string", "pattern": _REQUEST_ID_PATTERN},
                }
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document for every route of `outboxd.daemon.api` (a fresh copy)."""
    return copy.deepcopy(_build())
