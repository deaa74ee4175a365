"""aiohttp routes: parse, authorise, call a service, render. No SQL, no business rules."""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, NoReturn, Protocol

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from outboxd.config import Settings
from outboxd.daemon import inputs
from outboxd.daemon.console import add_console_routes, is_console_path
from outboxd.daemon.inputs import InputError
from outboxd.daemon.openapi import openapi_document
from outboxd.errors import InvalidState, NotFound, StorageError, StorageUnavailable
from outboxd.observability import Metrics
from outboxd.security import Principal, TokenVerifier
from outboxd.services.admin import AdminService
from outboxd.services.portal_jobs import (
    PORTALS,
    DispatchFailed,
    IdempotencyConflict,
    PortalJobService,
    PortalLinkRequest,
)
from outboxd.services.tasks import BUILTIN_TASKS, TaskService
from outboxd.services.websites import InvalidDomain, WebsiteService, normalize_domain
from outboxd.storage.ports import (
    JOB_STATUSES,
    RELAY_STATUSES,
    RELAY_UNSENT_STATUSES,
    WORK_STATUSES,
    JobRecord,
    JobStore,
    RelayRow,
    RelayStore,
    StatsStore,
    TaskRun,
    TaskStore,
    Website,
)

log = structlog.get_logger(__name__)

PUBLIC_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/openapi.json"})
PROBLEM_TYPE = "urn:outboxd:problem:"
_REQUEST_ID_RE = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")
_KEY_RE = re.compile(r"^[\x21-\x7e]{1,255}$")
# What SQS accepts as a MessageDeduplicationId: a task whose id holds anything
# else could never be sent to AWS.
_DEDUP_RE = re.compile(r"^[A-Za-z0-9!\"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~]{1,128}$")
SERVER_HEADER = "outboxd"
_CODES: dict[str, tuple[str, str]] = {
    "C01": ("VALIDATION_FAILED", "The request is not valid"),
    "C02": ("UNAUTHENTICATED", "Authentication is required"),
    "C03": ("FORBIDDEN", "Not allowed"),
    "C04": ("NOT_FOUND", "Not found"),
    "C05": ("PAYLOAD_TOO_LARGE", "The request body is too large"),
    "C06": ("IDEMPOTENCY_KEY_REQUIRED", "An Idempotency-Key header is required"),
    "C07": ("IDEMPOTENCY_KEY_CONFLICT", "The Idempotency-Key was used for another request"),
    "C08": ("ENQUEUE_FAILED", "The job could not be put on the queue"),
    "C09": ("STORAGE_UNAVAILABLE", "The database is unavailable"),
    "C10": ("METHOD_NOT_ALLOWED", "Method not allowed"),
    "C11": ("INVALID_STATE", "The operation does not apply in the current state"),
    "C99": ("INTERNAL_ERROR", "Internal error"),
}


class Readiness(Protocol):
    async def check(self) -> dict[str, str]:
        """Component name -> "ok" or a short reason."""
        ...


class ApiStore(JobStore, RelayStore, TaskStore, StatsStore, Protocol):
    pass


class RuntimeView(Protocol):
    """This process's in-memory state for the console (see daemon/console.py)."""

    def claimer_pace(self) -> tuple[float | None, float | None, float | None] | None: ...
    def schedules(self) -> list[tuple[str, str, float]]: ...
    def throughput_series(self) -> list[tuple[float, int, int]]: ...


@dataclass(frozen=True)
class ApiDeps:
    settings: Settings
    store: ApiStore
    jobs: PortalJobService
    websites: WebsiteService
    tasks: TaskService
    admin: AdminService
    tokens: TokenVerifier
    metrics: Metrics
    readiness: Readiness
    runtime: RuntimeView | None = None


DEPS = web.AppKey("deps", ApiDeps)
REQUEST_ID = web.RequestKey("request_id", str)
PRINCIPAL = web.RequestKey("principal", Principal)


class ClientDisconnected(Exception):
    """The client hung up before its request arrived whole: its mistake, not ours."""


class ApiError(Exception):
    def __init__(
        self,
        status: int,
        code: str,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.status = status
        self.code = code
        self.detail = detail
        self.errors = errors
        self.headers = dict(headers or {})


def _fail(field: str, message: str, status: int = 400) -> NoReturn:
    raise ApiError(status, "C01", f"{field}: {message}", [{"field": field, "message": message}])


def problem(request: web.Request, err: ApiError) -> web.Response:
    name, title = _CODES[err.code]
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + name,
        "title": title,
        "status": err.status,
        "detail": err.detail,
        "code": err.code,
        "requestId": request.get(REQUEST_ID),
    }
    if err.errors is not None:
        body["errors"] = err.errors
    return web.json_response(
        body, status=err.status, content_type="application/problem+json", headers=err.headers
    )


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def principal_of(request: web.Request) -> Principal:
    return request[PRINCIPAL]


def _route_name(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info.http_exception is None else None
    return resource.canonical if resource is not None else "unmatched"


@web.middleware
async def edge_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Request id, structured access log, metrics, and every error as problem+json."""
    deps = request.app[DEPS]
    incoming = request.headers.get("X-Request-Id", "")
    request_id = incoming if _REQUEST_ID_RE.match(incoming) else uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    route = _route_name(request)
    try:
        response = await _guarded(request, handler, deps)
    finally:
        structlog.contextvars.unbind_contextvars("request_id")
    response.headers["X-Request-Id"] = request_id
    elapsed = time.perf_counter() - started
    deps.metrics.http_requests.labels(route, str(response.status)).inc()
    deps.metrics.http_latency.labels(route).observe(elapsed)
    if route not in ("/healthz", "/metrics"):
        log.info(
            "http_request",
            request_id=request_id,
            method=request.method,
            route=route,
            status=response.status,
            duration_ms=round(elapsed * 1000, 2),
        )
    return response


async def _guarded(
    request: web.Request,
    handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    deps: ApiDeps,
) -> web.StreamResponse:
    try:
        http_exc = request.match_info.http_exception
        if request.method == "CONNECT":
            raise ApiError(405, "C10", "CONNECT is not allowed", headers={"Allow": "GET, POST"})
        if isinstance(http_exc, web.HTTPMethodNotAllowed):
            allow = ", ".join(sorted(http_exc.allowed_methods))
            raise ApiError(
                405, "C10", f"{request.method} is not allowed here", headers={"Allow": allow}
            )
        if http_exc is not None:
            raise ApiError(404, "C04", "no such resource")
        if request.path not in PUBLIC_PATHS and not is_console_path(request.path):
            request[PRINCIPAL] = _authenticate(request, deps.tokens)
        return await handler(request)
    except ApiError as err:
        return problem(request, err)
    except inputs.NoSuchId:
        return problem(request, ApiError(404, "C04", "no such resource"))
    except InputError as exc:
        return problem(
            request,
            ApiError(400, "C01", str(exc), [{"field": exc.field, "message": exc.message}]),
        )
    except ClientDisconnected:
        log.info("client_disconnected", method=request.method, route=_route_name(request))
        return problem(request, ApiError(400, "C01", "the request did not arrive whole"))
    except StorageUnavailable as exc:
        log.warning("storage_unavailable", error=exc)
        return problem(
            request,
            ApiError(
                503, "C09", "the database is unavailable; retry later", headers={"Retry-After": "1"}
            ),
        )
    except StorageError as exc:
        log.error("storage_error", error=exc)
        return problem(request, ApiError(500, "C99", "the database refused the operation"))
    except web.HTTPException as exc:
        if exc.status == 413:
            return problem(request, ApiError(413, "C05", "the request body is too large"))
        raise
    except Exception as exc:
        log.exception("unhandled_error", error=exc)
        return problem(request, ApiError(500, "C99", "internal error"))


def _authenticate(request: web.Request, tokens: TokenVerifier) -> Principal:
    if not tokens.enabled:
        # No tokens configured: config validation guarantees a loopback bind.
        return Principal("local", "admin")
    header = inputs.single_header(request.headers, "Authorization") or ""
    scheme, _, token = header.partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="outboxd"'}
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(401, "C02", "a bearer token is required", headers=challenge)
    principal = tokens.verify(token.strip())
    if principal is None:
        raise ApiError(
            401,
            "C02",
            "the token is not valid",
            headers={"WWW-Authenticate": 'Bearer realm="outboxd", error="invalid_token"'},
        )
    return principal


def _require_admin(request: web.Request) -> Principal:
    p = principal_of(request)
    if not p.is_admin:
        raise ApiError(403, "C03", "this operation needs the admin role")
    return p


async def read_json_object(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, within `max_bytes`; C01/C05 otherwise."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(
            415,
            "C01",
            "Content-Type must be application/json",
            [{"field": "Content-Type", "message": "must be application/json"}],
        )
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(413, "C05", f"the body is over {max_bytes} bytes")
    body = bytearray()
    try:
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > max_bytes:
                raise ApiError(413, "C05", f"the body is over {max_bytes} bytes")
    except (HttpProcessingError, web.RequestPayloadError):
        # A broken chunked framing or gzip/deflate stream, found while reading.
        _fail("body", "is not a valid chunked, gzip or deflate stream")
    except ConnectionError:
        raise ClientDisconnected() from None
    return inputs.decode_json_object(bytes(body))


def _check_fields(body: Mapping[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise ApiError(
            400,
            "C01",
            "unknown fields: " + ", ".join(k[:40] for k in unknown[:10]),
            [{"field": k[:64], "message": "unknown field"} for k in unknown[:20]],
        )


def _string(
    body: Mapping[str, Any], field: str, max_len: int, *, nullable: bool = False
) -> str | None:
    if field not in body:
        if nullable:
            return None
        _fail(field, "is required")
    value = body[field]
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        _fail(field, "must be a string")
    if not value.strip():
        _fail(field, "must not be empty")
    if len(value) > max_len:
        _fail(field, f"must be at most {max_len} characters")
    why = inputs.bad_char(value)
    if why is not None:
        _fail(field, why)
    return value


# ------------------------------------------------------------------ renderers


def job_body(job: JobRecord) -> dict[str, Any]:
    error = (
        {"code": job.error_code, "message": job.error_message or ""}
        if job.error_code is not None and job.status != "SUCCEEDED"
        else None
    )
    progress = dict(job.progress) if job.progress is not None else None
    return {
        "jobId": job.id,
        "kind": job.kind,
        "portal": job.portal,
        "status": job.status,
        "attempts": job.attempts,
        "createdAt": iso(job.created_at),
        "updatedAt": iso(job.updated_at),
        "finishedAt": iso(job.finished_at),
        "progress": progress,
        "error": error,
        "result": dict(job.result) if job.result is not None else None,
    }


def dispatch_body(outbox: RelayRow | None) -> dict[str, Any] | None:
    if outbox is None:
        return None
    return {"outboxId": outbox.id, "status": outbox.status, "messageId": outbox.queue_message_id}


def relay_item(row: RelayRow) -> dict[str, Any]:
    item: dict[str, Any] = {"id": row.id, "kind": row.kind}
    if row.kind == "job":
        item["jobId"] = row.job_id
    else:
        item["taskId"] = row.task_id
    item.update(
        status=row.status,
        attempts=row.attempt_count,
        nextAttemptAt=iso(row.next_attempt_at) if row.status in RELAY_UNSENT_STATUSES else None,
        lastError=row.last_error,
        messageId=row.queue_message_id,
        createdAt=iso(row.created_at),
    )
    return item


def task_item(run: TaskRun) -> dict[str, Any]:
    return {
        "taskId": run.id,
        "type": run.type,
        "dedupId": run.dedup_id,
        "status": run.status,
        "enqueuedAt": iso(run.enqueued_at),
        "finishedAt": iso(run.finished_at),
        "error": run.error,
    }


def website_body(w: Website) -> dict[str, Any]:
    return {
        "id": w.id,
        "domain": w.domain,
        "faviconUrl": w.favicon_url,
        "category": w.category,
        "classification": {
            "status": w.work_status,
            "attempts": w.work_attempts,
            "lastError": w.work_last_error,
        },
    }


# ------------------------------------------------------------------ handlers


async def post_portal_link_job(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    user = principal_of(request).user
    key = request.headers.get("Idempotency-Key")
    if key is None or not _KEY_RE.match(key):
        raise ApiError(
            400,
            "C06",
            "Idempotency-Key must be 1-255 visible ASCII characters",
            [{"field": "Idempotency-Key", "message": "missing, empty, too long or not ASCII"}],
        )
    body = await read_json_object(request, deps.settings.server.max_body_bytes)
    _check_fields(body, {"portal", "username", "password"})
    portal = _string(body, "portal", 32)
    if portal not in PORTALS:
        _fail("portal", "must be one of: " + ", ".join(PORTALS))
    username = _string(body, "username", 64)
    password = _string(body, "password", 256)
    assert username is not None and password is not None
    try:
        sub = await deps.jobs.submit(user, key, PortalLinkRequest(portal, username, password))
    except IdempotencyConflict:
        raise ApiError(
            409, "C07", "this Idempotency-Key was already used with a different request"
        ) from None
    except DispatchFailed as exc:
        log.warning("dispatch_required_failed", job_id=exc.job.id)
        raise ApiError(
            503,
            "C08",
            f"job {exc.job.id} was stored but could not be queued; retry with the "
            "same Idempotency-Key",
            headers={"Retry-After": "1"},
        ) from None
    if not sub.replayed:
        deps.metrics.jobs_accepted.inc()
    headers = {"Location": f"/v1/jobs/{sub.job.id}"}
    if sub.replayed:
        headers["Idempotent-Replayed"] = "true"
    return web.json_response(
        {"jobId": sub.job.id, "status": sub.job.status, "dispatch": dispatch_body(sub.outbox)},
        status=202,
        headers=headers,
    )


def _visible_job(request: web.Request, job: JobRecord | None) -> JobRecord:
    p = principal_of(request)
    # Another user's job answers exactly like a missing one: existence is not leaked.
    if job is None or (job.user_id != p.user and not p.is_admin):
        raise ApiError(404, "C04", "no such job")
    return job


async def get_job(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    found = await deps.jobs.get(inputs.path_id(request, "job_id"))
    job = _visible_job(request, found[0] if found else None)
    return web.json_response(job_body(job))


async def post_website(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    body = await read_json_object(request, deps.settings.server.max_body_bytes)
    _check_fields(body, {"domain", "faviconUrl"})
    raw_domain = body.get("domain")
    if not isinstance(raw_domain, str):
        _fail("domain", "is required and must be a string")
    if len(raw_domain) > 300:
        _fail("domain", "is longer than 253 characters")
    try:
        domain = normalize_domain(inputs.check_text("domain", raw_domain, 300))
    except InvalidDomain as exc:
        _fail("domain", str(exc))
    except UnicodeError:
        _fail("domain", "is not a valid internationalised name")
    favicon = _string(body, "faviconUrl", 2048, nullable=True)
    if favicon is not None and not favicon.startswith(("http://", "https://")):
        _fail("faviconUrl", "must be an http(s) URL or null")
    website, created = await deps.websites.register(domain, favicon)
    return web.json_response(website_body(website), status=201 if created else 200)


async def get_website(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    try:
        domain = normalize_domain(inputs.path_id(request, "domain", 300))
    except (InvalidDomain, UnicodeError):
        raise ApiError(404, "C04", "no such website") from None
    website = await deps.websites.get(domain)
    if website is None:
        raise ApiError(404, "C04", "no such website")
    return web.json_response(website_body(website))


def _limit(request: web.Request) -> int:
    return inputs.query_limit(request)


def _only_query(request: web.Request, allowed: set[str]) -> None:
    """A misspelt filter (`?stauts=DEAD`) must not silently list everything."""
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        raise ApiError(
            400,
            "C01",
            "unknown query parameters: " + ", ".join(k[:40] for k in unknown[:10]),
            [{"field": k[:64], "message": "unknown query parameter"} for k in unknown[:20]],
        )


def _cursor(request: web.Request) -> str | None:
    return inputs.query_cursor(request)


async def admin_list_outbox(request: web.Request) -> web.Response:
    _require_admin(request)
    _only_query(request, {"status", "limit", "cursor"})
    deps = request.app[DEPS]
    status = inputs.query_text(request, "status", 32)
    if status is not None and status not in RELAY_STATUSES:
        _fail("status", "must be " + ", ".join(RELAY_STATUSES[:-1]) + " or " + RELAY_STATUSES[-1])
    page = await deps.store.list_relay_rows(status, _limit(request), _cursor(request))
    return web.json_response(
        {"items": [relay_item(r) for r in page.items], "nextCursor": page.next_cursor}
    )


async def admin_redrive_outbox(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    try:
        row = await deps.admin.redrive_outbox_row(inputs.path_id(request, "outbox_id"))
    except NotFound:
        raise ApiError(404, "C04", "no such outbox row") from None
    except InvalidState as exc:
        raise ApiError(409, "C11", str(exc)) from None
    log.info("outbox_redriven", outbox_id=row.id, job_id=row.job_id, task_id=row.task_id)
    return web.json_response(relay_item(row))


async def admin_redrive_job(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    try:
        job = await deps.admin.redrive_job(inputs.path_id(request, "job_id"))
    except NotFound:
        raise ApiError(404, "C04", "no such job") from None
    except InvalidState as exc:
        raise ApiError(409, "C11", str(exc)) from None
    log.info("job_redriven", job_id=job.id)
    return web.json_response(job_body(job), status=202, headers={"Location": f"/v1/jobs/{job.id}"})


# ------------------------------------------------------------------ admin: the console's reads


def _status_filter(request: web.Request, allowed: tuple[str, ...]) -> str | None:
    status = request.query.get("status")
    if status is not None and status not in allowed:
        _fail("status", "must be one of: " + ", ".join(allowed))
    return status


async def admin_list_jobs(request: web.Request) -> web.Response:
    _require_admin(request)
    _only_query(request, {"status", "limit", "cursor"})
    deps = request.app[DEPS]
    status = _status_filter(request, JOB_STATUSES)
    page = await deps.store.list_jobs(status, _limit(request), _cursor(request))
    return web.json_response(
        {"items": [job_body(j) for j in page.items], "nextCursor": page.next_cursor}
    )


async def admin_get_job(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    job = await deps.store.get_job(request.match_info["job_id"])
    if job is None:
        raise ApiError(404, "C04", "no such job")
    rows = await deps.store.relay_rows_for_job(job.id, 20)
    return web.json_response({**job_body(job), "outbox": [relay_item(r) for r in rows]})


async def admin_list_websites(request: web.Request) -> web.Response:
    _require_admin(request)
    _only_query(request, {"status", "limit", "cursor"})
    deps = request.app[DEPS]
    status = _status_filter(request, WORK_STATUSES)
    page = await deps.websites.list(status, _limit(request), _cursor(request))
    return web.json_response(
        {"items": [website_body(w) for w in page.items], "nextCursor": page.next_cursor}
    )


async def admin_retry_website(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    try:
        domain = normalize_domain(request.match_info["domain"])
        website = await deps.websites.retry(domain)
    except (InvalidDomain, NotFound):
        raise ApiError(404, "C04", "no such website") from None
    except InvalidState as exc:
        raise ApiError(409, "C11", str(exc)) from None
    return web.json_response(website_body(website))


async def admin_runtime(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    checks = await deps.readiness.check()
    rt = deps.runtime
    pace = rt.claimer_pace() if rt is not None else None
    return web.json_response(
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


async def admin_stats(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    return web.json_response(await deps.admin.stats())


async def admin_enqueue_task(request: web.Request) -> web.Response:
    _require_admin(request)
    deps = request.app[DEPS]
    body = await read_json_object(request, deps.settings.server.max_body_bytes)
    _check_fields(body, {"type", "payload", "dedupId"})
    type_ = _string(body, "type", 100)
    assert type_ is not None
    if type_ not in BUILTIN_TASKS:
        _fail("type", "must be one of: " + ", ".join(BUILTIN_TASKS))
    payload = body.get("payload", {})
    if not isinstance(payload, dict):
        _fail("payload", "must be a JSON object")
    _check_task_payload(payload)
    dedup = _string(body, "dedupId", 128, nullable=True)
    if dedup is not None and not _DEDUP_RE.match(dedup):
        _fail("dedupId", "must be 1-128 characters of letters, digits and ASCII punctuation")
    run, created = await deps.tasks.enqueue(type_, payload, dedup)
    if not created and run.type != type_:
        raise ApiError(409, "C11", "dedupId is already used by a task of another type")
    return web.json_response({"taskId": run.id}, status=202)


def _check_task_payload(payload: Mapping[str, Any]) -> None:
    """The one payload field a built-in task reads (outbox.prune's age); nothing else."""
    _check_fields(payload, {"older_than_days"})
    days = payload.get("older_than_days", 7)
    if (
        isinstance(days, bool)
        or not isinstance(days, int | float)
        or not math.isfinite(days)
        or not 0 <= days <= 36500
    ):
        _fail("payload.older_than_days", "must be a finite number 0-36500")


async def admin_list_tasks(request: web.Request) -> web.Response:
    _require_admin(request)
    _only_query(request, {"type", "limit", "cursor"})
    deps = request.app[DEPS]
    type_ = inputs.query_text(request, "type", 100) or None
    page = await deps.store.list_tasks(type_, _limit(request), _cursor(request))
    return web.json_response(
        {"items": [task_item(r) for r in page.items], "nextCursor": page.next_cursor}
    )


async def healthz(_request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    checks = await request.app[DEPS].readiness.check()
    ok = all(v == "ok" for v in checks.values())
    return web.json_response(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503
    )


async def metrics(request: web.Request) -> web.Response:
    deps = request.app[DEPS]
    await refresh_gauges(deps)
    body = generate_latest(deps.metrics.registry)
    resp = web.Response(body=body)
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


async def refresh_gauges(deps: ApiDeps) -> None:
    """Row and queue gauges are read at scrape time, so they equal the database's counts."""
    m = deps.metrics
    for check, verdict in (await deps.readiness.check()).items():
        m.ready.labels(check).set(1 if verdict == "ok" else 0)
    stats = await deps.admin.stats()
    m.rows.clear()
    for table, counts in stats["tables"].items():
        for status, n in counts.items():
            m.rows.labels(table, status).set(n)
    m.oldest_pending_age.clear()
    for table, age in stats["oldestPendingAgeSeconds"].items():
        m.oldest_pending_age.labels(table).set(age or 0.0)
    m.pace_last_slot.clear()
    m.pace_next_slot.clear()
    m.pace_paused_until.clear()
    m.pace_sessions.clear()
    for name, pace in stats["pace"].items():
        m.pace_last_slot.labels(name).set(pace["lastSlotAt"] or 0.0)
        m.pace_next_slot.labels(name).set(pace["nextSlotAt"] or 0.0)
        m.pace_paused_until.labels(name).set(pace["pausedUntil"] or 0.0)
        m.pace_sessions.labels(name).set(pace["sessions"])
    queues = stats.get("queues")
    if isinstance(queues, dict) and "error" not in queues:
        for qname, depth in queues.items():
            for state, n in depth.items():
                m.queue_depth.labels(qname, state).set(n)


async def get_openapi(_request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp would send its and Python's versions.
    response.headers["Server"] = SERVER_HEADER


def create_app(deps: ApiDeps) -> web.Application:
    # client_max_size is a backstop; read_json_object enforces the real limit
    # with a problem+json answer.
    app = web.Application(
        middlewares=[edge_middleware],
        client_max_size=deps.settings.server.max_body_bytes + 1024,
    )
    app[DEPS] = deps
    app.on_response_prepare.append(_server_header)
    r = app.router
    r.add_post("/v1/portal-link-jobs", post_portal_link_job)
    r.add_get("/v1/jobs/{job_id}", get_job, allow_head=False)
    r.add_post("/v1/websites", post_website)
    r.add_get("/v1/websites/{domain}", get_website, allow_head=False)
    r.add_get("/v1/admin/outbox", admin_list_outbox, allow_head=False)
    r.add_post("/v1/admin/outbox/{outbox_id}/redrive", admin_redrive_outbox)
    r.add_post("/v1/admin/jobs/{job_id}/redrive", admin_redrive_job)
    r.add_get("/v1/admin/stats", admin_stats, allow_head=False)
    r.add_post("/v1/admin/tasks", admin_enqueue_task)
    r.add_get("/v1/admin/tasks", admin_list_tasks, allow_head=False)
    r.add_get("/v1/admin/jobs", admin_list_jobs, allow_head=False)
    r.add_get("/v1/admin/jobs/{job_id}", admin_get_job, allow_head=False)
    r.add_get("/v1/admin/websites", admin_list_websites, allow_head=False)
    r.add_post("/v1/admin/websites/{domain}/retry", admin_retry_website)
    r.add_get("/v1/admin/runtime", admin_runtime, allow_head=False)
    add_console_routes(r)
    r.add_get("/healthz", healthz, allow_head=False)
    r.add_get("/readyz", readyz, allow_head=False)
    r.add_get("/metrics", metrics, allow_head=False)
    r.add_get("/openapi.json", get_openapi, allow_head=False)
    return app
