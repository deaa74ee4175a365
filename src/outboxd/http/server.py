"""The HTTP listener: aiohttp's request handler with deadlines a slow client cannot stretch.

aiohttp closes idle keep-alive connections (`keepalive_timeout`) but has no deadline
for a request that arrives slowly: half-sent headers or a drip-fed body hold a
connection (and a file descriptor) forever. `GuardedRequestHandler` adds:

- a read deadline: from the first byte of a request, its headers and its body must
  have arrived within `server.read_timeout_s`, or the connection is answered 408
  (when nothing was answered yet) and closed;
- a connection cap: beyond `server.max_connections` open connections, a new one is
  answered TOO_MANY_CONNECTIONS at once and closed;
- parser errors (a header over 8 KB, bytes that are not HTTP) answered as
  problem+json that never echoes the request, with `Server: outboxd`.

The handler is aiohttp's own; only the site that creates it is ours (`GuardedSite`).
"""

from __future__ import annotations

import asyncio
import json
import uuid
from dataclasses import dataclass
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from outboxd.http.problems import (
    INTERNAL_ERROR,
    REQUEST_TIMEOUT,
    TOO_MANY_CONNECTIONS,
    VALIDATION_FAILED,
    ProblemKind,
    problem_body,
)

log = structlog.get_logger(__name__)

SERVER_HEADER = "outboxd"


@dataclass(frozen=True)
class ConnectionLimits:
    read_timeout_s: float = 15.0
    keepalive_timeout_s: float = 60.0
    max_connections: int = 1024


def _problem_bytes(kind: ProblemKind, reason: str, detail: str) -> bytes:
    """A whole HTTP response, written to the socket before aiohttp has a request."""
    request_id = uuid.uuid4().hex
    body = json.dumps(problem_body(kind, detail, request_id)).encode()
    head = (
        f"HTTP/1.1 {kind.status} {reason}\r\n"
        "Content-Type: application/problem+json\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"X-Request-Id: {request_id}\r\n"
        f"Server: {SERVER_HEADER}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


class _Gate:
    """Open connections of one listener, shared by its handlers."""

    def __init__(self, limits: ConnectionLimits) -> None:
        self.limits = limits
        self.open = 0


class GuardedRequestHandler(RequestHandler):
    def __init__(self, manager: web.Server, *, gate: _Gate, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = gate
        self._counted = False
        self._reading_since: float | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._answered_bytes = 0

    # ------------------------------------------------------------------ cap

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        gate = self._gate
        if gate.open >= gate.limits.max_connections:
            log.warning("connection_refused", reason="max_connections", open=gate.open)
            tr: Any = transport
            try:
                tr.write(
                    _problem_bytes(
                        TOO_MANY_CONNECTIONS,
                        "Service Unavailable",
                        "too many open connections; retry later",
                    )
                )
            finally:
                tr.close()
            return
        gate.open += 1
        self._counted = True
        super().connection_made(transport)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._gate.open -= 1
        self._disarm()
        super().connection_lost(exc)

    # ------------------------------------------------------------------ read deadline

    def data_received(self, data: bytes) -> None:
        if not self._counted:
            return
        if data and self._reading_since is None and not self._request_complete():
            loop = asyncio.get_running_loop()
            self._reading_since = loop.time()
            self._read_timer = loop.call_later(
                self._gate.limits.read_timeout_s, self._read_deadline
            )
        super().data_received(data)

    def _request_complete(self) -> bool:
        """Headers parsed and the whole body received (the handler may still run)."""
        request = self._current_request
        if request is None:
            return False
        return request.content.is_eof()

    def request_answered(self) -> None:
        """A response is on its way: the next request gets a deadline of its own."""
        self._disarm()

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None
        self._reading_since = None

    def _read_deadline(self) -> None:
        self._read_timer = None
        if self._request_complete() or self.transport is None:
            self._reading_since = None
            return
        request = self._current_request
        log.info(
            "client_read_timeout",
            phase="body" if request is not None else "headers",
            read_timeout_s=self._gate.limits.read_timeout_s,
        )
        transport: Any = self.transport
        if request is None or request.writer.output_size == 0:
            # Nothing was answered on this request yet: say why before closing.
            transport.write(
                _problem_bytes(
                    REQUEST_TIMEOUT,
                    "Request Timeout",
                    "the request did not arrive within server.read_timeout_s",
                )
            )
        self.force_close()
        transport.close()

    def log_exception(self, *args: Any, **kw: Any) -> None:
        exc = kw.get("exc_info")
        if isinstance(exc, web.RequestPayloadError | HttpProcessingError | ConnectionError):
            # A body that broke off or does not decode was answered 400 already;
            # draining its rest fails the same way. The client's fault, not ours.
            log.info("client_body_unreadable", error_type=type(exc).__name__)
            return
        log.error("http_server_exception", error=exc if isinstance(exc, Exception) else None)

    # ------------------------------------------------------------------ parser errors

    def handle_error(
        self,
        request: BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            return super().handle_error(request, status, exc, message)
        request_id = uuid.uuid4().hex
        if status >= 500:
            log.error("http_server_error", status=status, error_type=type(exc).__name__)
            body = problem_body(INTERNAL_ERROR, "internal error", request_id)
        else:
            # The parser's message can quote the request: never echo it.
            log.info("http_bad_request", status=status, error_type=type(exc).__name__)
            body = problem_body(VALIDATION_FAILED, "malformed HTTP request", request_id)
        body["status"] = status
        resp = web.json_response(
            body,
            status=status,
            content_type="application/problem+json",
            headers={"X-Request-Id": request_id, "Server": SERVER_HEADER},
        )
        resp.force_close()
        return resp


async def _mark_answered(request: web.Request, _response: web.StreamResponse) -> None:
    protocol = request.protocol
    if isinstance(protocol, GuardedRequestHandler):
        protocol.request_answered()


def guard_app(app: web.Application) -> None:
    """Tell the handler when a response starts (call before the app is frozen)."""
    app.on_response_prepare.append(_mark_answered)


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are `GuardedRequestHandler`s."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        limits: ConnectionLimits,
        handler_kwargs: dict[str, Any],
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._gate = _Gate(limits)
        self._handler_kwargs = handler_kwargs

    @property
    def name(self) -> str:
        return f"http://{self._host}:{self._port}"

    @property
    def open_connections(self) -> int:
        return self._gate.open

    async def start(self) -> None:
        await super().start()
        loop = asyncio.get_running_loop()
        manager = self._runner.server
        assert manager is not None
        gate = self._gate
        kwargs = dict(self._handler_kwargs)

        def factory() -> GuardedRequestHandler:
            return GuardedRequestHandler(manager, gate=gate, loop=loop, **kwargs)

        self._server = await loop.create_server(factory, self._host, self._port, reuse_address=True)
