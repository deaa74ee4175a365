"""The HTTP listener: aiohttp's request handler with deadlines a slow client cannot stretch.

aiohttp closes idle keep-alive connections (`keepalive_timeout`) but has no deadline
for a request that arrives slowly: half-sent headers or a drip-fed body hold a
connection (and a file descriptor) forever. `GuardedRequestHandler` adds:

- a read deadline: from the first byte of a request, its headers and its body must
  have arrived within `server.read_timeout_s`, or the connection is answered 408
  (when nothing was answered yet) and closed;
- a connection cap: beyond `server.max_connections` open connections, a new one is
  answered TOO_MANY_CONNECTIONS at once and closed;
- a write deadline: a response that makes no progress (the client does not read) for
  `server.write_timeout_s` is aborted, so clients that pipeline and never read cannot
  hold the connection cap;
- a header budget: the request line and headers together are at most
  `server.max_header_bytes` and `MAX_HEADER_FIELDS` fields, counted as the bytes arrive
  and before aiohttp's parser keeps any of them; past it HEADERS_TOO_LARGE and close;
- parser errors (bytes that are not HTTP) answered as problem+json that never echoes
  the request, with `Server: outboxd`.

The handler is aiohttp's own; only the site that creates it is ours (`GuardedSite`).
"""

from __future__ import annotations

import asyncio
import json
import socket
import uuid
from collections.abc import Sequence
from typing import Any

import structlog
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest

from outboxd.config import ServerSettings
from outboxd.http.problems import (
    HEADERS_TOO_LARGE,
    INTERNAL_ERROR,
    REQUEST_TIMEOUT,
    TOO_MANY_CONNECTIONS,
    VALIDATION_FAILED,
    ProblemKind,
    problem_body,
)

log = structlog.get_logger(__name__)

SERVER_HEADER = "outboxd"
# Header fields a request may carry (the request line and the blank line not counted).
MAX_HEADER_FIELDS = 64


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


class HeadersTooLarge(Exception):
    """A request's line and headers are over the budget."""


_BLANK_LINE = b"\r\n\r\n"


class _Framing:
    """Where each byte a connection receives falls: in a request's head (the request line
    and headers, or a chunked body's trailers), counted against the budget, or in a body.

    It reads only what delimits requests (the blank line, Content-Length, chunked
    framing), so a head is measured before aiohttp's parser holds any of it; aiohttp
    still parses and judges everything (a framing it refuses closes the connection).
    """

    __slots__ = (
        "_body_left",
        "_chunk",
        "_chunk_left",
        "_chunk_line",
        "_head",
        "_in_trailer",
        "_max_bytes",
    )

    def __init__(self, max_bytes: int) -> None:
        self._max_bytes = max_bytes
        # The head so far, never more than the budget; bytes, b"" (shared) between heads: a
        # connection waiting on its answer keeps no buffer of its own.
        self._head = b""
        self._in_trailer = False
        self._body_left = 0  # Content-Length bytes still to come
        # In a chunked body: "size" (its line so far in _chunk_line), "data" or "crlf"
        # (_chunk_left bytes to come); None outside one.
        self._chunk: str | None = None
        self._chunk_left = 0
        self._chunk_line = b""

    def feed(self, data: bytes) -> None:
        """Account for `data`; HeadersTooLarge once a head is over the budget."""
        i, n = 0, len(data)
        while i < n:
            if self._body_left:
                take = min(self._body_left, n - i)
                self._body_left -= take
                i += take
            elif self._chunk is not None:
                i = self._chunked(data, i)
            else:
                i = self._in_head(data, i)

    def _in_head(self, data: bytes, i: int) -> int:
        head = self._head
        room = self._max_bytes - len(head)
        end = -1
        if head:  # the blank line may straddle the previous read and this one
            tail = head[-3:]
            k = (tail + data[i : i + 3]).find(_BLANK_LINE)
            if k != -1:
                end = i + k + 4 - len(tail)
        if end == -1:
            k = data.find(_BLANK_LINE, i, i + room)
            end = -1 if k == -1 else k + 4
        if end == -1:
            if len(data) - i > room - 1:
                raise HeadersTooLarge()
            self._head = head + data[i:]
            return len(data)
        whole = head + data[i:end] if head else data[i:end]
        self._head = b""
        if len(whole) > self._max_bytes or whole.count(b"\r\n") - 2 > MAX_HEADER_FIELDS:
            raise HeadersTooLarge()
        if self._in_trailer:
            self._in_trailer = False
        else:
            self._body_of(whole)
        return end

    def _body_of(self, head: bytes) -> None:
        lower = head.lower()
        if b"\r\ntransfer-encoding:" in lower:
            # aiohttp refuses anything but a final "chunked" (and with Content-Length).
            self._chunk = "size"
            return
        at = lower.find(b"\r\ncontent-length:")
        if at != -1:
            value = lower[at + 17 : lower.find(b"\r\n", at + 2)].strip()
            self._body_left = int(value) if value.isdigit() and len(value) < 19 else 0

    def _chunked(self, data: bytes, i: int) -> int:
        if self._chunk in ("data", "crlf"):
            take = min(self._chunk_left, len(data) - i)
            self._chunk_left -= take
            if self._chunk_left == 0:
                if self._chunk == "data":
                    self._chunk, self._chunk_left = "crlf", 2
                else:
                    self._chunk, self._chunk_line = "size", b""
            return i + take
        # The size line: hex digits, maybe extensions, CRLF.
        nl = data.find(b"\n", i)
        line = self._chunk_line + (data[i:] if nl == -1 else data[i : nl + 1])
        if len(line) > 1024:
            raise HeadersTooLarge()  # no chunk size line is that long
        if nl == -1:
            self._chunk_line = line
            return len(data)
        try:
            size = int(line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            size = 0  # aiohttp refuses the body; this only has to end the count
        self._chunk_line = b""
        if size == 0:
            # The trailers and the blank line end the body: measured like a head.
            self._chunk = None
            self._in_trailer = True
            self._head += b"\r\n"
        else:
            self._chunk, self._chunk_left = "data", size
        return nl + 1


class _Gate:
    """Open connections of one listener, shared by its handlers."""

    def __init__(self, limits: ServerSettings) -> None:
        self.limits = limits
        self.open = 0


class _Pending(list[Any]):
    """aiohttp's queue of the requests a connection has sent that its handler has not taken
    yet, as a list rather than aiohttp's deque: a deque allocates a block of 64 slots (624
    bytes) for every connection even while empty, and this queue holds one request, or a
    few pipelined ones (aiohttp bounds it), so taking the first is cheap. aiohttp appends,
    takes the first (`popleft`) and asks for the length."""

    __slots__ = ()

    def popleft(self) -> Any:
        return self.pop(0)


class GuardedRequestHandler(RequestHandler):
    # aiohttp's handler has slots; so has this one: no per-connection __dict__.
    __slots__ = (
        "_answered_bytes",
        "_counted",
        "_framing",
        "_gate",
        "_read_timer",
        "_reading_since",
        "_refused",
        "_socket",
        "_write_left",
        "_write_timer",
    )

    def __init__(self, manager: web.Server, *, gate: _Gate, **kwargs: Any) -> None:
        super().__init__(manager, **kwargs)
        self._gate = gate
        self._counted = False
        self._reading_since: float | None = None
        self._read_timer: asyncio.TimerHandle | None = None
        self._answered_bytes = 0
        self._framing = _Framing(gate.limits.max_header_bytes)
        self._refused = False  # over the header budget: input is dropped until the close
        self._write_timer: asyncio.TimerHandle | None = None
        self._write_left = 0
        self._socket: Any = None
        # aiohttp's queue of parsed requests waiting for the handler, as a list.
        self._messages = _Pending()  # type: ignore[assignment]

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
        # Paused (and so timed) whenever any byte waits to be written: even a short
        # answer the client never reads holds the connection until the deadline.
        # Kept past aiohttp's own close (which drops `self.transport` while unsent bytes
        # still wait in the socket's transport): the write deadline must still reach it.
        self._socket = transport
        self._socket.set_write_buffer_limits(high=0)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._counted:
            self._counted = False
            self._gate.open -= 1
        self._disarm()
        self._disarm_write()
        self._socket = None
        super().connection_lost(exc)

    # ------------------------------------------------------------------ read deadline

    def data_received(self, data: bytes) -> None:
        if not self._counted or self._refused:
            return
        if data and self._reading_since is None and not self._request_complete():
            loop = asyncio.get_running_loop()
            self._reading_since = loop.time()
            self._read_timer = loop.call_later(
                self._gate.limits.read_timeout_s, self._read_deadline
            )
        try:
            self._framing.feed(data)
        except HeadersTooLarge:
            self._refuse_head()
            return
        super().data_received(data)

    def _refuse_head(self) -> None:
        """Over the header budget: nothing of it reaches the parser. Answered when nothing
        else is being answered on the connection, else cut off."""
        limits = self._gate.limits
        log.info("client_headers_too_large", max_header_bytes=limits.max_header_bytes)
        self._refused = True
        self._disarm()
        transport = self._socket
        if transport is None:
            return
        if self._current_request is not None or self._messages or not transport.can_write_eof():
            self.force_close()
            transport.abort()
            return
        transport.write(
            _problem_bytes(
                HEADERS_TOO_LARGE,
                "Request Header Fields Too Large",
                "the request line and headers are over server.max_header_bytes "
                f"({limits.max_header_bytes}) or {MAX_HEADER_FIELDS} fields",
            )
        )
        # Closing with the client's bytes unread would reset the connection, and the
        # answer with it: shut our side, drop what still comes for a moment, then close.
        transport.write_eof()
        asyncio.get_running_loop().call_later(
            min(2.0, limits.read_timeout_s), self._close_refused, transport
        )

    def _close_refused(self, transport: Any) -> None:
        self.force_close()
        transport.close()

    def _request_complete(self) -> bool:
        """Headers parsed and the whole body received (the handler may still run)."""
        request = self._current_request
        if request is None:
            return False
        return request.content.is_eof()

    def request_arrived(self) -> None:
        """The current request is in whole and its handler will answer it later (a held
        request): neither the read deadline nor aiohttp's keep-alive check (armed when the
        connection opened, against one that never sends a request) has anything to watch
        until the answer, after which aiohttp arms its keep-alive anew. Dropped now, not left
        armed for each of thousands of held requests."""
        if not self._request_complete():
            return
        self._disarm()
        if self._keepalive_handle is not None:
            self._keepalive_handle.cancel()
            self._keepalive_handle = None

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

    # ------------------------------------------------------------------ write deadline

    def pause_writing(self) -> None:
        super().pause_writing()
        transport = self._socket
        if transport is None or self._write_timer is not None:
            return
        self._write_left = transport.get_write_buffer_size()
        self._write_timer = asyncio.get_running_loop().call_later(
            self._gate.limits.write_timeout_s, self._write_deadline
        )

    def resume_writing(self) -> None:
        super().resume_writing()
        self._disarm_write()

    def _disarm_write(self) -> None:
        if self._write_timer is not None:
            self._write_timer.cancel()
            self._write_timer = None

    def _write_deadline(self) -> None:
        self._write_timer = None
        transport = self._socket
        if transport is None or not self._paused:
            return
        left = transport.get_write_buffer_size()
        if left < self._write_left:
            # The client read some since: progress, so another period of grace.
            self._write_left = left
            self._write_timer = asyncio.get_running_loop().call_later(
                self._gate.limits.write_timeout_s, self._write_deadline
            )
            return
        log.info(
            "client_write_timeout",
            unsent_bytes=left,
            write_timeout_s=self._gate.limits.write_timeout_s,
        )
        self.force_close()
        transport.abort()

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


def request_arrived(request: web.Request) -> None:
    """`request` has arrived whole and will be answered later (a held request): its
    connection's read deadline is dropped now rather than left armed until it fires."""
    protocol = request.protocol
    if isinstance(protocol, GuardedRequestHandler):
        protocol.request_arrived()


async def _mark_answered(request: web.Request, _response: web.StreamResponse) -> None:
    protocol = request.protocol
    if isinstance(protocol, GuardedRequestHandler):
        protocol.request_answered()


def guard_app(app: web.Application) -> None:
    """Tell the handler when a response starts (call before the app is frozen)."""
    app.on_response_prepare.append(_mark_answered)


def bind_listeners(host: str, port: int, backlog: int = 128) -> list[socket.socket]:
    """Listening sockets on every address `host` names, as asyncio's own server would bind
    them (SO_REUSEADDR; an IPv6 socket for IPv6 only). `serve` binds them before it touches
    the database or the queues, so a second daemon on a taken port stops there (OSError)
    rather than after its start-up work. Until the API serves them, connections wait in the
    backlog, as with a socket systemd holds for a service."""
    bound: list[socket.socket] = []
    try:
        for family, kind, proto, _name, address in socket.getaddrinfo(
            host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
        ):
            sock = socket.socket(family, kind, proto)
            bound.append(sock)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            sock.bind(address)
            sock.listen(backlog)
            sock.setblocking(False)
    except OSError:
        for sock in bound:
            sock.close()
        raise
    return bound


class GuardedSite(web.BaseSite):
    """A TCP site whose connections are `GuardedRequestHandler`s, on sockets bound
    beforehand (`bind_listeners`) or, without them, bound at start."""

    def __init__(
        self,
        runner: web.AppRunner,
        host: str,
        port: int,
        limits: ServerSettings,
        handler_kwargs: dict[str, Any],
        sockets: Sequence[socket.socket] = (),
    ) -> None:
        super().__init__(runner)
        self._host = host
        self._port = port
        self._gate = _Gate(limits)
        self._handler_kwargs = handler_kwargs
        self._sockets = list(sockets)
        self._servers: list[asyncio.Server] = []

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
        # The budget (`_Framing`) refuses a large head before the parser sees it; the
        # parser's own limits stay behind it as a backstop.
        budget = gate.limits.max_header_bytes
        kwargs.update(max_line_size=budget, max_field_size=budget, max_headers=MAX_HEADER_FIELDS)

        def factory() -> GuardedRequestHandler:
            return GuardedRequestHandler(manager, gate=gate, loop=loop, **kwargs)

        for sock in self._sockets or bind_listeners(self._host, self._port):
            self._servers.append(await loop.create_server(factory, sock=sock))
        self._server = self._servers[0]

    @property
    def sockets(self) -> list[socket.socket]:
        return [s for server in self._servers for s in server.sockets]

    async def stop(self) -> None:
        for server in self._servers[1:]:
            server.close()
        await super().stop()
