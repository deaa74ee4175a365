"""The admin API (role admin, checked by the edge from the route table): listings, redrive,
retry, stats, tasks, and the console's runtime view."""

from __future__ import annotations

import time
from typing import cast

import structlog
from aiohttp import web

from outboxd.errors import InvalidState, NotFound
from outboxd.http import checks, inputs, models
from outboxd.http.deps import deps_of, principal_of
from outboxd.http.problems import INVALID_STATE, NOT_FOUND, ApiError, field_error
from outboxd.http.render import (
    iso,
    job_body,
    job_model,
    relay_item,
    relay_model,
    task_model,
    website_model,
)
from outboxd.http.responses import json_response
from outboxd.services.tasks import BUILTIN_TASKS
from outboxd.services.websites import InvalidDomain, normalize_domain
from outboxd.storage.ports import JOB_STATUSES, RELAY_STATUSES, WORK_STATUSES

log = structlog.get_logger(__name__)

_PAGE_QUERY = {"status", "limit", "cursor"}
_TASK_FIELDS = checks.wire_names(models.TaskRequest)
_TASK_PAYLOAD_FIELDS = checks.wire_names(models.TaskPayload)
_check_task_type = checks.check_text_fields(models.TaskRequest, ("type",))
_check_dedup_id = checks.check_text_fields(models.TaskRequest, ("dedup_id",))


async def list_outbox(request: web.Request) -> web.Response:
    inputs.only_query(request, _PAGE_QUERY)
    deps = deps_of(request)
    status = inputs.query_text(request, "status", 32)
    if status is not None and status not in RELAY_STATUSES:
        raise field_error(
            "status", "must be " + ", ".join(RELAY_STATUSES[:-1]) + " or " + RELAY_STATUSES[-1]
        )
    page = await deps.store.list_relay_rows(
        status, inputs.query_limit(request), inputs.query_cursor(request)
    )
    return json_response(models.OutboxPage([relay_model(r) for r in page.items], page.next_cursor))


async def redrive_outbox(request: web.Request) -> web.Response:
    deps = deps_of(request)
    try:
        row = await deps.admin.redrive_outbox_row(
            inputs.path_id(request, "outbox_id"), actor=principal_of(request).user
        )
    except NotFound:
        raise ApiError(NOT_FOUND, "no such outbox row") from None
    except InvalidState as exc:
        raise ApiError(INVALID_STATE, str(exc)) from None
    return json_response(relay_model(row))


async def redrive_job(request: web.Request) -> web.Response:
    deps = deps_of(request)
    try:
        job = await deps.admin.redrive_job(
            inputs.path_id(request, "job_id"), actor=principal_of(request).user
        )
    except NotFound:
        raise ApiError(NOT_FOUND, "no such job") from None
    except InvalidState as exc:
        raise ApiError(INVALID_STATE, str(exc)) from None
    return json_response(job_model(job), status=202, headers={"Location": f"/v1/jobs/{job.id}"})


async def list_jobs(request: web.Request) -> web.Response:
    inputs.only_query(request, _PAGE_QUERY)
    deps = deps_of(request)
    status = inputs.query_status(request, JOB_STATUSES)
    page = await deps.store.list_jobs(
        status, inputs.query_limit(request), inputs.query_cursor(request)
    )
    return json_response(models.JobPage([job_model(j) for j in page.items], page.next_cursor))


async def get_job_detail(request: web.Request) -> web.Response:
    deps = deps_of(request)
    job = await deps.store.get_job(inputs.path_id(request, "job_id"))
    if job is None:
        raise ApiError(NOT_FOUND, "no such job")
    rows = await deps.store.relay_rows_for_job(job.id, 20)
    return json_response({**job_body(job), "outbox": [relay_item(r) for r in rows]})


async def list_websites(request: web.Request) -> web.Response:
    inputs.only_query(request, _PAGE_QUERY)
    deps = deps_of(request)
    status = inputs.query_status(request, WORK_STATUSES)
    page = await deps.websites.list(
        status, inputs.query_limit(request), inputs.query_cursor(request)
    )
    return json_response(
        models.WebsitePage([website_model(w) for w in page.items], page.next_cursor)
    )


async def retry_website(request: web.Request) -> web.Response:
    deps = deps_of(request)
    try:
        domain = normalize_domain(inputs.path_id(request, "domain", 300))
        website = await deps.websites.retry(domain, actor=principal_of(request).user)
    except (InvalidDomain, UnicodeError, NotFound):
        raise ApiError(NOT_FOUND, "no such website") from None
    except InvalidState as exc:
        raise ApiError(INVALID_STATE, str(exc)) from None
    return json_response(website_model(website))


async def runtime(request: web.Request) -> web.Response:
    deps = deps_of(request)
    checks = await deps.readiness.check()
    rt = deps.runtime
    pace = rt.claimer_pace() if rt is not None else None
    return json_response(
        {
            "now": iso(time.time()),
            "readiness": {
                "status": "ok" if all(v == "ok" for v in checks.values()) else "unavailable",
                "checks": checks,
            },
            "claimer": None
            if pace is None
            else {
                "lastTickAt": iso(pace[0]),
                "nextTickAt": iso(pace[1]),
                "pausedUntil": iso(pace[2]),
            },
            "schedules": [
                {"name": name, "task": task, "nextFireAt": iso(at)}
                for name, task, at in (rt.schedules() if rt is not None else [])
            ],
            "throughput": [
                {"minute": iso(at), "accepted": accepted, "finished": finished}
                for at, accepted, finished in (rt.throughput_series() if rt is not None else [])
            ],
            "taskTypes": list(BUILTIN_TASKS),
        }
    )


async def stats(request: web.Request) -> web.Response:
    return json_response(await deps_of(request).admin.stats())


async def enqueue_task(request: web.Request) -> web.Response:
    deps = deps_of(request)
    body = await inputs.read_json_object(request, deps.settings.server.max_body_bytes)
    inputs.check_fields(body, _TASK_FIELDS)
    type_ = cast(str, _check_task_type(body)["type"])
    payload = body.get("payload", {})
    if not isinstance(payload, dict):
        raise field_error("payload", "must be a JSON object")
    inputs.check_fields(payload, _TASK_PAYLOAD_FIELDS)
    checks.payload_days(payload)
    dedup = _check_dedup_id(body)["dedup_id"]
    if dedup is not None and not models.DEDUP_ID_RE.match(dedup):
        raise field_error(
            "dedupId", "must be 1-128 characters of letters, digits and ASCII punctuation"
        )
    run, created = await deps.tasks.enqueue(type_, payload, dedup, actor=principal_of(request).user)
    if not created and run.type != type_:
        raise ApiError(INVALID_STATE, "dedupId is already used by a task of another type")
    return json_response(models.TaskAccepted(run.id), 202)


async def list_tasks(request: web.Request) -> web.Response:
    inputs.only_query(request, {"type", "limit", "cursor"})
    deps = deps_of(request)
    type_ = inputs.query_text(request, "type", 100) or None
    page = await deps.store.list_tasks(
        type_, inputs.query_limit(request), inputs.query_cursor(request)
    )
    return json_response(models.TaskPage([task_model(r) for r in page.items], page.next_cursor))
