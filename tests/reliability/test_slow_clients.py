"""Slow, greedy and vanishing clients against the daemon's real listener, on both backends.

- `server.read_timeout_s = 2`: half-sent headers, drip-fed headers and a half-sent body
  are answered 408 and closed within a few seconds, while others keep being served;
- an idle keep-alive connection is closed after `server.keepalive_timeout_s`;
- beyond `server.max_connections`, a new connection is answered 503 at once;
- a client that hangs up mid-body is `client_disconnected` at info: no error-level
  line, no 5xx in the access log or the metrics;
- a broken gzip, deflate or chunked body is 400 C01; parser errors are problem+json
  that never echo the request; CONNECT is 405; `Server:` carries no version;
- clients that pipeline and never read are cut off after `server.write_timeout_s`,
  so they cannot hold `server.max_connections`: new clients are served;
- a head over `server.max_header_bytes` or 64 fields is 431 C13, never echoed; a flood
  of such heads leaves the daemon's RSS bounded (a daemon subprocess, read from /proc).
"""

from __future__ import annotations

import contextlib
import re
import socket
import time
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import sqlite_only
from tests.reliability.conftest import MakeDaemon
from tests.reliability.harness import http, raw_post
from tests.support.live_api import LiveApi, parse_response, read_until_closed
from tests.support.waits import eventually_sync

READ_TIMEOUT_S = 2.0
# Generous: the machine is shared; "closed within a few seconds" is what is asserted.
CLOSE_WITHIN_S = READ_TIMEOUT_S + 6.0


@pytest.fixture
def make_live(make_live_api: Callable[..., LiveApi]) -> Callable[..., LiveApi]:
    """The live API with small server limits; keyword settings override them."""

    def factory(**server: float) -> LiveApi:
        return make_live_api(
            server={
                "read_timeout_s": READ_TIMEOUT_S,
                # Far longer than the read deadline, so it is the read deadline
                # (not aiohttp's keep-alive timer) that cuts the slow clients off.
                "keepalive_timeout_s": 60.0,
                "max_connections": 8,
                "max_body_bytes": 4096,
                **server,
            }
        )

    return factory


@pytest.fixture
def live(make_live: Callable[..., LiveApi]) -> LiveApi:
    return make_live()


def _closed_after(sock: socket.socket) -> tuple[float, bytes]:
    started = time.monotonic()
    data = read_until_closed(sock, CLOSE_WITHIN_S + 5)
    return time.monotonic() - started, data


def _healthy(live: LiveApi) -> None:
    resp = live.get("/healthz")
    assert resp.status == 200, resp


def _assert_408(data: bytes) -> None:
    if data:  # closing without a word is allowed; if it speaks, it is a 408 problem
        resp = parse_response(data)
        assert resp.status == 408
        assert resp.headers["content-type"].startswith("application/problem+json")


@pytest.mark.real_clock  # a client that stalls
def test_half_sent_headers_are_closed_and_others_are_served(live: LiveApi) -> None:
    with live.connect() as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        time.sleep(0.5)
        _healthy(live)  # the daemon keeps answering while one client stalls
        elapsed, data = _closed_after(slow)
    assert elapsed < CLOSE_WITHIN_S
    _assert_408(data)
    _healthy(live)


@pytest.mark.real_clock  # a client that drips its headers
def test_drip_fed_headers_do_not_extend_the_deadline(live: LiveApi) -> None:
    started = time.monotonic()
    with live.connect() as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\n")
        closed = False
        while time.monotonic() - started < CLOSE_WITHIN_S + 5:
            try:
                slow.sendall(b"X-Drip: 1\r\n")
            except OSError:
                closed = True
                break
            slow.settimeout(0.4)
            try:
                if slow.recv(65536) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
            except OSError:
                closed = True
                break
    assert closed, "a client sending a header line every 0.4 s was never cut off"
    assert time.monotonic() - started < CLOSE_WITHIN_S
    _healthy(live)


@pytest.mark.real_clock  # a client that stalls mid-body
def test_a_half_sent_body_is_closed(live: LiveApi) -> None:
    before = live.counts()
    with live.connect() as slow:
        slow.sendall(
            b"POST /v1/websites HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n"
            b'{"domain": "exa'
        )
        elapsed, data = _closed_after(slow)
    assert elapsed < CLOSE_WITHIN_S
    _assert_408(data)
    assert live.counts() == before
    _healthy(live)


@pytest.mark.real_clock  # a client slow but steady
def test_a_fast_request_on_a_reused_connection_gets_a_fresh_deadline(live: LiveApi) -> None:
    """The deadline is per request: a keep-alive connection used slowly but steadily lives."""
    with live.connect() as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            got = b""
            while b'"ok"' not in got:
                chunk = sock.recv(65536)
                assert chunk, "closed a connection that sent whole requests"
                got += chunk
            assert got.startswith(b"HTTP/1.1 200")
            time.sleep(READ_TIMEOUT_S * 0.75)


@pytest.mark.real_clock  # a client idle until the keep-alive timeout
def test_an_idle_keep_alive_connection_is_closed(make_live: Callable[..., LiveApi]) -> None:
    live = make_live(keepalive_timeout_s=3.0)
    with live.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        elapsed, data = _closed_after(sock)
    assert data.startswith(b"HTTP/1.1 200")
    assert elapsed < 3.0 + 6.0


def test_connections_beyond_the_cap_are_answered_503_at_once(live: LiveApi) -> None:
    held = [live.connect() for _ in range(8)]
    try:
        # Each held connection has been accepted once it answers a request.
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        with live.connect() as extra:
            started = time.monotonic()
            data = read_until_closed(extra, 10)
            assert time.monotonic() - started < 5
        resp = parse_response(data)
        assert resp.status == 503
        assert resp.json()["code"] == "C09"
    finally:
        for sock in held:
            sock.close()
    # The slots come back once the held connections are gone.
    eventually_sync(lambda: live.get("/healthz").status == 200, 20, what="a free slot")


@pytest.mark.real_clock  # a client that stalls mid-body, then hangs up
def test_a_client_hanging_up_mid_body_is_not_a_server_error(live: LiveApi) -> None:
    with live.connect() as sock:
        sock.sendall(
            b"POST /v1/websites HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n"
            b'{"domain": "exa'
        )
        time.sleep(0.3)
    live.wait_for_event("client_disconnected")
    _healthy(live)
    events = live.events()
    assert [e for e in events if e.get("level") in ("error", "critical")] == []
    access = [e for e in events if e.get("event") == "http_request"]
    assert access and all(e["status"] < 500 for e in access), access
    for sample in next(iter(live.metrics.http_requests.collect())).samples:
        assert not sample.labels["status"].startswith("5"), sample


@pytest.mark.parametrize(
    ("encoding", "body"),
    [
        (b"gzip", b'{"domain": "example.com"}'),
        (b"deflate", b'{"domain": "example.com"}'),
        (b"gzip", b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03garbage"),
        (b"deflate", zlib.compress(b'{"domain": "example.com"}' * 20)[:-9] + b"\xff" * 9),
    ],
    ids=["gzip-plain", "deflate-plain", "gzip-garbage", "deflate-corrupt"],
)
def test_a_body_that_is_not_its_content_encoding_is_400(
    live: LiveApi, encoding: bytes, body: bytes
) -> None:
    resp = live.send(raw_post("/v1/websites", body, b"Content-Encoding: " + encoding + b"\r\n"))
    assert resp.status == 400, resp
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.json()["code"] == "C01"
    assert live.counts()["websites"] == 0


def test_a_valid_gzip_body_is_accepted(live: LiveApi) -> None:
    import gzip

    body = gzip.compress(b'{"domain": "example.com"}')
    resp = live.send(raw_post("/v1/websites", body, b"Content-Encoding: gzip\r\n"))
    assert resp.status == 201, resp


def test_a_malformed_chunk_after_the_body_started_is_400(live: LiveApi) -> None:
    raw = (
        b"POST /v1/websites HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
        b'5\r\n{"dom\r\nzz\r\nnot a chunk\r\n'
    )
    started = time.monotonic()
    resp = live.send(raw)
    assert time.monotonic() - started < CLOSE_WITHIN_S
    assert resp.status == 400, resp
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert live.counts()["websites"] == 0


@pytest.mark.parametrize(
    "raw",
    [
        b"G\x01T /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /heal\x7fthz\x00s3cr3t HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Header s3cr3t\r\n\r\n",
        b"s3cr3t\r\n\r\n",
    ],
    ids=["method-bytes", "url-bytes", "header-syntax", "not-http"],
)
def test_parser_errors_are_problem_json_that_do_not_echo(live: LiveApi, raw: bytes) -> None:
    resp = live.send(raw)
    assert 400 <= resp.status < 500, resp
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.headers.get("x-request-id")
    assert resp.headers.get("server") == "outboxd"
    assert b"s3cr3t" not in resp.body and b"heal" not in resp.body
    assert resp.json()["code"] == "C01"
    _healthy(live)


def test_connect_is_405_and_no_server_version_is_sent(live: LiveApi) -> None:
    resp = live.send(
        b"CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443\r\nConnection: close\r\n\r\n"
    )
    assert resp.status == 405, resp
    assert resp.json()["code"] == "C10"
    ok = live.get("/healthz")
    assert ok.headers.get("server") == "outboxd"
    assert "aiohttp" not in str(ok.headers) and "Python" not in str(ok.headers)


# ------------------------------------------------------------------ responses nobody reads

WRITE_TIMEOUT_S = 2.0


def _pipelining_non_reader(live: LiveApi, requests: int = 200) -> socket.socket:
    """A connection that sends `requests` GETs of the OpenAPI document and never reads."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small receive window, so the daemon's side fills up after a few answers.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.settimeout(20)
    sock.connect(("127.0.0.1", live.port))
    sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n" * requests)
    return sock


@pytest.mark.real_clock  # clients that never read, until the write timeout
def test_clients_that_pipeline_and_never_read_cannot_hold_the_connection_cap(
    make_live: Callable[..., LiveApi],
) -> None:
    live = make_live(write_timeout_s=WRITE_TIMEOUT_S)  # max_connections = 8
    hogs = [_pipelining_non_reader(live) for _ in range(8)]
    try:
        # The hogs hold every slot until their answers make no progress for the write
        # timeout; then they are cut off and a new client is served.

        def served() -> bool:
            resp = live.get("/healthz")
            assert resp.status in (200, 503), resp
            return resp.status == 200

        eventually_sync(
            served, WRITE_TIMEOUT_S + 20, what="a new client served past the hogs", interval=0.2
        )
        cut = [e for e in live.events() if e.get("event") == "client_write_timeout"]
        assert cut, "served, but no connection was cut for its write deadline"
    finally:
        for sock in hogs:
            sock.close()


@pytest.mark.real_clock  # a client that never reads, until the write timeout
def test_a_non_reader_beside_the_cap_does_not_stop_others(
    make_live: Callable[..., LiveApi],
) -> None:
    live = make_live(write_timeout_s=WRITE_TIMEOUT_S)
    with _pipelining_non_reader(live) as hog:
        for _ in range(3):
            _healthy(live)  # served meanwhile, while the hog's answers wait
        live.wait_for_event("client_write_timeout", timeout_s=WRITE_TIMEOUT_S + 15)
        # Reading now, it gets what was sent before the cut, then the end.
        _elapsed, data = _closed_after(hog)
    assert data.startswith(b"HTTP/1.1 200")
    _healthy(live)


@pytest.mark.slow
@pytest.mark.real_clock  # a client that reads slowly
def test_a_slow_reader_that_keeps_reading_is_not_cut_off(
    make_live: Callable[..., LiveApi],
) -> None:
    """The deadline is on progress, not on the whole answer: reading a little every
    half deadline keeps the connection."""
    live = make_live(write_timeout_s=WRITE_TIMEOUT_S)
    # Two answers of the OpenAPI document (about 80 KB each): the second's status line
    # comes after the whole first answer, read a few KB (the receive window) at a time.
    with _pipelining_non_reader(live, requests=2) as sock:
        got = b""
        started = time.monotonic()
        while got.count(b"HTTP/1.1 200") < 2:
            time.sleep(WRITE_TIMEOUT_S / 2)
            chunk = sock.recv(16384)
            assert chunk, "the server closed a connection whose client kept reading"
            got += chunk
        assert time.monotonic() - started > WRITE_TIMEOUT_S  # it did outlive one deadline
    assert not [e for e in live.events() if e.get("event") == "client_write_timeout"]


# ------------------------------------------------------------------ the header budget


def _assert_431(resp: Any) -> None:
    assert resp.status == 431, resp
    assert resp.headers["content-type"].startswith("application/problem+json")
    assert resp.headers.get("server") == "outboxd"
    assert resp.headers.get("x-request-id")
    assert resp.json()["code"] == "C13"
    assert b"s3cr3t" not in resp.body


@pytest.mark.real_clock  # a head sent slowly
def test_a_head_over_the_budget_is_431_and_never_echoed(make_live: Callable[..., LiveApi]) -> None:
    live = make_live(max_header_bytes=16384)
    within = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"s" * 12000
    assert live.send(within + b"\r\nConnection: close\r\n\r\n").status == 200
    over = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: " + b"s3cr3t" * 3000
    _assert_431(live.send(over + b"\r\n\r\n"))
    # Spread over many small fields, and sent slowly, it is the same.
    many = b"".join(b"X-%d: %s\r\n" % (i, b"s3cr3t" * 100) for i in range(40))
    with live.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        for at in range(0, len(many), 4000):
            try:
                sock.sendall(many[at : at + 4000])
            except OSError:
                break
            time.sleep(0.05)
        _assert_431(parse_response(read_until_closed(sock, 20)))
    _healthy(live)


def test_more_than_64_header_fields_are_431(live: LiveApi) -> None:
    def request(fields: int) -> bytes:
        extra = b"".join(b"X-%d: y\r\n" % i for i in range(fields - 2))
        return (
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + b"Connection: close\r\n\r\n"
        )

    assert live.send(request(64)).status == 200
    _assert_431(live.send(request(65)))


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


FLOOD_CONNECTIONS = 300
# 120 fields of 7,800 bytes: under aiohttp's own per-field and field-count limits.
FLOOD_HEAD = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n" + b"".join(
    b"X-Flood-%03d: %s\r\n" % (i, b"f" * 7800) for i in range(120)
)


@sqlite_only
def test_a_header_flood_leaves_the_daemon_rss_bounded(make_daemon: MakeDaemon) -> None:
    """300 connections each sending ~940 KB of headers (never ending the head) and held
    open: each is refused at the budget, so the daemon does not keep ~2 MB per connection
    (about 600 MB here without the budget); the bound is generous, never a speed."""
    daemon = make_daemon(daemon={"roles": ["api"]}, server={"max_connections": 2048})
    base = daemon.start()
    port = int(base.rsplit(":", 1)[1])
    before = _rss_kib(daemon.pid)
    held: list[socket.socket] = []
    answered: list[bytes] = []
    try:
        for _ in range(FLOOD_CONNECTIONS):
            sock = socket.create_connection(("127.0.0.1", port), timeout=10)
            held.append(sock)
            with contextlib.suppress(OSError):  # refused and closed mid-send: the point
                sock.sendall(FLOOD_HEAD)
        during = _rss_kib(daemon.pid)
        for sock in held[:5]:
            try:
                answered.append(read_until_closed(sock, 10))
            except OSError:
                answered.append(b"")
    finally:
        for sock in held:
            sock.close()
    # Past the flood: the daemon answers again (it has taken the closes in).
    eventually_sync(lambda: http("GET", base, "/healthz").status == 200, 20, what="/healthz")
    after = _rss_kib(daemon.pid)
    growth_mib = (max(during, after) - before) / 1024
    print(
        f"\nheader flood: RSS {before // 1024} MiB before, {during // 1024} during, "
        f"{after // 1024} after {FLOOD_CONNECTIONS} connections"
    )
    assert growth_mib < 150, (before, during, after)
    assert any(a.startswith(b"HTTP/1.1 431") for a in answered), answered
    assert daemon.running()
    assert daemon.terminate() == 0


def test_pipelined_requests_are_answered_in_order(live: LiveApi) -> None:
    """Three requests in one write: aiohttp queues those behind the first (in the guarded
    handler's list, not a deque: docs/decisions/0038-held-waits-cost-little.md) and answers
    each in turn, the last closing the connection as it asked."""
    host = f"Host: 127.0.0.1:{live.port}\r\n".encode()
    raw = b"GET /healthz HTTP/1.1\r\n" + host + b"\r\n"
    raw += b"GET /v1/jobs/no-such-job HTTP/1.1\r\n" + host + b"\r\n"
    raw += b"GET /healthz HTTP/1.1\r\n" + host + b"Connection: close\r\n\r\n"
    with contextlib.closing(live.connect()) as sock:
        sock.sendall(raw)
        data = read_until_closed(sock, CLOSE_WITHIN_S + 5)
    # Each answer's status line follows the last one's body directly.
    assert [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", data)] == [200, 404, 200]
