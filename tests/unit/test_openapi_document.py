"""The OpenAPI 3.1 document: valid, complete, and true to the API's renderers."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any, cast

import pytest
from aiohttp import web
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from referencing import Registry
from referencing.jsonschema import DRAFT202012
from testkit.records import CS101_RECORD, EXPECTED_RECORD, SAMPLE_STUDENT_RECORD

from outboxd.http import models
from outboxd.http.openapi import openapi_document
from outboxd.http.problems import (
    INTERNAL_ERROR,
    INVALID_STATE,
    UNAUTHENTICATED,
    VALIDATION_FAILED,
    ApiError,
)
from outboxd.http.render import (
    dispatch_body,
    event_model,
    job_body,
    relay_item,
    stats_body,
    task_model,
    website_body,
)
from outboxd.http.responses import problem
from outboxd.queue.sqs import QueueDepth, QueueKind
from outboxd.services.admin import collect_stats
from outboxd.storage.ports import JobEvent, JobRecord, PaceState, RelayRow, StatusCount, TaskRun
from outboxd.storage.website_ports import Website

_BASE = "urn:outboxd:openapi"
_METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")
_PUBLIC = {"/healthz", "/readyz", "/metrics", "/openapi.json", "/", "/ui", "/favicon.ico"}
_T0 = 1_700_000_000.25


@pytest.fixture(scope="module")
def doc() -> dict[str, Any]:
    """One copy of the document for the read-only tests."""
    return openapi_document()


def _validator(doc: dict[str, Any], name: str) -> Any:
    registry: Registry[Any] = Registry().with_resource(_BASE, DRAFT202012.create_resource(doc))
    return Draft202012Validator(
        {"$ref": f"{_BASE}#/components/schemas/{name}"},
        registry=registry,
        format_checker=Draft202012Validator.FORMAT_CHECKER,
    )


def _assert_valid(doc: dict[str, Any], name: str, body: Any) -> None:
    errors = sorted(_validator(doc, name).iter_errors(body), key=str)
    assert not errors, [f"{list(e.absolute_path)}: {e.message}" for e in errors]


def _is_valid(doc: dict[str, Any], name: str, body: Any) -> bool:
    return bool(_validator(doc, name).is_valid(body))


def _operations(doc: dict[str, Any]) -> Iterator[tuple[str, str, dict[str, Any]]]:
    for path, item in doc["paths"].items():
        for method in _METHODS:
            if method in item:
                yield path, method, item[method]


def _resolve(doc: dict[str, Any], obj: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in obj:
        node: Any = doc
        for part in obj["$ref"].removeprefix("#/").split("/"):
            node = node[part]
        obj = node
    return obj


def _walk(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for value in node:
            yield from _walk(value)


def _portal_result() -> dict[str, Any]:
    return {
        "student": {**SAMPLE_STUDENT_RECORD, "name": "홍길동"},
        "semesters": [
            {
                **EXPECTED_RECORD["semesters"][0],
                "year": 2024,
                "courses": [
                    dict(CS101_RECORD),
                    {
                        "code": "GE200",
                        "title": "글쓰기",
                        "credits": 2,
                        "grade": "P",
                        "gradePoints": None,
                        "category": "교양선택",
                        "department": None,
                    },
                ],
            },
            {
                "year": 2024,
                "term": "summer",
                "creditsAttempted": 3,
                "creditsEarned": 3,
                "gpa": 3.5,
                "percentile": 85,
                "rank": None,
                "courses": [],
            },
        ],
        "totals": {"creditsAttempted": 21, "creditsEarned": 21, "gpa": 4.0, "percentile": 92.1},
    }


def _job(**changes: Any) -> JobRecord:
    fields: dict[str, Any] = {
        "id": "0b5f3c1e-8a7d-4f43-9d7e-1f1e1c4a2b3c",
        "kind": "portal_link",
        "portal": "suwon",
        "user_id": "alice",
        "idempotency_key": "k-1",
        "fingerprint": "ff",
        "status": "SUCCEEDED",
        "attempts": 1,
        "key_id": None,
        "sealed": None,
        "lease_until": None,
        "progress": {"step": "GRADES", "done": 2, "total": 2},
        "error_code": None,
        "error_message": None,
        "result": _portal_result(),
        "created_at": _T0,
        "updated_at": _T0 + 5,
        "finished_at": _T0 + 5,
        "version": 4,
    }
    fields.update(changes)
    return JobRecord(**fields)


def _relay(**changes: Any) -> RelayRow:
    fields: dict[str, Any] = {
        "id": "6a0e2a52-9a56-4a43-8a4c-0c9f3f3a1d11",
        "kind": "job",
        "job_id": "0b5f3c1e-8a7d-4f43-9d7e-1f1e1c4a2b3c",
        "task_id": None,
        "status": "SENT",
        "attempt_count": 1,
        "next_attempt_at": _T0,
        "last_error": None,
        "queue_message_id": "msg-1",
        "dedup_id": "d-1",
        "created_at": _T0,
        "sent_at": _T0 + 1,
        "claimed_until": None,
        "version": 2,
    }
    fields.update(changes)
    return RelayRow(**fields)


def test_document_is_valid_openapi_31(doc: dict[str, Any]) -> None:
    """The document passes the OpenAPI 3.1 validator and declares version 3.1.0."""
    assert doc["openapi"] == "3.1.0"
    validate(doc, cls=OpenAPIV31SpecValidator)


def test_document_is_a_fresh_copy_each_call() -> None:
    """Mutating one returned document does not change the next one."""
    first = openapi_document()
    first["paths"].clear()
    first["components"]["schemas"]["Problem"]["required"].append("mutated")
    second = openapi_document()
    assert second["paths"]
    assert "mutated" not in second["components"]["schemas"]["Problem"]["required"]


def test_document_is_json_serialisable(doc: dict[str, Any]) -> None:
    """The document round-trips through JSON unchanged, as /openapi.json serves it."""
    assert json.loads(json.dumps(doc)) == doc


def test_every_route_of_the_spec_is_described(doc: dict[str, Any]) -> None:
    """Exactly the routes and methods of docs/contract.md#http-api are documented."""
    found = {(path, method) for path, method, _ in _operations(doc)}
    assert found == {
        ("/v1/portal-link-jobs", "post"),
        ("/v1/jobs/{job_id}", "get"),
        ("/v1/jobs/{job_id}/events", "get"),
        ("/v1/jobs/{job_id}/cancel", "post"),
        ("/v1/websites", "post"),
        ("/v1/websites/{domain}", "get"),
        ("/v1/admin/outbox", "get"),
        ("/v1/admin/jobs/redrive", "post"),
        ("/v1/admin/outbox/{outbox_id}/redrive", "post"),
        ("/v1/admin/jobs/{job_id}/redrive", "post"),
        ("/v1/admin/stats", "get"),
        ("/v1/admin/tasks", "post"),
        ("/v1/admin/tasks", "get"),
        # The portal login lock: who caused which lock, and the unlock.
        ("/v1/admin/portal-logins", "get"),
        ("/v1/admin/portal-logins/unlock", "post"),
        ("/v1/admin/dependencies", "get"),
        ("/v1/admin/audit", "get"),
        ("/v1/admin/dependencies/{name}/pause", "post"),
        ("/v1/admin/dependencies/{name}/resume", "post"),
        ("/healthz", "get"),
        ("/readyz", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
        # The operator console: its admin reads and its static files.
        ("/v1/admin/jobs", "get"),
        ("/v1/admin/jobs/{job_id}", "get"),
        ("/v1/admin/websites", "get"),
        ("/v1/admin/websites/{domain}/retry", "post"),
        ("/v1/admin/runtime", "get"),
        ("/ui/", "get"),
        ("/ui/jobs", "get"),
        ("/ui/jobs/{job_id}", "get"),
        ("/ui/dead-letters", "get"),
        ("/ui/websites", "get"),
        ("/ui/tasks", "get"),
        ("/ui/dependencies", "get"),
        ("/ui/audit", "get"),
        ("/ui/assets/app.js", "get"),
        ("/ui/assets/app.css", "get"),
        ("/", "get"),
        ("/ui", "get"),
        ("/favicon.ico", "get"),
    }


def test_every_operation_has_an_id_tags_and_responses(doc: dict[str, Any]) -> None:
    """Each operation has a unique operationId, a known tag and at least one 2xx response (a
    redirect, 3xx)."""
    tags = {t["name"] for t in doc["tags"]}
    assert tags == {"jobs", "websites", "admin", "operations", "console"}
    ids = [op.get("operationId") for _, _, op in _operations(doc)]
    assert all(ids) and len(ids) == len(set(ids))
    for path, method, op in _operations(doc):
        assert op["tags"] and set(op["tags"]) <= tags, (path, method)
        assert any(code.startswith(("2", "3")) for code in op["responses"]), (path, method)
        assert "500" in op["responses"], (path, method)


def test_path_parameters_match_the_templates(doc: dict[str, Any]) -> None:
    """Every {name} in a path is a required path parameter of that name, and nothing else is."""
    for path, item in doc["paths"].items():
        declared = {
            p["name"]
            for p in (_resolve(doc, p) for p in item.get("parameters", []))
            if p["in"] == "path"
        }
        assert declared == set(re.findall(r"\{(\w+)\}", path)), path


def test_security_is_global_bearer_with_public_overrides(doc: dict[str, Any]) -> None:
    """Bearer auth applies everywhere except the public routes, which override it."""
    assert doc["components"]["securitySchemes"]["bearer"] == {
        **doc["components"]["securitySchemes"]["bearer"],
        "type": "http",
        "scheme": "bearer",
    }
    assert doc["security"] == [{"bearer": []}]
    for path, method, op in _operations(doc):
        if path in _PUBLIC or path.startswith("/ui/"):
            assert op["security"] == [], (path, method)
        else:
            assert "security" not in op, (path, method)
            assert "401" in op["responses"], (path, method)
        if path.startswith("/v1/admin/"):
            assert "403" in op["responses"], (path, method)


def test_responses_carry_request_id_and_errors_are_problems(doc: dict[str, Any]) -> None:
    """Every response has X-Request-Id; 4xx/5xx are problem+json (bar /readyz's 503); 401 has
    WWW-Authenticate."""
    for path, method, op in _operations(doc):
        for code, ref in op["responses"].items():
            response = _resolve(doc, ref)
            assert "X-Request-Id" in response["headers"], (path, method, code)
            if code[0] in "45" and not (path == "/readyz" and code == "503"):
                schema = response["content"]["application/problem+json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/Problem"}, (path, method, code)
            if code == "401":
                assert "WWW-Authenticate" in response["headers"], (path, method)
    method_not_allowed = doc["components"]["responses"]["MethodNotAllowed"]
    assert "Allow" in method_not_allowed["headers"]


def test_no_30_style_nullable_keyword(doc: dict[str, Any]) -> None:
    """Nullability is expressed with 3.1 type arrays, never the 3.0 `nullable` keyword."""
    assert not any(isinstance(n, dict) and "nullable" in n for n in _walk(doc))


def test_problem_schema_requires_the_spec_fields(doc: dict[str, Any]) -> None:
    """The Problem schema requires the RFC 9457 fields docs/contract.md#errors names
    and enumerates the codes."""
    schema = doc["components"]["schemas"]["Problem"]
    assert set(schema["required"]) >= {"type", "title", "status", "detail", "code", "requestId"}
    assert schema["properties"]["code"]["enum"] == [f"C{n:02d}" for n in range(1, 14)] + ["C99"]


class _RequestStub:
    def __init__(self, request_id: str) -> None:
        self._request_id = request_id

    def get(self, _key: object, _default: object = None) -> str:
        return self._request_id


def test_problem_bodies_from_the_api_validate(doc: dict[str, Any]) -> None:
    """Bodies rendered by responses.problem, with and without field errors, match Problem."""
    # problem() only reads the request id from request storage; the stub answers it
    # for whatever key the HTTP side uses, and leaves aiohttp's process-wide state alone.
    request = cast(web.Request, _RequestStub("req-1"))
    for err in (
        ApiError(
            VALIDATION_FAILED, "domain: is required", [{"field": "domain", "message": "required"}]
        ),
        ApiError(UNAUTHENTICATED, "a bearer token is required"),
        ApiError(INVALID_STATE, "not DEAD"),
        ApiError(INTERNAL_ERROR, "internal error"),
    ):
        response = problem(request, err)
        assert response.content_type == "application/problem+json"
        assert isinstance(response.body, bytes)
        _assert_valid(doc, "Problem", json.loads(response.body))
    assert not _is_valid(doc, "Problem", {"type": "x", "title": "t", "status": 400})


def test_job_body_with_a_full_portal_result_validates(doc: dict[str, Any]) -> None:
    """api.job_body of a SUCCEEDED job with a complete portal result matches Job."""
    body = job_body(_job())
    assert body["result"] == _portal_result()
    _assert_valid(doc, "Job", body)
    _assert_valid(doc, "PortalResult", _portal_result())


def test_job_bodies_in_other_states_validate(doc: dict[str, Any]) -> None:
    """Queued, running, failed and dead job bodies (nulls, progress, errors) match Job."""
    for job in (
        _job(status="QUEUED", attempts=0, progress=None, result=None, finished_at=None),
        _job(
            status="RUNNING",
            progress={"step": "LOGIN", "done": 0, "total": 0},
            result=None,
            finished_at=None,
            error_code="PORTAL_UNAVAILABLE",
            error_message="timeout",
        ),
        _job(status="FAILED", result=None, error_code="PORTAL_AUTH_FAILED", error_message="no"),
        _job(status="DEAD", result=None, error_code="RETRIES_EXHAUSTED", error_message=None),
        _job(status="RUNNING", result=None, finished_at=None, cancel_requested=True),
        _job(status="CANCELLED", result=None, cancel_requested=True),
    ):
        _assert_valid(doc, "Job", job_body(job))


def test_timeline_bodies_validate(doc: dict[str, Any]) -> None:
    """A timeline from the renderers matches JobTimeline; an unknown type or status does not."""
    job_id = "0b5f3c1e-8a7d-4f43-9d7e-1f1e1c4a2b3c"
    events = [
        JobEvent(job_id, 1, _T0, "accepted", "QUEUED", 0, "host:1", None),
        JobEvent(job_id, 5, _T0 + 1, "dispatched", "RUNNING", 0, "host:1", {"messageId": "m"}),
        JobEvent(job_id, 9, _T0 + 2, "retry_scheduled", "RUNNING", 1, "h", {"delayS": 5}),
        JobEvent(job_id, 12, _T0 + 3, "cancelled", "CANCELLED", 1, "h", {"by": "owner"}),
    ]
    body = models.to_builtins(models.JobTimeline(job_id, [event_model(e) for e in events]))
    _assert_valid(doc, "JobTimeline", body)
    bad = json.loads(json.dumps(body))
    bad["events"][0]["type"] = "exploded"
    assert not _is_valid(doc, "JobTimeline", bad)
    bad["events"][0]["type"], bad["events"][0]["status"] = "accepted", "GONE"
    assert not _is_valid(doc, "JobTimeline", bad)


def test_job_schema_rejects_wrong_bodies(doc: dict[str, Any]) -> None:
    """A job body with an unknown status, a missing field or a malformed result is rejected."""
    good = job_body(_job())
    assert not _is_valid(doc, "Job", {**good, "status": "DONE"})
    assert not _is_valid(doc, "Job", {k: v for k, v in good.items() if k != "finishedAt"})
    assert not _is_valid(doc, "Job", {**good, "createdAt": "yesterday"})
    bad_result = _portal_result()
    bad_result["semesters"][0]["term"] = "10"
    assert not _is_valid(doc, "Job", {**good, "result": bad_result})


def test_website_bodies_validate(doc: dict[str, Any]) -> None:
    """Website bodies from api.website_body match Website, and WebsiteRequest screens domains."""
    fresh = Website(
        "3f2c0b8e-0a7e-4c55-b0a5-6a2bb7ad1f10",
        "xn--bcher-kva.example",
        None,
        None,
        _T0,
        "PENDING",
        0,
        None,
    )
    done = Website(
        "3f2c0b8e-0a7e-4c55-b0a5-6a2bb7ad1f10",
        "example.com",
        "https://example.com/favicon.ico",
        "news",
        _T0,
        "COMPLETED",
        2,
        "timeout",
    )
    orphan = Website(
        "3f2c0b8e-0a7e-4c55-b0a5-6a2bb7ad1f10", "example.org", None, None, _T0, None, 0, None
    )
    for website in (fresh, done, orphan):
        _assert_valid(doc, "Website", website_body(website))
    bad = website_body(done)
    bad["classification"]["status"] = "DONE"
    assert not _is_valid(doc, "Website", bad)
    for domain in ("example.com", "Example.COM.", "a.b.c.io", "a-b.x9"):
        _assert_valid(doc, "WebsiteRequest", {"domain": domain, "faviconUrl": None})
    for domain in ("https://a.com", "a.com/x", "a.com:80", "a..com", "localhost", "10.0.0.1"):
        assert not _is_valid(doc, "WebsiteRequest", {"domain": domain}), domain
    assert not _is_valid(doc, "WebsiteRequest", {"domain": "a.com", "faviconUrl": "ftp://x"})


def test_portal_link_bodies_validate(doc: dict[str, Any]) -> None:
    """The 202 body (with and without dispatch) and a request body match their schemas."""
    job_id = "0b5f3c1e-8a7d-4f43-9d7e-1f1e1c4a2b3c"
    for dispatch in (
        dispatch_body(_relay()),
        dispatch_body(None),
        dispatch_body(_relay(status="RETRYABLE_FAILED", queue_message_id=None)),
    ):
        _assert_valid(
            doc, "PortalLinkAccepted", {"jobId": job_id, "status": "RUNNING", "dispatch": dispatch}
        )
    request = {"portal": "suwon", "username": "20201234", "password": "s3cret"}
    _assert_valid(doc, "PortalLinkRequest", request)
    assert not _is_valid(doc, "PortalLinkRequest", {**request, "extra": 1})
    assert not _is_valid(doc, "PortalLinkRequest", {**request, "portal": "other"})
    assert not _is_valid(doc, "PortalLinkRequest", {**request, "username": "x" * 65})
    password = doc["components"]["schemas"]["PortalLinkRequest"]["properties"]["password"]
    assert password["writeOnly"] is True and password["format"] == "password"


def test_admin_bodies_validate(doc: dict[str, Any]) -> None:
    """Relay items, task runs and their pages from the api renderers match their schemas."""
    job_row = relay_item(_relay())
    task_row = relay_item(
        _relay(
            kind="task",
            job_id=None,
            task_id="t-1",
            status="DEAD",
            last_error="boom",
            queue_message_id=None,
        )
    )
    pending = relay_item(_relay(status="PENDING", queue_message_id=None))
    for item in (job_row, task_row, pending):
        _assert_valid(doc, "OutboxItem", item)
    _assert_valid(doc, "OutboxPage", {"items": [job_row, task_row], "nextCursor": "abc"})
    assert not _is_valid(doc, "OutboxItem", {**job_row, "taskId": "t-1"})
    run = TaskRun(
        "9d3b1f3e-4e55-4a8b-8d3a-0b1c2d3e4f50",
        "noop",
        {},
        "d-1",
        "SUCCEEDED",
        None,
        _T0,
        _T0 + 1,
        1,
    )
    failed = TaskRun(
        "9d3b1f3e-4e55-4a8b-8d3a-0b1c2d3e4f50",
        "outbox.prune",
        {},
        "d-2",
        "FAILED",
        "boom",
        _T0,
        None,
        1,
    )
    items = [models.to_builtins(task_model(r)) for r in (run, failed)]
    _assert_valid(doc, "TaskPage", {"items": items, "nextCursor": None})
    _assert_valid(doc, "TaskRequest", {"type": "outbox.prune", "payload": {}, "dedupId": None})
    assert not _is_valid(doc, "TaskRequest", {"type": "rm -rf"})


class _Counts:
    async def status_counts(self) -> list[StatusCount]:
        return [
            StatusCount("jobs", "QUEUED", 2, _T0),
            StatusCount("jobs", "SUCCEEDED", 7, None),
            StatusCount("relay_outbox", "RETRYABLE_FAILED", 1, _T0 + 3),
        ]

    async def pace_states(self, now: float) -> list[PaceState]:
        return [PaceState("ai", _T0, _T0 + 1, _T0 + 3, _T0 + 0.5, 0)]


class _Queues:
    async def queue_stats(self) -> dict[QueueKind, QueueDepth]:
        return {"jobs": QueueDepth(1, 0, 0), "tasks": QueueDepth(0, 0, 2)}


async def test_stats_bodies_validate(doc: dict[str, Any]) -> None:
    """admin.collect_stats with and without queue statistics matches Stats."""
    _assert_valid(doc, "Stats", stats_body(await collect_stats(_Counts(), None)))
    _assert_valid(doc, "Stats", stats_body(await collect_stats(_Counts(), _Queues())))
    _assert_valid(doc, "Readiness", {"status": "unavailable", "checks": {"sqs": "timeout"}})
    _assert_valid(doc, "Health", {"status": "ok"})
