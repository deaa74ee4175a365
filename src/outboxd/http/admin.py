"""The admin API (role admin, checked by the edge from the route table): listings, redrive,
retry, stats, tasks, and the console's runtime view."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import cast

import structlog
from aiohttp import web

from outboxd.errors import InvalidState, NotFound
from outboxd.http import bulk_models, checks, inputs, models
from outboxd.http.conditional import Encoded, digest, held_view
from outboxd.http.deps import AUDIT_TARGET, deps_of, principal_of
from outboxd.http.problems import INVALID_STATE, NOT_FOUND, ApiError, field_error
from outboxd.http.render import (
    admin_job_model,
    job_detail_model,
    job_model,
    relay_model,
    runtime_model,
    stats_model,
    task_model,
    website_model,
)
from outboxd.http.responses import json_response
from outboxd.http.websites import domain_in_path
from outboxd.storage.ports import JOB_STATUSES, RELAY_STATUSES, WORK_STATUSES, JobFilter

log = structlog.get_logger(__name__)

_PAGE_QUERY = {"status", "limit", "cursor"}
_TASK_FIELDS = checks.wire_names(models.TaskRequest)
_REDRIVE_FIELDS = checks.wire_names(bulk_models.JobRedriveRequest)
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


@contextmanager
def _operator_action(names: str) -> Iterator[None]:
    """How every operator action answers: NotFound is 404 (no such `names`), InvalidState
    409 with its reason."""
    try:
        yield
    except NotFound:
        raise ApiError(NOT_FOUND, f"no such {names}") from None
    except InvalidState as exc:
        raise ApiError(INVALID_STATE, str(exc)) from None


async def redrive_outbox(request: web.Request) -> web.Response:
    deps = deps_of(request)
    with _operator_action("outbox row"):
        row = await deps.admin.redrive_outbox_row(
            inputs.path_id(request, "outbox_id"), actor=principal_of(request).user
        )
    return json_response(relay_model(row))


async def redrive_job(request: web.Request) -> web.Response:
    deps = deps_of(request)
    with _operator_action("job"):
        job = await deps.admin.redrive_job(
            inputs.path_id(request, "job_id"), actor=principal_of(request).user
        )
    return json_response(
        job_model(job, principal_of(request)),
        status=202,
        headers={"Location": f"/v1/jobs/{job.id}"},
    )


_JOB_QUERY = {*_PAGE_QUERY, "user", "username", "errorCode", "from", "to"}


async def redrive_jobs(request: web.Request) -> web.Response:
    """The bulk redrive (services/admin.py logs each batch with the acting user)."""
    deps = deps_of(request)
    body = await inputs.read_json_object(request, deps.settings.server.max_body_bytes)
    inputs.check_fields(body, _REDRIVE_FIELDS)
    if "status" not in body and "jobIds" in body:
        # The ids on the operator's screen, and nothing else: a job that died since is not
        # touched.
        named = checks.redrive_ids(body)
        request[AUDIT_TARGET] = f"{len(named)} jobs"
        by_ids = await deps.admin.redrive_jobs(actor=principal_of(request).user, job_ids=named)
        skipped = [bulk_models.RedriveSkip(j, bulk_models.skip_code(w)) for j, w in by_ids.refused]
        return json_response(bulk_models.JobRedriveByIds(by_ids.redriven, skipped))
    job_ids, limit = checks.redrive_selection(body)
    done = await deps.admin.redrive_jobs(
        actor=principal_of(request).user,
        job_ids=job_ids,
        status=None if job_ids is not None else "DEAD",
        limit=limit,
    )
    return json_response(
        bulk_models.JobRedriveResult(
            redriven=len(done.redriven),
            job_ids=done.redriven,
            refused=[bulk_models.RedriveRefusal(job_id, why) for job_id, why in done.refused],
            more=done.more,
        )
    )


async def list_jobs(request: web.Request) -> web.Response:
    inputs.only_query(request, _JOB_QUERY)
    deps = deps_of(request)
    user = inputs.query_text(request, "user", 128)
    if user == "":
        raise field_error("user", "must not be empty (leave it out for every user)")
    # A portal username is searched by its keyed hash, as intake stored it: the username is
    # checked as intake checks it, then hashed, and goes no further (not logged, not echoed).
    username = request.query.get("username")
    subject = None if username is None else deps.logins.subject(checks.portal_username(username))
    where = JobFilter(
        status=inputs.query_status(request, JOB_STATUSES),
        user_id=user,
        error_code=inputs.query_error_code(request, "errorCode"),
        created_from=inputs.query_time(request, "from"),
        created_to=inputs.query_time(request, "to"),
        login_subject=subject,
    )
    limit, cursor = inputs.query_limit(request), inputs.query_cursor(request)
    reader = principal_of(request)

    async def read() -> Encoded:
        page = await deps.store.list_jobs(None, limit, cursor, where)
        items = [admin_job_model(j, reader) for j in page.items]
        body = models.encode(models.JobPage(items, page.next_cursor))
        return body, digest(body)

    # Held with Prefer: wait until a job's change alters this page (http/conditional.py);
    # results are shown to admins only, so admins share one view and the others another.
    view = f"jobs {where!r} {limit} {cursor} {reader.is_admin}"
    return await held_view(request, view, read)


async def get_job_detail(request: web.Request) -> web.Response:
    deps = deps_of(request)
    job = await deps.store.get_job(inputs.path_id(request, "job_id"))
    if job is None:
        raise ApiError(NOT_FOUND, "no such job")
    rows = await deps.store.relay_rows_for_job(job.id, 20)
    return json_response(job_detail_model(job, rows, principal_of(request)))


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
    with _operator_action("website"):
        website = await deps.websites.retry(
            domain_in_path(request), actor=principal_of(request).user
        )
    return json_response(website_model(website))


async def runtime(request: web.Request) -> web.Response:
    deps = deps_of(request)
    checks = await deps.readiness.check()
    rt = deps.runtime
    return json_response(
        runtime_model(
            time.time(),
            checks,
            rt.claimer_pace() if rt is not None else None,
            rt.schedules() if rt is not None else [],
            rt.throughput_series() if rt is not None else [],
            principal_of(request),
        )
    )


async def stats(request: web.Request) -> web.Response:
    """The numbers, with a weak ETag over what does not move with the clock (the ages and
    the pace's countdowns do): held with Prefer: wait until a job's change alters them."""
    admin_service = deps_of(request).admin

    async def read() -> Encoded:
        model = stats_model(await admin_service.stats())
        steady = (
            model.tables,
            model.queues,
            {
                k: (p.last_slot_at, p.next_slot_at, p.paused_until, p.sessions)
                for k, p in model.pace.items()
            },
        )
        return models.encode(model), digest(models.encode(steady))

    return await held_view(request, "stats", read, weak=True)


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
