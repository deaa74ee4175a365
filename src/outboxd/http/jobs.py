"""Portal link jobs: intake (idempotent per user and key), a job's state (with an ETag, and
held until it changes on `Prefer: wait`), its timeline and its cancel; owner or admin."""

from __future__ import annotations

from typing import cast

import structlog
from aiohttp import web

from outboxd.errors import InvalidState, NotFound, QuotaExceeded
from outboxd.http import checks, inputs, models
from outboxd.http.conditional import Encoded, digest, matches, tagged
from outboxd.http.deps import AUDITED, deps_of, principal_of
from outboxd.http.problems import (
    ENQUEUE_FAILED,
    FORBIDDEN,
    IDEMPOTENCY_KEY_CONFLICT,
    IDEMPOTENCY_KEY_REQUIRED,
    INVALID_STATE,
    NOT_FOUND,
    TOO_MANY_ACTIVE_JOBS,
    ApiError,
)
from outboxd.http.render import dispatch_model, event_model, job_model
from outboxd.http.responses import json_response
from outboxd.http.server import request_arrived
from outboxd.security import Principal
from outboxd.services.portal_jobs import DispatchFailed, IdempotencyConflict, LinkCredentials
from outboxd.storage.ports import JobRecord
from outboxd.tracing import trace_id_of

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
    username = checks.portal_username(fields["username"])
    link = LinkCredentials(cast(str, fields["portal"]), username, cast(str, fields["password"]))
    # The caller's trace goes on (an invalid traceparent is ignored): this request is a span
    # of it, and the job carries this span's context to the worker.
    parent = inputs.traceparent(request)
    with deps.tracing.span("POST /v1/portal-link-jobs", parent, "server") as tp:
        return await _submit(request, user, key, link, tp)


async def _submit(
    request: web.Request, user: str, key: str, link: LinkCredentials, traceparent: str
) -> web.Response:
    deps = deps_of(request)
    try:
        sub = await deps.jobs.submit(user, key, link, traceparent)
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
    """The job, when the caller owns it or is a viewer or above; NOT_FOUND otherwise."""
    p = principal_of(request)
    # Another user's job answers exactly like a missing one: existence is not leaked.
    if job is None or (job.user_id != p.user and not p.can("viewer")):
        raise ApiError(NOT_FOUND, "no such job")
    return job


def _finished(job: JobRecord | None) -> bool:
    return job is None or job.terminal


class _Changed:
    """Whether the job's body as `reader` sees it is no longer the one tagged `etag`."""

    __slots__ = ("etag", "reader")

    def __init__(self, reader: Principal, etag: str) -> None:
        self.reader = reader
        self.etag = etag

    def __call__(self, job: JobRecord | None) -> bool:
        return job is None or _encoded(job, self.reader)[1] != self.etag


def _encoded(job: JobRecord, reader: Principal) -> Encoded:
    """The job's body as `reader` sees it, and its entity tag: a digest of exactly those
    bytes, so it changes whenever the body does. The last one is kept: a change that
    answers thousands of held requests compares and sends one body (the held requests
    share the record they were woken with), encoded once."""
    global _last_encoded
    last = _last_encoded
    if last is not None and last[0] is job and last[1] == reader:
        return last[2]
    body = models.encode(job_model(job, reader))
    encoded = body, digest(body)
    _last_encoded = (job, reader, encoded)
    return encoded


# (record, reader, encoded) of the last `_encoded`; the body depends on nothing else.
_last_encoded: tuple[JobRecord, Principal, Encoded] | None = None


async def get_job(request: web.Request) -> web.Response:
    """The job. `If-None-Match` with its current ETag: 304. `Prefer: wait=N` (clamped to
    api.max_wait_s): held, holding no database connection, until the job's body changes
    (with If-None-Match) or it finishes (without), or N seconds pass, or the daemon stops."""
    deps = deps_of(request)
    reader = principal_of(request)
    job_id = inputs.path_id(request, "job_id")
    tags = inputs.if_none_match(request)
    wait_s = inputs.prefer_wait(request, deps.settings.api.max_wait_s)
    if wait_s is None or deps.waits is None:
        job = visible_job(request, await deps.store.get_job(job_id))
        body, etag = _encoded(job, reader)
        return tagged(body, etag, 304 if matches(tags, etag) else 200)
    # The hold is taken before the read: a change committed after the read still wakes it.
    # (Entered and released by hand, not `async with`: no `__aexit__` kept across the wait.)
    hold = deps.waits.hold(job_id, principal_of(request).user)
    held = hold.enter()
    try:
        # Held: the read this hold shares with every request on the job entering with it.
        found = await (hold.current() if held else deps.store.get_job(job_id))
        job = visible_job(request, found)
        body, etag = _encoded(job, reader)
        if not held:  # api.max_waiters (or the user's share) held, or stopping: no wait
            return tagged(body, etag, 304 if matches(tags, etag) else 200, refused=True)
        if tags is None and job.terminal:
            return tagged(body, etag, applied=wait_s)
        if tags is not None and not matches(tags, etag):  # stale: not seen by the client
            return tagged(body, etag, applied=wait_s)
        # Held from here: thousands may be, so each keeps only its tag, not the job, its
        # body or the tags it was sent (docs/decisions/0038-held-waits-cost-little.md), and
        # its connection no read deadline (the request has arrived whole).
        matching = tags is not None
        del found, job, body, tags
        request_arrived(request)
        ending = await hold.wait(_Changed(reader, etag) if matching else _finished, wait_s)
        now = await hold.value(ending)
    finally:
        hold.release()
    if now is None:
        raise ApiError(NOT_FOUND, "no such job")  # pruned while it was waited on
    new_body, new_etag = _encoded(now, reader)
    if matching and new_etag == etag and ending != "stopped":
        return tagged(new_body, new_etag, 304, applied=wait_s)
    return tagged(new_body, new_etag, applied=wait_s)


async def get_job_events(request: web.Request) -> web.Response:
    """The job's timeline, oldest first: up to 1000 events after `after`."""
    deps = deps_of(request)
    job = visible_job(request, await deps.store.get_job(inputs.path_id(request, "job_id")))
    events = await deps.store.job_events(job.id, inputs.query_after(request), 1000)
    return json_response(models.JobTimeline(job.id, [event_model(e) for e in events]))


async def cancel_job(request: web.Request) -> web.Response:
    """Cancel: at once when nobody runs the job, else the worker stops at its next portal
    request. 202 with the job; again 202 for a cancelled one; 409 once it finished."""
    deps = deps_of(request)
    p = principal_of(request)
    found = await deps.store.get_job(inputs.path_id(request, "job_id"))
    if found is not None and found.user_id != p.user:
        # Someone else's job: an operator's action, on the audit log whatever its outcome
        # (a caller who may not see the job is answered as if it did not exist).
        request[AUDITED] = True
    job = visible_job(request, found)
    if job.user_id != p.user and not p.can("operator"):
        raise ApiError(FORBIDDEN, "cancelling another user's job needs the operator role")
    by = "owner" if job.user_id == p.user else "admin"
    try:
        job, outcome = await deps.jobs.cancel(job.id, by)
    except NotFound:
        raise ApiError(NOT_FOUND, "no such job") from None
    except InvalidState as exc:
        raise ApiError(INVALID_STATE, str(exc)) from None
    log.info(
        "job_cancel",
        job_id=job.id,
        outcome=outcome,
        by_user=p.user,
        by_role=p.role,
        status=job.status,
        trace_id=trace_id_of(job.traceparent),
    )
    return json_response(job_model(job, p), 202, {"Location": f"/v1/jobs/{job.id}"})
