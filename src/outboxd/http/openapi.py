"""The OpenAPI 3.1 document served at `GET /openapi.json`.

Its paths come from the route table (http/routes.py) that the router is built from,
its bodies from the msgspec models (http/models.py) and its error responses from the
problem table (http/problems.py). No schema is written here by hand.
A nullable field is an `anyOf` with `{"type": "null"}` (OpenAPI 3.1), never `nullable`.
The document is built once; every call returns a deep copy, so a caller that
mutates its copy cannot change what the next caller gets.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from functools import cache
from importlib import metadata
from types import UnionType
from typing import Any, Final, get_args

import msgspec
from msgspec import Struct

from outboxd.http import (
    audit_models,
    bulk_models,
    console_models,
    dependency_models,
    login_models,
    models,
)
from outboxd.http.endpoints import Ok, Param, Route
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
from outboxd.http.routes import ROUTES
from outboxd.storage.ports import JobEventType, JobStatus, RelayStatus, TaskStatus, WorkStatus

# Every body of the API: http/models.py's, the console's admin reads, the login lock's.
MODELS: Final = (
    *models.MODELS,
    *console_models.MODELS,
    *login_models.MODELS,
    *dependency_models.MODELS,
    *audit_models.MODELS,
    *bulk_models.MODELS,
)

Schema = dict[str, Any]

_SCHEMAS: Final = "#/components/schemas/"
_RESPONSES: Final = "#/components/responses/"
_PROBLEM_MEDIA: Final = "application/problem+json"
_JSON_MEDIA: Final = "application/json"


def _ref(name: str) -> Schema:
    return {"$ref": _SCHEMAS + name}


# ------------------------------------------------------------------ schemas, from the models

# The types that are not Structs but have a name in the document: a component each, which
# every body holding the type points to.
# Rules between a body's fields, which the models cannot state: the server enforces each.
CROSS_FIELD_RULES: Final[dict[str, Schema]] = {
    "PauseRequest": {
        "not": {
            "required": ["forS", "until"],
            "properties": {"forS": {"type": "number"}, "until": {"type": "string"}},
        }
    },
    "JobRedriveRequest": {"anyOf": [{"required": ["status"]}, {"required": ["jobIds"]}]},
}
# Named answers that are one of several models, the request deciding which.
ONE_OF: Final[dict[str, tuple[tuple[type[Struct], ...], str]]] = {
    "JobRedriveAnswer": (
        (bulk_models.JobRedriveResult, bulk_models.JobRedriveByIds),
        "JobRedriveByIds when the request named jobIds alone, else JobRedriveResult.",
    ),
}
NAMED_TYPES: Final[dict[str, tuple[Any, str]]] = {
    "OutboxItem": (models.OutboxItem, "A relay outbox row; its kind says which id it carries."),
    "JobStatus": (
        JobStatus,
        "QUEUED (committed, not yet on the queue), RUNNING (on the queue or being worked), "
        "SUCCEEDED, FAILED (not retryable), DEAD (retries exhausted) or CANCELLED (its owner "
        "or an admin cancelled it).",
    ),
    "RelayStatus": (RelayStatus, "Relay outbox state."),
    "TaskStatus": (TaskStatus, "Task run state."),
    "WorkStatus": (WorkStatus, "Classification work state."),
}
# msgspec sorts a Literal's values; these are listed in the order they are declared.
_ORDERED_ENUMS: Final = tuple(
    get_args(t)
    for t in (JobStatus, RelayStatus, TaskStatus, WorkStatus, JobEventType, models.TaskType)
)


def _nodes(node: Any) -> Iterator[Schema]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _nodes(value)
    elif isinstance(node, list | tuple):
        for value in node:
            yield from _nodes(value)


def _declared_order(schemas: Any) -> None:
    for node in _nodes(schemas):
        values = node.get("enum")
        for declared in _ORDERED_ENUMS:
            if isinstance(values, list) and set(values) == set(declared):
                node["enum"] = list(declared)


def _point_to(schemas: dict[str, Schema], name: str, inline: Schema) -> None:
    """Every inline copy of a named type (with or without a description) becomes a $ref."""
    for node in _nodes(schemas):
        if {k: v for k, v in node.items() if k != "description"} == inline:
            described = {"description": node["description"]} if "description" in node else {}
            node.clear()
            node.update({"$ref": _SCHEMAS + name, **described})


def _schemas() -> dict[str, Schema]:
    """The JSON Schema of every model in http/models.py, named types as components."""
    types = [t for t, _ in NAMED_TYPES.values()]
    inline, schemas = msgspec.json.schema_components(
        (*MODELS, *types), ref_template=_SCHEMAS + "{name}"
    )
    for schema in schemas.values():
        schema.pop("title", None)
    _declared_order([inline, schemas])
    for (name, (_, description)), named in zip(
        NAMED_TYPES.items(), inline[len(MODELS) :], strict=True
    ):
        _point_to(schemas, name, named)
        if "anyOf" in named:  # a tagged union: exactly one variant, chosen by the tag
            schemas[name] = {"oneOf": named["anyOf"], "discriminator": named["discriminator"]}
        else:
            schemas[name] = {"type": "string", **named}
        schemas[name]["description"] = description
    for name, rule in CROSS_FIELD_RULES.items():
        schemas[name].update(rule)
    # Answers whose shape the request decides (untagged, so msgspec names no union of them).
    for name, (variants, description) in ONE_OF.items():
        schemas[name] = {"oneOf": [_ref(v.__name__) for v in variants], "description": description}
    return dict(sorted(schemas.items()))


# ------------------------------------------------------------------ paths, from the route table


def _header(description: str, required: bool = True, **schema: Any) -> Schema:
    """A response header: a string, `schema` adding its enum or pattern."""
    schema = {"type": "string", **schema}
    return {"description": description, "required": required, "schema": schema}


_HEADERS: Final[dict[str, Schema]] = {
    "Location": _header("The new job (/v1/jobs/{jobId}), or where a redirect leads."),
    "Idempotent-Replayed": _header(
        "Present on a replay of an earlier request.", False, enum=["true"]
    ),
    "Retry-After": _header("Seconds to wait before retrying.", False),
    "WWW-Authenticate": _header("The Bearer challenge."),
    "Allow": _header("The methods the path accepts."),
    "Content-Security-Policy": _header("default-src 'self' and no inline script or style."),
    "X-Content-Type-Options": _header("nosniff"),
    "Referrer-Policy": _header("no-referrer"),
    "ETag": _header(
        "The body's entity tag: it changes whenever the body does (send it "
        "back in If-None-Match); weak (W/) where the route says what it covers.",
        pattern='^(W/)?"[0-9a-f]{24}"$',
    ),
    "Preference-Applied": _header(
        "wait=N: the request was held up to N seconds (Prefer's, at most "
        "api.max_wait_s); absent when no wait was applied.",
        False,
        pattern="^wait=[0-9]{1,4}$",
    ),
}


def _headers(names: tuple[str, ...] = ()) -> dict[str, Schema]:
    return {
        "X-Request-Id": {"$ref": "#/components/headers/X-Request-Id"},
        **{name: _HEADERS[name] for name in names},
    }


def _body_schema(body: type[Struct] | UnionType | str | None) -> Schema:
    if body is None:
        return {"type": "string"}
    if isinstance(body, str):  # a component of ONE_OF
        return _ref(body)
    if isinstance(body, type):
        return _ref(body.__name__)
    return _ref(next(name for name, (t, _) in NAMED_TYPES.items() if t == body))


def _ok(ok: Ok) -> Schema:
    response: Schema = {"description": ok.description, "headers": _headers(ok.headers)}
    if ok.media:  # none: a response without a body (304)
        response["content"] = {ok.media: {"schema": _body_schema(ok.body)}}
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
    # The least role that may call it (docs/contract.md#roles-and-the-audit-log).
    op["x-outboxd-role"] = route.access
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
                "traceparent": {
                    "name": "traceparent",
                    "in": "header",
                    "required": False,
                    "description": "W3C Trace Context: the job joins this trace (the relay "
                    "sends it with the SQS message, the worker continues it, log lines about "
                    "the job carry its trace_id). A missing or malformed one is ignored and "
                    "the daemon starts a trace of its own.",
                    "schema": {"type": "string"},
                },
                "Prefer": {
                    "name": "Prefer",
                    "in": "header",
                    "required": False,
                    "description": "RFC 7240. wait=N holds the request up to N seconds (clamped "
                    "to api.max_wait_s, 60 by default; 0 does not wait) until the answer "
                    "changes (with If-None-Match; a job: or finishes, without). Other "
                    "preferences, and a wait that is not a whole number, are ignored.",
                    "schema": {"type": "string"},
                },
                "If-None-Match": {
                    "name": "If-None-Match",
                    "in": "header",
                    "required": False,
                    "description": "An ETag of the answer (or *): 304 while it is still the "
                    "current one (with Prefer: wait, after the wait).",
                    "schema": {"type": "string"},
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
