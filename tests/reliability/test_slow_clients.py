"""Slow, greedy and vanishing clients against the daemon's real listener, on both backends.

- `server.read_timeout_s = 2`: half-sent headers, drip-fed headers and a half-sent body
  are answered 408 and closed within a few seconds, while others keep being served;
- an idle keep-alive connection is closed after `server.keepalive_timeout_s`;
- beyond `server.max_connections`, a new connection is answered 503 at once;
- a client that hangs up mid-body is `client_disconnected` at info: no error-level
  line, no 5xx in the access log or the metrics;
- a broken gzip, deflate or chunked body is 400 C01; parser errors are problem+json
  that never echo the request; CONNECT is 405; `Server:` carries no version.
"""

from __future__ import annotations

import socket
import time
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from outboxd.config import Settings
from tests.reliability.harness import raw_post
from tests.support.live_api import LiveApi, parse_response, read_until_closed

READ_TIMEOUT_S = 2.0
# Generous: the machine is shared; "closed within a few seconds" is what is asserted.
CLOSE_WITHIN_S = READ_TIMEOUT_S + 6.0


@pytest.fixture
def make_live(
    db_url: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> Iterator[Callable[..., LiveApi]]:
    made: list[LiveApi] = []

    def factory(**server: float) -> LiveApi:
        settings = make_settings(
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
        made.append(LiveApi(db_url, settings, tmp_path))
        return made[-1]

    yield factory
    for api in made:
        api.close()


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


def test_half_sent_headers_are_closed_and_others_are_served(live: LiveApi) -> None:
    with live.connect() as slow:
        slow.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        time.sleep(0.5)
        _healthy(live)  # the daemon keeps answering while one client stalls
        elapsed, data = _closed_after(slow)
    assert elapsed < CLOSE_WITHIN_S
    _assert_408(data)
    _healthy(live)


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


def test_a_half_sent_body_is_closed(live: LiveApi) -> None:
    before = live.counts()
    with live.connect() as slow:
        slow.sendall(
            b"POST /v1/websites HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 200\r\n\r\n"
            b'{"domain": "exa'
        )
        elapsed, data = _closed_after(slow)
    assert elapsed < CLOSE_WITHIN_S
    _assert_408(data)
    assert live.counts() == before
    _healthy(live)


def test_a_fast_request_on_a_reused_connection_gets_a_fresh_deadline(live: LiveApi) -> None:
    """The deadline is per request: a keep-alive connection used slowly but steadily lives."""
    with live.connect() as sock:
        for _ in range(3):
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            got = b""
            while b'"ok"' not in got:
                chunk = sock.recv(65536)
                assert chunk, "closed a connection that sent whole requests"
                got += chunk
            assert got.startswith(b"HTTP/1.1 200")
            time.sleep(READ_TIMEOUT_S * 0.75)


def test_an_idle_keep_alive_connection_is_closed(make_live: Callable[..., LiveApi]) -> None:
    live = make_live(keepalive_timeout_s=3.0)
    with live.connect() as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        elapsed, data = _closed_after(sock)
    assert data.startswith(b"HTTP/1.1 200")
    assert elapsed < 3.0 + 6.0


def test_connections_beyond_the_cap_are_answered_503_at_once(live: LiveApi) -> None:
    held = [live.connect() for _ in range(8)]
    try:
        # Each held connection has been accepted once it answers a request.
        for sock in held:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
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
    deadline = time.monotonic() + 20
    while True:  # the slots come back once the held connections are gone
        try:
            _healthy(live)
            break
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_client_hanging_up_mid_body_is_not_a_server_error(live: LiveApi) -> None:
    with live.connect() as sock:
        sock.sendall(
            b"POST /v1/websites HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
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
        b"POST /v1/websites HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
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
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"s3cr3t" * 2000 + b"\r\n\r\n",
        b"G\x01T /healthz HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /heal\x7fthz\x00s3cr3t HTTP/1.1\r\nHost: x\r\n\r\n",
        b"GET /healthz HTTP/1.1\r\nHost: x\r\nBad Header s3cr3t\r\n\r\n",
        b"s3cr3t\r\n\r\n",
    ],
    ids=["header-over-8k", "method-bytes", "url-bytes", "header-syntax", "not-http"],
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
