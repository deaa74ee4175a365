"""Held requests cannot starve the door: one user holding every `Prefer: wait` it may leaves
other users, /healthz and /readyz answering as usual, on the daemon's real listener
(tests/support/live_api.py: its connection cap, a pool of 5 database connections) on both
backends.

Each held request keeps its HTTP connection (never a database one), so the bounds are
`api.max_waiters_per_user` (one user's share) and `api.max_waiters`, which stays below
`server.max_connections` with room to spare (written, or derived from it when not:
docs/decisions/0030-per-user-bounds.md). Before them, one user's held requests took every
connection and everyone else was answered `503 C09`.
"""

from __future__ import annotations

import hashlib
import json
import socket
from collections.abc import Callable, Iterator

import pytest

from tests.support.live_api import LiveApi, RawResponse, parse_response, read_until_closed
from tests.support.waits import eventually_sync

ALICE, BOB = "tok-alice-door-" + "a" * 20, "tok-bob-door-" + "b" * 20
LINK = json.dumps({"portal": "suwon", "username": "20201234", "password": "pw-door"}).encode()
# Prompt: an answer that is not held comes within this (generous on a busy machine; a held
# one would take its wait of 60 s).
PROMPT_S = 15.0


def _entry(token: str, user: str) -> dict[str, str]:
    return {"sha256": hashlib.sha256(token.encode()).hexdigest(), "user": user, "role": "user"}


TOKENS = {"tokens": [_entry(ALICE, "alice"), _entry(BOB, "bob")]}


def _request(
    method: str, path: str, token: str | None, extra: str = "", body: bytes = b""
) -> bytes:
    head = f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n"
    if token is not None:
        head += f"Authorization: Bearer {token}\r\n"
    if body:
        head += f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
    return (head + extra + "Connection: close\r\n\r\n").encode() + body


def _ask(live: LiveApi, raw: bytes) -> RawResponse:
    """One request on a connection of its own, answered within PROMPT_S."""
    with live.connect(PROMPT_S) as sock:
        sock.sendall(raw)
        return parse_response(read_until_closed(sock, PROMPT_S))


def _new_job(live: LiveApi, token: str, key: str) -> tuple[str, str]:
    """A job through the API: its id and its ETag."""
    made = _ask(
        live, _request("POST", "/v1/portal-link-jobs", token, f"Idempotency-Key: {key}\r\n", LINK)
    )
    assert made.status == 202, made
    job_id = json.loads(made.body)["jobId"]
    got = _ask(live, _request("GET", f"/v1/jobs/{job_id}", token))
    assert got.status == 200, got
    return job_id, got.headers["etag"]


def _wait(job_id: str, etag: str, token: str, seconds: int = 60) -> bytes:
    return _request(
        "GET", f"/v1/jobs/{job_id}", token, f"Prefer: wait={seconds}\r\nIf-None-Match: {etag}\r\n"
    )


@pytest.fixture
def holds() -> Iterator[list[socket.socket]]:
    """Connections whose requests are held: closed at the end."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def _hold(live: LiveApi, holds: list[socket.socket], raw: bytes, n: int) -> None:
    """`n` connections, each sending `raw` and never reading; returns once `n` more are held."""
    before = live.waits.held
    for _ in range(n):
        sock = live.connect(PROMPT_S)
        sock.sendall(raw)
        holds.append(sock)
    eventually_sync(lambda: live.waits.held >= before + n, 20, what=f"{before + n} held requests")


def _door_is_open(live: LiveApi, bob_waits: bool) -> None:
    """Another user's POST, GET and own wait, /healthz and /readyz: answered as usual. Bob's
    wait is applied (`bob_waits`: his share is his own, and api.max_waiters not reached) or
    answered at once without Preference-Applied; unchanged either way (304)."""
    job_id, etag = _new_job(live, BOB, "bob-1")
    assert _ask(live, _request("GET", f"/v1/jobs/{job_id}", BOB)).status == 200
    bobs = _ask(live, _wait(job_id, etag, BOB, 1))
    applied = "wait=1" if bob_waits else None
    assert (bobs.status, bobs.headers.get("preference-applied")) == (304, applied), bobs
    health = _ask(live, _request("GET", "/healthz", None))
    assert health.status == 200, health
    ready = _ask(live, _request("GET", "/readyz", None))
    assert ready.status == 200 and json.loads(ready.body)["status"] == "ok", ready


def test_one_user_holding_its_share_leaves_the_door_open(
    make_live_api: Callable[..., LiveApi], holds: list[socket.socket]
) -> None:
    """api.max_waiters_per_user = 20: alice's 21st wait is answered at once without
    Preference-Applied, while her 20 are held; bob, /healthz and /readyz answer as usual
    (20 held requests, 5 database connections: none holds one)."""
    live = make_live_api(
        auth=TOKENS,
        api={"max_waiters_per_user": 20},
        server={"max_connections": 64},
    )
    job_id, etag = _new_job(live, ALICE, "alice-1")
    _hold(live, holds, _wait(job_id, etag, ALICE), 20)
    assert live.waits.held_by("alice") == 20
    extra = _ask(live, _wait(job_id, etag, ALICE))
    assert extra.status == 304 and "preference-applied" not in extra.headers, extra
    _door_is_open(live, bob_waits=True)
    assert live.waits.held_by("alice") == 20  # still held, all along


def test_held_requests_never_take_every_connection(
    make_live_api: Callable[..., LiveApi], holds: list[socket.socket]
) -> None:
    """Only server.max_connections written (40): api.max_waiters follows it (30, three
    quarters), so one user sending 40 waits has 30 held and 10 answered at once, and the
    door stays open. (With the old default of 10,000 all 40 were held, and every other
    caller, /healthz included, was answered 503 C09.)"""
    live = make_live_api(auth=TOKENS, server={"max_connections": 40})
    assert live.waits.max_waiters == 30
    job_id, etag = _new_job(live, ALICE, "alice-1")
    _hold(live, holds, _wait(job_id, etag, ALICE), 30)
    for _ in range(10):
        extra = _ask(live, _wait(job_id, etag, ALICE))
        assert extra.status == 304 and "preference-applied" not in extra.headers, extra
    _door_is_open(live, bob_waits=False)
    assert live.waits.held == 30


def test_a_user_sending_two_hundred_waits_on_kept_alive_connections(
    make_live_api: Callable[..., LiveApi], holds: list[socket.socket]
) -> None:
    """The hostile case as found: server.max_connections = 200 and one user sending 200
    waits, each on a keep-alive connection it never reads. 100 are held (the user's share);
    the other 100 are answered at once without Preference-Applied and their connections
    closed by the daemon, so the user cannot keep them open and fill the listener."""
    live = make_live_api(auth=TOKENS, server={"max_connections": 200})
    job_id, etag = _new_job(live, ALICE, "alice-1")
    kept_alive = _wait(job_id, etag, ALICE).replace(b"Connection: close\r\n", b"")
    _hold(live, holds, kept_alive, 100)
    for _ in range(100):
        with live.connect(PROMPT_S) as sock:
            sock.sendall(kept_alive)
            # The daemon closes it after the answer (else this times out).
            extra = parse_response(read_until_closed(sock, PROMPT_S))
        assert extra.status == 304 and "preference-applied" not in extra.headers, extra
        assert extra.headers.get("connection") == "close", extra
    _door_is_open(live, bob_waits=True)
    assert live.waits.held_by("alice") == 100
