"""The route table: every endpoint defined once.

Each `Route` names its method, path, handler, who may call it, its request body, its
success responses and the problems it may answer. `http/app.py` builds the aiohttp
router and the edge's access checks from this table, and `http/openapi.py` builds the
document's paths from it, so the two cannot disagree.
"""

from __future__ import annotations

from typing import Final

from outboxd.http import (
    admin,
    bulk_models,
    console_models,
    jobs,
    login_models,
    logins,
    models,
    ops,
    websites,
)
from outboxd.http.console_routes import CONSOLE_ROUTES
from outboxd.http.endpoints import Link, Ok, Route
from outboxd.http.inputs import ERROR_CODE_PATTERN
from outboxd.http.oversight_routes import OVERSIGHT_ROUTES
from outboxd.http.params import (
    CURSOR,
    DOMAIN,
    JOB_ID,
    LIMIT,
    path_param,
    query_param,
    status_param,
)
from outboxd.http.problems import (
    ENQUEUE_FAILED,
    FORBIDDEN,
    IDEMPOTENCY_KEY_CONFLICT,
    IDEMPOTENCY_KEY_REQUIRED,
    INVALID_STATE,
    NOT_FOUND,
    PAYLOAD_TOO_LARGE,
    STORAGE_UNAVAILABLE,
    TOO_MANY_ACTIVE_JOBS,
    UNSUPPORTED_MEDIA_TYPE,
    VALIDATION_FAILED,
)
from outboxd.storage.ports import JOB_STATUSES, RELAY_STATUSES, WORK_STATUSES

# ------------------------------------------------------------------ parameters

_JOB_ID_PATTERN: Final = models.JOB_ID_PATTERN
_NO_CONTROL_CHARS: Final = f"^[^{models.NO_CONTROLS}]*$"


_JOB_LINKS: Final = (
    Link("GetJob", "getJob", "job_id", "/jobId"),
    Link("GetJobEvents", "getJobEvents", "job_id", "/jobId"),
    Link("CancelJob", "cancelJob", "job_id", "/jobId"),
    Link("RedriveJob", "redriveJob", "job_id", "/jobId"),
)
_WEBSITE_LINKS: Final = (Link("GetWebsite", "getWebsite", "domain", "/domain"),)
_BODY_ERRORS: Final = (VALIDATION_FAILED, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE)

_NOT_MODIFIED: Final = Ok(
    304,
    "Not Modified: If-None-Match names the current ETag (at once, or after a wait of Prefer's "
    "N seconds in which it did not change).",
    media="",
    headers=("ETag", "Preference-Applied"),
)
# How a view of many jobs (a listing, the stats) waits.
_VIEW_WAIT: Final = (
    "With `Prefer: wait=N` (clamped to api.max_wait_s) and `If-None-Match` naming the current "
    "ETag, the request is held until a change of any job alters the answer (200, the new "
    "ETag; read at most once a second while jobs keep changing) or N seconds pass (304); "
    "an ETag that is not the current one, or no If-None-Match, answers at once. Held "
    "requests count toward api.max_waiters and api.max_waiters_per_user with those on "
    "jobs, and are answered at once when the daemon stops."
)

# ------------------------------------------------------------------ the API

_API: Final[tuple[Route, ...]] = (
    Route(
        "POST",
        "/v1/portal-link-jobs",
        jobs.post_portal_link_job,
        "createPortalLinkJob",
        "jobs",
        "Start a portal link job (idempotent per user and Idempotency-Key).",
        ok=(
            Ok(
                202,
                "Accepted: stored, and normally already on the queue.",
                models.PortalLinkAccepted,
                headers=("Location", "Idempotent-Replayed"),
                links=_JOB_LINKS,
            ),
        ),
        errors=(
            *_BODY_ERRORS,
            IDEMPOTENCY_KEY_REQUIRED,
            IDEMPOTENCY_KEY_CONFLICT,
            TOO_MANY_ACTIVE_JOBS,
            ENQUEUE_FAILED,
            STORAGE_UNAVAILABLE,
        ),
        request=models.PortalLinkRequest,
        headers=("Idempotency-Key", "traceparent"),
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}",
        jobs.get_job,
        "getJob",
        "jobs",
        "A job's state, progress and result (owner or admin); wait for a change with Prefer.",
        ok=(
            Ok(
                200,
                "The job (at once, or when the wait ended: it changed, it finished, the time "
                "ran out or the daemon is stopping).",
                models.Job,
                headers=("ETag", "Preference-Applied"),
            ),
            Ok(
                304,
                "Not Modified: If-None-Match names the current ETag (at once, or after a wait "
                "of Prefer's N seconds in which the job did not change).",
                media="",
                headers=("ETag", "Preference-Applied"),
            ),
        ),
        errors=(NOT_FOUND, STORAGE_UNAVAILABLE),
        params=(JOB_ID,),
        headers=("Prefer", "If-None-Match"),
        description="Every answer carries the body's ETag. With `Prefer: wait=N` (RFC 7240; N "
        "clamped to the server's api.max_wait_s, 60 by default) and `If-None-Match`, the "
        "request is held until the job's body changes (200, the new ETag) or N seconds pass "
        "(304); without If-None-Match, until the job is finished (SUCCEEDED, FAILED, DEAD or "
        "CANCELLED) or N seconds pass (200). An If-None-Match that is not the current ETag "
        "answers 200 at once. `Preference-Applied: wait=N` says a wait was applied; a server "
        "holding its api.max_waiters requests already, or the caller's "
        "api.max_waiters_per_user, answers at once without it (and closes the connection). "
        "A held request is answered at once when the daemon stops.",
    ),
    Route(
        "GET",
        "/v1/jobs/{job_id}/events",
        jobs.get_job_events,
        "getJobEvents",
        "jobs",
        "A job's timeline, oldest first (owner or admin).",
        ok=(Ok(200, "The job's events.", models.JobTimeline),),
        errors=(NOT_FOUND, VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        params=(
            JOB_ID,
            query_param(
                "after",
                "Only events after this seq (the last one seen); at most 1000 per answer.",
                {"type": "integer", "minimum": 0, "maximum": 999_999_999_999_999_999},
            ),
        ),
        description="Each event commits in the same transaction as the change of the job it "
        "records: the last event's status is the job's status.",
    ),
    Route(
        "POST",
        "/v1/jobs/{job_id}/cancel",
        jobs.cancel_job,
        "cancelJob",
        "jobs",
        "Cancel a job (owner or admin).",
        ok=(
            Ok(
                202,
                "The job after the cancel: CANCELLED (it was QUEUED, or waiting on the queue), "
                "or RUNNING with cancelRequested (its worker stops before its next portal "
                "request); a CANCELLED job answers this again.",
                models.Job,
                headers=("Location",),
                links=(Link("GetJob", "getJob", "job_id", "/jobId"),),
            ),
        ),
        errors=(FORBIDDEN, NOT_FOUND, INVALID_STATE, STORAGE_UNAVAILABLE),
        params=(JOB_ID,),
        description="A CANCELLED job's credentials are erased at once and its outbox row is "
        "never published; a SUCCEEDED, FAILED or DEAD job cannot be cancelled "
        f"({INVALID_STATE.status} {INVALID_STATE.code}).",
    ),
    Route(
        "POST",
        "/v1/websites",
        websites.post_website,
        "registerWebsite",
        "websites",
        "Register a website for classification (upsert by domain).",
        ok=(
            Ok(200, "Already registered.", models.Website, links=_WEBSITE_LINKS),
            Ok(201, "Registered; classification queued.", models.Website, links=_WEBSITE_LINKS),
        ),
        errors=(*_BODY_ERRORS, TOO_MANY_ACTIVE_JOBS, STORAGE_UNAVAILABLE),
        request=models.WebsiteRequest,
    ),
    Route(
        "GET",
        "/v1/websites/{domain}",
        websites.get_website,
        "getWebsite",
        "websites",
        "A website and its category.",
        ok=(Ok(200, "The website.", models.Website),),
        errors=(NOT_FOUND, STORAGE_UNAVAILABLE),
        params=(DOMAIN,),
    ),
)

_ADMIN: Final[tuple[Route, ...]] = (
    Route(
        "GET",
        "/v1/admin/outbox",
        admin.list_outbox,
        "listOutbox",
        "admin",
        "Relay outbox rows, newest first (keyset pagination).",
        ok=(Ok(200, "A page of rows.", models.OutboxPage),),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
        params=(status_param(RELAY_STATUSES, "Only rows in this state."), LIMIT, CURSOR),
    ),
    Route(
        "POST",
        "/v1/admin/outbox/{outbox_id}/redrive",
        admin.redrive_outbox,
        "redriveOutbox",
        "admin",
        "A DEAD row back to PENDING (attempts reset), its job to QUEUED.",
        ok=(Ok(200, "The row after the redrive.", models.OutboxItem),),
        errors=(NOT_FOUND, INVALID_STATE, STORAGE_UNAVAILABLE),
        access="operator",
        params=(path_param("outbox_id", "The relay outbox row id."),),
    ),
    Route(
        "POST",
        "/v1/admin/jobs/{job_id}/redrive",
        admin.redrive_job,
        "redriveJob",
        "admin",
        "A DEAD job back to QUEUED with a fresh PENDING outbox row.",
        ok=(
            Ok(
                202,
                "The job after the redrive.",
                models.Job,
                headers=("Location",),
                links=(Link("GetJob", "getJob", "job_id", "/jobId"),),
            ),
        ),
        errors=(NOT_FOUND, INVALID_STATE, STORAGE_UNAVAILABLE),
        access="operator",
        params=(JOB_ID,),
    ),
    Route(
        "POST",
        "/v1/admin/jobs/redrive",
        admin.redrive_jobs,
        "redriveJobs",
        "admin",
        "Redrive in bulk: every DEAD job (up to a limit), or those of them named, a hundred "
        "per transaction.",
        ok=(
            Ok(
                200,
                "What was redriven and what was refused.",
                "JobRedriveAnswer",
            ),
        ),
        errors=(*_BODY_ERRORS, STORAGE_UNAVAILABLE),
        access="operator",
        request=bulk_models.JobRedriveRequest,
    ),
    Route(
        "GET",
        "/v1/admin/stats",
        admin.stats,
        "getStats",
        "admin",
        "Counts per table and status, oldest pending ages, SQS depth; wait for a job's "
        "change with Prefer.",
        ok=(
            Ok(200, "The numbers.", console_models.Stats, headers=("ETag", "Preference-Applied")),
            _NOT_MODIFIED,
        ),
        errors=(STORAGE_UNAVAILABLE,),
        access="viewer",
        headers=("Prefer", "If-None-Match"),
        description="Every answer carries a weak ETag over the counts, the queue depths and "
        "the pace (not the ages or the pace's countdowns, which move with the clock). "
        + _VIEW_WAIT
        + " A change of the other tables or of SQS alone does not end the wait; it shows at "
        "the next answer.",
    ),
    Route(
        "POST",
        "/v1/admin/tasks",
        admin.enqueue_task,
        "enqueueTask",
        "admin",
        "Enqueue a task through the task outbox.",
        ok=(Ok(202, "Enqueued.", models.TaskAccepted),),
        errors=(*_BODY_ERRORS, INVALID_STATE, STORAGE_UNAVAILABLE),
        access="admin",
        request=models.TaskRequest,
    ),
    Route(
        "GET",
        "/v1/admin/tasks",
        admin.list_tasks,
        "listTasks",
        "admin",
        "Task runs, newest first (keyset pagination).",
        ok=(Ok(200, "A page of task runs.", models.TaskPage),),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
        params=(
            query_param(
                "type",
                "Only tasks of this type.",
                {"type": "string", "maxLength": 100, "pattern": _NO_CONTROL_CHARS},
            ),
            LIMIT,
            CURSOR,
        ),
    ),
    Route(
        "GET",
        "/v1/admin/jobs",
        admin.list_jobs,
        "listJobs",
        "admin",
        "Jobs, newest first (keyset pagination), any user's; filtered by each parameter "
        "given; wait for a change with Prefer.",
        ok=(
            Ok(200, "A page of jobs.", models.JobPage, headers=("ETag", "Preference-Applied")),
            _NOT_MODIFIED,
        ),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
        headers=("Prefer", "If-None-Match"),
        description="Every answer carries the page's ETag. " + _VIEW_WAIT,
        params=(
            status_param(JOB_STATUSES, "Only jobs in this state."),
            query_param(
                "user",
                "Only this user's jobs.",
                {"type": "string", "minLength": 1, "maxLength": 128, "pattern": _NO_CONTROL_CHARS},
            ),
            query_param(
                "username",
                "Only the jobs for this portal username (a student number), spelt exactly as "
                "intake takes it (an invalid one is 400 VALIDATION_FAILED). The server finds "
                "the jobs by its keyed hash, the subject of the login lock listing; the username "
                "is never stored, logged or echoed. An equality, no prefix search; jobs "
                "accepted before this search existed (migration 0010) carry no hash and are "
                "not found.",
                {
                    "type": "string",
                    "minLength": 1,
                    "maxLength": 64,
                    "pattern": models.USERNAME_TEXT,
                },
            ),
            query_param(
                "errorCode",
                "Only jobs whose error has this code (e.g. RETRIES_EXHAUSTED).",
                {"type": "string", "pattern": ERROR_CODE_PATTERN},
            ),
            query_param(
                "from",
                "Only jobs created at or after this time (RFC 3339).",
                {"type": "string", "format": "date-time"},
            ),
            query_param(
                "to",
                "Only jobs created before this time (RFC 3339).",
                {"type": "string", "format": "date-time"},
            ),
            LIMIT,
            CURSOR,
        ),
    ),
    Route(
        "GET",
        "/v1/admin/portal-logins",
        logins.list_portal_logins,
        "listPortalLogins",
        "admin",
        "Portal usernames with failed logins (by keyed hash): who caused them, and their locks.",
        ok=(Ok(200, "The usernames, most recently failed first.", login_models.PortalLoginPage),),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
        params=(
            query_param(
                "locked",
                "true: only usernames locked for some user or throttled; false: only the others.",
                {"type": "string", "enum": ["true", "false"]},
            ),
            LIMIT,
        ),
    ),
    Route(
        "POST",
        "/v1/admin/portal-logins/unlock",
        logins.unlock_portal_login,
        "unlockPortalLogin",
        "admin",
        "Forget one portal username's failed logins and throttle (logged with the acting user).",
        ok=(Ok(200, "What was cleared.", login_models.PortalLoginUnlocked),),
        errors=(*_BODY_ERRORS, STORAGE_UNAVAILABLE),
        access="operator",
        request=login_models.PortalLoginUnlockRequest,
    ),
    Route(
        "GET",
        "/v1/admin/jobs/{job_id}",
        admin.get_job_detail,
        "getJobDetail",
        "admin",
        "Any user's job with its relay outbox rows.",
        ok=(Ok(200, "The job.", console_models.JobDetail),),
        errors=(NOT_FOUND, STORAGE_UNAVAILABLE),
        access="viewer",
        params=(JOB_ID,),
    ),
    Route(
        "GET",
        "/v1/admin/websites",
        admin.list_websites,
        "listWebsites",
        "admin",
        "Websites by classification state, newest first (keyset pagination).",
        ok=(Ok(200, "A page of websites.", models.WebsitePage),),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
        params=(
            status_param(WORK_STATUSES, "Only websites whose classification is in this state."),
            LIMIT,
            CURSOR,
        ),
    ),
    Route(
        "POST",
        "/v1/admin/websites/{domain}/retry",
        admin.retry_website,
        "retryWebsite",
        "admin",
        "A FAILED classification back to PENDING, its attempts reset.",
        ok=(Ok(200, "The website after the retry.", models.Website),),
        errors=(NOT_FOUND, INVALID_STATE, STORAGE_UNAVAILABLE),
        access="operator",
        params=(DOMAIN,),
    ),
    Route(
        "GET",
        "/v1/admin/runtime",
        admin.runtime,
        "getRuntime",
        "admin",
        "Readiness, claimer pace, schedules and per-minute throughput of this process.",
        ok=(Ok(200, "This process's state.", console_models.Runtime),),
        errors=(STORAGE_UNAVAILABLE,),
        access="viewer",
    ),
)

_OPERATIONS: Final[tuple[Route, ...]] = (
    Route(
        "GET",
        "/healthz",
        ops.healthz,
        "healthz",
        "operations",
        "Liveness: 200 while the event loop answers.",
        ok=(Ok(200, "Alive.", models.Health),),
        access="public",
    ),
    Route(
        "GET",
        "/readyz",
        ops.readyz,
        "readyz",
        "operations",
        "Readiness: the database and SQS answer.",
        ok=(
            Ok(200, "Ready.", models.Readiness),
            Ok(503, "Not ready; checks say which failed.", models.Readiness),
        ),
        access="public",
    ),
    Route(
        "GET",
        "/metrics",
        ops.metrics,
        "metrics",
        "operations",
        "Prometheus metrics (text exposition format).",
        ok=(Ok(200, "The metrics; stale gauges are marked, never an error.", media="text/plain"),),
        access="public",
    ),
    Route(
        "GET",
        "/openapi.json",
        ops.openapi,
        "openapi",
        "operations",
        "This document.",
        ok=(Ok(200, "The OpenAPI 3.1 document.", models.OpenApiDocument),),
        access="public",
    ),
)


ROUTES: Final[tuple[Route, ...]] = (
    *_API,
    *_ADMIN,
    *OVERSIGHT_ROUTES,
    *_OPERATIONS,
    *CONSOLE_ROUTES,
)
