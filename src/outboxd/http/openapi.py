"""The OpenAPI 3.1 document served at `GET /openapi.json`.

Its paths come from the route table (http/routes.py) that the router is built from,
its bodies from the msgspec models (http/models.py) and its error responses from the
problem table (http/problems.py).
Nullable fields use the 3.1 form (`"type": ["string", "null"]`), never `nullable`.
The document is built once; every call returns a deep copy, so a caller that
mutates its copy cannot change what the next caller gets.
"""

from __future__ import annotations

import copy
from functools import cache
from importlib import metadata
from typing import Any, Final

from msgspec import Struct

from outboxd.http import models
from outboxd.http.problems import (
    FORBIDDEN,
    HEADERS_TOO_LARGE,
    IDEMPOTENCY_KEY_CONFLICT,
    METHOD_NOT_ALLOWED,
    MISDIRECTED_REQUEST,
    REQUEST_TIMEOUT,
    TOO_MANY_CONNECTIONS,
    VALIDATION_FAILED,
    ProblemKind,
)
from outboxd.http.routes import ROUTES, Ok, Param, Route
from outboxd.services.tasks import BUILTIN_TASKS
from outboxd.storage.ports import JOB_STATUSES, RELAY_STATUSES, TASK_STATUSES

Schema = dict[str, Any]

_SCHEMAS: Final = "#/components/schemas/"
_RESPONSES: Final = "#/components/responses/"
_PROBLEM_MEDIA: Final = "application/problem+json"
_JSON_MEDIA: Final = "application/json"


def _ref(name: str) -> Schema:
    return {"$ref": _SCHEMAS + name}


def _timestamp(description: str, *, nullable: bool = False) -> Schema:
    return {
        "type": ["string", "null"] if nullable else "string",
        "format": "date-time",
        "description": description + " (RFC 3339, UTC, millisecond precision).",
    }


def _count(description: str) -> Schema:
    return {"type": "integer", "minimum": 0, "description": description}


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
    }


def _admin_schemas() -> dict[str, Schema]:
    counts: Schema = {
        "type": "object",
        "description": "Row count per status.",
        "additionalProperties": {"type": "integer", "minimum": 0},
    }
    table_names = ("jobs", "relay_outbox", "work_outbox", "task_runs")
    return {
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
        "TaskStatus": {"type": "string", "enum": list(TASK_STATUSES)},
    }


def _console_schemas() -> dict[str, Schema]:
    """The admin reads the operator console (/ui/) is built on."""
    return {
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
                    "items": {"type": "string", "enum": list(BUILTIN_TASKS)},
                    "description": "The built-in task types POST /v1/admin/tasks accepts.",
                },
            },
            description="What only the running process knows: readiness, claimer pace, "
            "schedules, throughput.",
        ),
    }


def _schemas() -> dict[str, Schema]:
    """The bodies defined in http/models.py, and the few written here by hand."""
    return {
        **models.openapi_components(_SCHEMAS),
        **_job_schemas(),
        **_admin_schemas(),
        **_console_schemas(),
        "OpenApiDocument": {"type": "object", "required": ["openapi", "info", "paths"]},
    }


# ------------------------------------------------------------------ paths, from the route table

_HEADERS: Final[dict[str, Schema]] = {
    "Location": {
        "description": "/v1/jobs/{jobId}",
        "required": True,
        "schema": {"type": "string"},
    },
    "Idempotent-Replayed": {
        "description": "Present on a replay of an earlier request.",
        "required": False,
        "schema": {"type": "string", "enum": ["true"]},
    },
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "required": False,
        "schema": {"type": "string"},
    },
    "WWW-Authenticate": {
        "description": "The Bearer challenge.",
        "required": True,
        "schema": {"type": "string"},
    },
    "Allow": {
        "description": "The methods the path accepts.",
        "required": True,
        "schema": {"type": "string"},
    },
    "Content-Security-Policy": {
        "description": "default-src 'self' and no inline script or style.",
        "required": True,
        "schema": {"type": "string"},
    },
    "X-Content-Type-Options": {
        "description": "nosniff",
        "required": True,
        "schema": {"type": "string"},
    },
    "Referrer-Policy": {
        "description": "no-referrer",
        "required": True,
        "schema": {"type": "string"},
    },
}


def _headers(names: tuple[str, ...] = ()) -> dict[str, Schema]:
    return {
        "X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"},
        **{name: _HEADERS[name] for name in names},
    }


def _body_schema(body: type[Struct] | str | None) -> Schema:
    if body is None:
        return {"type": "string"}
    return _ref(body if isinstance(body, str) else body.__name__)


def _ok(ok: Ok) -> Schema:
    response: Schema = {
        "description": ok.description,
        "headers": _headers(ok.headers),
        "content": {ok.media: {"schema": _body_schema(ok.body)}},
    }
    if ok.links:
        response["links"] = {
            link.name: {
                "operationId": link.operation,
                "parameters": {link.param: f"$response.body#{link.pointer}"},
            }
            for link in ok.links
        }
    return response


def _problem_response(kinds: list[ProblemKind]) -> Schema:
    headers = tuple(dict.fromkeys(h for kind in kinds for h in kind.headers))
    return {
        "description": "; ".join(f"{kind.code}: {kind.meaning}" for kind in kinds) + ".",
        "headers": _headers(headers),
        "content": {_PROBLEM_MEDIA: {"schema": _ref("Problem")}},
    }


def _component_responses() -> dict[str, Schema]:
    """Each problem kind as a shared response (routes with one kind at a status point here)."""
    return {kind.label: _problem_response([kind]) for kind in _documented_kinds()}


def _documented_kinds() -> list[ProblemKind]:
    kinds = {kind for route in ROUTES for kind in route.all_errors()}
    return sorted({*kinds, METHOD_NOT_ALLOWED}, key=lambda k: (k.code, k.status))


def _responses(route: Route) -> dict[str, Schema]:
    out = {str(ok.status): _ok(ok) for ok in route.ok}
    by_status: dict[int, list[ProblemKind]] = {}
    for kind in dict.fromkeys(route.all_errors()):
        by_status.setdefault(kind.status, []).append(kind)
    for status, kinds in by_status.items():
        if str(status) in out:
            continue  # /readyz answers 503 with its own body
        out[str(status)] = (
            {"$ref": _RESPONSES + kinds[0].label} if len(kinds) == 1 else _problem_response(kinds)
        )
    return dict(sorted(out.items()))


def _parameter(param: Param) -> Schema:
    return {
        "name": param.name,
        "in": param.where,
        "required": param.where == "path",
        "description": param.description,
        "schema": param.schema,
    }


def _operation(route: Route) -> Schema:
    op: Schema = {"operationId": route.operation_id, "tags": [route.tag], "summary": route.summary}
    if route.description:
        op["description"] = route.description
    if route.access == "public":
        op["security"] = []
    query = [_parameter(p) for p in route.params if p.where == "query"]
    headers = [{"$ref": "#/components/parameters/" + h} for h in route.headers]
    if query or headers:
        op["parameters"] = [*headers, *query]
    if route.request is not None:
        op["requestBody"] = {
            "required": True,
            "content": {_JSON_MEDIA: {"schema": _ref(route.request.__name__)}},
        }
    op["responses"] = _responses(route)
    return op


_REQUEST_ID: Final[Schema] = {"$ref": "#/components/parameters/X-Request-Id"}


def _paths() -> dict[str, Schema]:
    paths: dict[str, Schema] = {}
    for route in ROUTES:
        item = paths.setdefault(route.path, {})
        path_params = [_parameter(p) for p in route.params if p.where == "path"]
        item["parameters"] = [*path_params, _REQUEST_ID]
        item[route.method.lower()] = _operation(route)
    return paths


# ------------------------------------------------------------------ document


def _version() -> str:
    try:
        return metadata.version("outboxd")
    except metadata.PackageNotFoundError:  # running from a source tree that is not installed
        return "0.0.0"


def _is(kind: ProblemKind) -> str:
    return f"{kind.status} {kind.code}"


_DESCRIPTION: Final = (
    "JSON in and out. Every error is RFC 9457 application/problem+json "
    "(the Problem schema). Every response carries X-Request-Id (the caller's, when it "
    "is 1-128 characters of [A-Za-z0-9._:-], else a fresh one). A method a path does "
    f"not list answers {_is(METHOD_NOT_ALLOWED)} with an Allow header (components.responses."
    "MethodNotAllowed). /healthz, /readyz, /metrics, /openapi.json and the console's "
    "static files under /ui/ need no token. "
    "Bodies are RFC 8259 JSON: NaN, Infinity, numbers beyond a double, integers over 64 "
    "digits, nesting deeper than 32, NUL characters and lone surrogates are "
    f"{_is(VALIDATION_FAILED)}, as is a body that is not the gzip or deflate stream its "
    "Content-Encoding says. Authorization must be sent once. Connection limits "
    "(server.read_timeout_s, server.keepalive_timeout_s, server.max_connections, "
    "server.write_timeout_s, server.max_header_bytes): a "
    "request whose headers and body do not arrive within the read timeout is answered "
    f"{REQUEST_TIMEOUT.status} and closed; beyond max_connections a new connection is "
    f"answered {_is(TOO_MANY_CONNECTIONS)} and closed; a response the client does not read "
    "for the write timeout is aborted; a request line and headers over max_header_bytes "
    f"(16 KiB by default) or 64 fields are {_is(HEADERS_TOO_LARGE)} and closed, on every "
    "route and before any token is checked. HTTP the parser cannot read (bytes that are "
    f"not HTTP) is {_is(VALIDATION_FAILED)}, never echoed. "
    "Responses carry Server: outboxd (no version)."
)


@cache
def _build() -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "outboxd",
            "version": _version(),
            "summary": "Transactional-outbox daemon: portal link jobs, website classification, "
            "administration.",
            "description": _DESCRIPTION,
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
                    "tokens configured, every caller is user `local` with role admin, for this "
                    "operator only: a Host that is not a loopback name or address is "
                    f"{MISDIRECTED_REQUEST.status} {MISDIRECTED_REQUEST.code} on every route, and "
                    "a request other than GET, HEAD or OPTIONS whose Origin is not the daemon's "
                    "own or whose Sec-Fetch-Site is cross-site or same-site is "
                    f"{_is(FORBIDDEN)}.",
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
                    "replays the same job, a different request is "
                    f"{_is(IDEMPOTENCY_KEY_CONFLICT)}. A key holding a bidirectional control "
                    f"(U+202A-U+202E, U+2066-U+2069) is {_is(VALIDATION_FAILED)}.",
                    "schema": {
                        "type": "string",
                        "minLength": 1,
                        "maxLength": 255,
                        "pattern": models.IDEMPOTENCY_KEY_PATTERN,
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
                    "schema": {"type": "string", "pattern": models.REQUEST_ID_PATTERN},
                }
            },
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI 3.1 document for every route of the route table (a fresh copy)."""
    return copy.deepcopy(_build())
