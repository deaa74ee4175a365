"""The HTTP application: the router built from the route table, and the edge every request
passes (request id, access check, access line, metrics, problem+json for every error).

Handlers parse through http/inputs.py, call a service and render through http/render.py;
no SQL and no business rule lives on this side.
"""

from __future__ import annotations

import functools
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Final

import structlog
from aiohttp import web

from outboxd.config import is_loopback_host
from outboxd.errors import StorageError, StorageUnavailable
from outboxd.http import console, inputs, models
from outboxd.http.deps import (
    AUDIT_REASON,
    AUDIT_TARGET,
    AUDITED,
    DEPS,
    OPENAPI_JSON,
    PRINCIPAL,
    REQUEST_ID,
    ApiDeps,
)
from outboxd.http.endpoints import Access
from outboxd.http.inputs import ClientDisconnected, InputError
from outboxd.http.openapi import openapi_document
from outboxd.http.problems import (
    FORBIDDEN,
    INTERNAL_ERROR,
    METHOD_NOT_ALLOWED,
    MISDIRECTED_REQUEST,
    NOT_FOUND,
    PAYLOAD_TOO_LARGE,
    STORAGE_UNAVAILABLE,
    UNAUTHENTICATED,
    VALIDATION_FAILED,
    ApiError,
)
from outboxd.http.responses import problem
from outboxd.http.routes import ROUTES
from outboxd.http.server import SERVER_HEADER
from outboxd.metrics import Metrics
from outboxd.observability import OutageLog, log_request
from outboxd.security import Principal, TokenVerifier

log = structlog.get_logger(__name__)

# Probes and scrapes are access-logged at debug only (they come every few seconds).
_QUIET_ROUTES: Final = frozenset({"/healthz", "/readyz", "/metrics"})
# Answers 200 with the database down (it reports readiness): no sign the database is back.
_ANSWERS_WITHOUT_STORAGE: Final = frozenset({"/v1/admin/runtime"})

# Request ids: a random per-process prefix and a counter (32 hex characters, as a
# uuid4's hex was): unique, and a fraction of uuid4's cost per request.
_ID_PREFIX: Final = uuid.uuid4().hex[:16]
_ID_SEQ = itertools.count()


def _new_request_id() -> str:
    return f"{_ID_PREFIX}{next(_ID_SEQ):016x}"


def _route_name(request: web.Request) -> str:
    info = request.match_info
    resource = info.route.resource if info.http_exception is None else None
    return resource.canonical if resource is not None else "unmatched"


class _Edge:
    """What the edge middleware needs on every request, prepared once per app."""

    def __init__(self, metrics: Metrics, tokens: TokenVerifier) -> None:
        self._metrics = metrics
        self.tokens = tokens
        self.access: dict[web.AbstractRoute, Access] = {}
        # Each route's operation id (the audit log's `action`), and the routes every call of
        # which is on the audit log: the state-changing admin routes.
        self.operation: dict[web.AbstractRoute, str] = {}
        self.audited: set[web.AbstractRoute] = set()
        # Routes whose success means the database answered: the end of an outage.
        self.storage_routes: set[str] = set()
        # Requests refused because the database is down: one outage, not a line each.
        self.storage_outage = OutageLog("storage", "api")
        self._requests: dict[tuple[str, int], Any] = {}
        self._latency: dict[str, Any] = {}

    def count(self, route: str, status: int, elapsed: float) -> None:
        """The request and latency metrics, through their labelled children (cached)."""
        requests = self._requests.get((route, status))
        if requests is None:
            requests = self._metrics.http_requests.labels(route, str(status))
            self._requests[(route, status)] = requests
        latency = self._latency.get(route)
        if latency is None:
            latency = self._latency[route] = self._metrics.http_latency.labels(route)
        requests.inc()
        latency.observe(elapsed)


EDGE = web.AppKey("edge", _Edge)


@web.middleware
async def edge_middleware(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    """Request id, structured access log, metrics, and every error as problem+json."""
    edge = request.app[EDGE]
    incoming = request.headers.get("X-Request-Id")
    request_id = (
        incoming
        if incoming is not None and models.REQUEST_ID_RE.match(incoming)
        else _new_request_id()
    )
    request[REQUEST_ID] = request_id
    structlog.contextvars.bind_contextvars(request_id=request_id)
    started = time.perf_counter()
    route = _route_name(request)
    try:
        # The checks and the error mapping are plain functions, not a coroutine of their
        # own: a held request (Prefer: wait) keeps every frame it awaits through, and ten
        # thousand may be held (docs/decisions/0038-held-waits-cost-little.md).
        try:
            _admit(request, edge)
            response = await handler(request)
        except Exception as exc:
            failed = _failed(request, exc, edge)
            if failed is None:
                raise
            response = failed
        matched = request.match_info.route
        if matched in edge.audited or request.get(AUDITED):
            await _audit(request, edge.operation.get(matched, route), response.status)
    finally:
        structlog.contextvars.unbind_contextvars("request_id")
    response.headers["X-Request-Id"] = request_id
    if console.is_console_path(request.path):
        # Errors under /ui/ (404, 405, 421...) too: a browser treats them as console pages.
        for name, value in console.SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
    elapsed = time.perf_counter() - started
    edge.count(route, response.status, elapsed)
    if response.status < 300 and edge.storage_outage.down and route in edge.storage_routes:
        edge.storage_outage.recovered()
    log_request(
        request_id,
        request.method,
        route,
        response.status,
        round(elapsed * 1000, 2),
        quiet=route in _QUIET_ROUTES,
    )
    return response


def _admit(request: web.Request, edge: _Edge) -> None:
    """What every request passes before its handler (ApiError otherwise): not CONNECT, the
    operator's own with auth off, a route that exists for its method, its caller
    authenticated with the role the route needs."""
    match = request.match_info
    http_exc = match.http_exception
    if request.method == "CONNECT":
        raise ApiError(METHOD_NOT_ALLOWED, "CONNECT is not allowed", headers={"Allow": "GET, POST"})
    if not edge.tokens.enabled:
        _this_operator_only(request)
    if isinstance(http_exc, web.HTTPMethodNotAllowed):
        allow = ", ".join(sorted(http_exc.allowed_methods))
        raise ApiError(
            METHOD_NOT_ALLOWED,
            f"{request.method} is not allowed here",
            headers={"Allow": allow},
        )
    if http_exc is not None:
        raise ApiError(NOT_FOUND, "no such resource")
    access = edge.access.get(match.route, "user")
    if access != "public":
        principal = _authenticate(request, edge.tokens)
        request[PRINCIPAL] = principal
        if access != "user" and not principal.can(access):
            raise ApiError(FORBIDDEN, f"this operation needs the {access} role or above")


def _failed(request: web.Request, exc: Exception, edge: _Edge) -> web.StreamResponse | None:
    """The problem+json answer for what a handler (or `_admit`) raised; None for an aiohttp
    HTTPException to pass on as it is. Called while `exc` is being handled."""
    if isinstance(exc, ApiError):
        return problem(request, exc)
    if isinstance(exc, inputs.NoSuchId):
        return problem(request, ApiError(NOT_FOUND, "no such resource"))
    if isinstance(exc, InputError):
        errors = [{"field": exc.field, "message": exc.message}]
        return problem(request, ApiError(VALIDATION_FAILED, str(exc), errors))
    if isinstance(exc, ClientDisconnected):
        log.info("client_disconnected", method=request.method, route=_route_name(request))
        return problem(request, ApiError(VALIDATION_FAILED, "the request did not arrive whole"))
    if isinstance(exc, StorageUnavailable):
        edge.storage_outage.failed(exc)
        return problem(
            request,
            ApiError(
                STORAGE_UNAVAILABLE,
                "the database is unavailable; retry later",
                headers={"Retry-After": "1"},
            ),
        )
    if isinstance(exc, StorageError):
        log.error("storage_error", error=exc)
        return problem(request, ApiError(INTERNAL_ERROR, "the database refused the operation"))
    if isinstance(exc, web.HTTPException):
        if exc.status == 413:
            return problem(request, ApiError(PAYLOAD_TOO_LARGE, "the request body is too large"))
        return None
    log.exception("unhandled_error", error=exc)
    return problem(request, ApiError(INTERNAL_ERROR, "internal error"))


# Methods that change nothing: a cross-site page may send them (it cannot read the answer).
_SAFE_METHODS: Final = frozenset({"GET", "HEAD", "OPTIONS"})
# Sec-Fetch-Site values of a request the daemon's own pages (or no browser) made.
_OWN_SITES: Final = frozenset({"same-origin", "none"})


def _this_operator_only(request: web.Request) -> None:
    """Auth-off mode (no tokens: every caller is admin) serves this operator's own tools only.

    The Host must name loopback, so a page whose name was rebound to 127.0.0.1 (DNS
    rebinding) reads nothing; and a request that changes state must come from the daemon's
    own origin, so a page of another origin (another site, another local port) cannot
    send it (a form post or a no-cors fetch needs no CORS answer). curl, scripts and the
    console send what passes. Other local users are not kept out: that takes tokens.
    """
    host = request.headers.get("Host")
    if host is not None and not _loopback_authority(host):
        raise ApiError(
            MISDIRECTED_REQUEST,
            "with no [[auth.tokens]] this daemon answers requests to a loopback name only",
        )
    if request.method in _SAFE_METHODS:
        return
    site = request.headers.get("Sec-Fetch-Site")
    origin = request.headers.get("Origin")
    if (site is not None and site.lower() not in _OWN_SITES) or (
        origin is not None and (host is None or origin.lower() != "http://" + host.lower())
    ):
        raise ApiError(
            FORBIDDEN,
            "with no [[auth.tokens]] a request that changes state must come from this "
            "daemon's own origin",
        )


@functools.lru_cache(maxsize=256)  # a client sends the same Host on every request
def _loopback_authority(authority: str) -> bool:
    """`127.0.0.1`, `localhost`, `[::1]` (any loopback address or `localhost`), with or
    without a port."""
    name, port = authority, ""
    if authority.startswith("["):
        name, sep, port = authority[1:].partition("]")
        if not sep or (port and not port.startswith(":")):
            return False
        port = port[1:]
    elif ":" in authority:
        name, _, port = authority.rpartition(":")
    if port and not (port.isascii() and port.isdigit()):
        return False
    return is_loopback_host(name.lower().removesuffix("."))


# The caller with auth off: one for every request (a held request keeps its principal).
_LOCAL: Final = Principal("local", "admin")


def _authenticate(request: web.Request, tokens: TokenVerifier) -> Principal:
    if not tokens.enabled:
        # No tokens configured: config validation guarantees a loopback bind.
        return _LOCAL
    header = inputs.single_header(request.headers, "Authorization") or ""
    scheme, _, token = header.partition(" ")
    challenge = {"WWW-Authenticate": 'Bearer realm="outboxd"'}
    if scheme.lower() != "bearer" or not token.strip():
        raise ApiError(UNAUTHENTICATED, "a bearer token is required", headers=challenge)
    principal = tokens.verify(token.strip())
    if principal is None:
        raise ApiError(
            UNAUTHENTICATED,
            "the token is not valid",
            headers={"WWW-Authenticate": 'Bearer realm="outboxd", error="invalid_token"'},
        )
    return principal


async def _audit(request: web.Request, action: str, status: int) -> None:
    """The request's row on the audit log (services/audit.py): who, what, on which target,
    why, and how it ended. A request refused before it named its caller (401) has none."""
    audit = request.app[DEPS].audit
    principal = request.get(PRINCIPAL)
    if audit is None or principal is None:
        return
    target = request.get(AUDIT_TARGET)
    if target is None:
        target = "/".join(request.match_info.values()) or None
    await audit.record(
        principal.user,
        principal.role,
        action,
        target,
        status,
        reason=request.get(AUDIT_REASON),
        request_id=request.get(REQUEST_ID),
    )


async def _server_header(_request: web.Request, response: web.StreamResponse) -> None:
    # aiohttp would send its and Python's versions.
    response.headers["Server"] = SERVER_HEADER


def create_app(deps: ApiDeps) -> web.Application:
    # client_max_size is a backstop; inputs.read_json_object enforces the real limit
    # with a problem+json answer.
    app = web.Application(
        middlewares=[edge_middleware],
        client_max_size=deps.settings.server.max_body_bytes + 1024,
    )
    edge = _Edge(deps.metrics, deps.tokens)
    app[DEPS] = deps
    app[EDGE] = edge
    app[OPENAPI_JSON] = models.encode(openapi_document())
    app.on_response_prepare.append(_server_header)
    for route in ROUTES:
        added = app.router.add_route(route.method, route.router_path or route.path, route.handler)
        edge.access[added] = route.access
        edge.operation[added] = route.operation_id
        if route.method != "GET" and route.access in ("operator", "admin"):
            edge.audited.add(added)
        canonical = added.resource.canonical if added.resource is not None else route.path
        if route.access != "public" and canonical not in _ANSWERS_WITHOUT_STORAGE:
            edge.storage_routes.add(canonical)
    return app


def trim_middleware_chain(app: web.Application) -> None:
    """Once the app is frozen (`AppRunner.setup`): drop the middleware aiohttp appends to
    every chain to point `match_info.current_app` at the sub-application that runs the
    handler. This app has no sub-applications, so `current_app` is the app either way; the
    middleware only costs a coroutine per request, one more frame each held request keeps
    while it waits (docs/decisions/0038-held-waits-cost-little.md). Left as it is should
    aiohttp's chain not look as expected."""
    chain = getattr(app, "_middlewares_handlers", None)
    if not chain or getattr(app, "_subapps", True):
        return
    kept = tuple(m for m in chain if getattr(m[0], "__qualname__", "") != _CURRENT_APP_FIX)
    if len(kept) == len(chain) - 1:
        app._middlewares_handlers = kept


_CURRENT_APP_FIX: Final = "_fix_request_current_app.<locals>.impl"
