"""Portal link jobs: intake (idempotent per user and key) and a job's state, owner or admin."""

from __future__ import annotations

from typing import cast

import structlog
from aiohttp import web

from outboxd.errors import QuotaExceeded
from outboxd.http import checks, inputs, models
from outboxd.http.deps import deps_of, principal_of
from outboxd.http.problems import (
    ENQUEUE_FAILED,
    IDEMPOTENCY_KEY_CONFLICT,
    IDEMPOTENCY_KEY_REQUIRED,
    NOT_FOUND,
    TOO_MANY_ACTIVE_JOBS,
    ApiError,
)
from outboxd.http.render import dispatch_model, job_model
from outboxd.http.responses import json_response
from outboxd.services.portal_jobs import DispatchFailed, IdempotencyConflict, PortalLinkRequest
from outboxd.storage.ports import JobRecord

log = structlog.get_logger(__name__)

_PORTAL_LINK_FIELDS = checks.wire_names(models.PortalLinkRequest)
_check_portal_link = checks.check_text_fields(
    models.PortalLinkRequest, ("portal", "username", "password")
)


async def post_portal_link_job(request: web.Request) -> web.Response:
    deps = deps_of(request)
    user = principal_of(request).user
    key = request.headers.get("Idempotency-Key")
    if key is not None:
        inputs.no_bidi("Idempotency-Key", key)
    if key is None or not models.IDEMPOTENCY_KEY_RE.match(key):
        raise ApiError(
            IDEMPOTENCY_KEY_REQUIRED,
            "Idempotency-Key must be 1-255 visible ASCII characters",
            [{"field": "Idempotency-Key", "message": "missing, empty, too long or not ASCII"}],
        )
    body = await inputs.read_json_object(request, deps.settings.server.max_body_bytes)
    inputs.check_fields(body, _PORTAL_LINK_FIELDS)
    fields = _check_portal_link(body)
    link = PortalLinkRequest(
        cast(str, fields["portal"]), cast(str, fields["username"]), cast(str, fields["password"])
    )
    try:
        sub = await deps.jobs.submit(user, key, link)
    except QuotaExceeded as exc:
        raise _too_many(exc) from None
    except IdempotencyConflict:
        raise ApiError(
            IDEMPOTENCY_KEY_CONFLICT,
            "this Idempotency-Key was already used with a different request",
        ) from None
    except DispatchFailed as exc:
        log.warning("dispatch_required_failed", job_id=exc.job.id)
        raise ApiError(
            ENQUEUE_FAILED,
            f"job {exc.job.id} was stored but could not be queued; retry with the "
            "same Idempotency-Key",
            headers={"Retry-After": "1"},
        ) from None
    if not sub.replayed:
        deps.metrics.jobs_accepted.inc()
    headers = {"Location": f"/v1/jobs/{sub.job.id}"}
    if sub.replayed:
        headers["Idempotent-Replayed"] = "true"
    accepted = models.PortalLinkAccepted(sub.job.id, sub.job.status, dispatch_model(sub.outbox))
    return json_response(accepted, 202, headers)


def _too_many(exc: QuotaExceeded) -> ApiError:
    return ApiError(TOO_MANY_ACTIVE_JOBS, str(exc), headers={"Retry-After": str(exc.retry_after_s)})


def visible_job(request: web.Request, job: JobRecord | None) -> JobRecord:
    """The job, when the caller owns it or is an admin; NOT_FOUND otherwise."""
    p = principal_of(request)
    # Another user's job answers exactly like a missing one: existence is not leaked.
    if job is None or (job.user_id != p.user and not p.is_admin):
        raise ApiError(NOT_FOUND, "no such job")
    return job


async def get_job(request: web.Request) -> web.Response:
    deps = deps_of(request)
    found = await deps.jobs.get(inputs.path_id(request, "job_id"))
    job = visible_job(request, found[0] if found else None)
    return json_response(job_model(job))
