"""Hostile bytes on every route's path, query, headers and body: never a 5xx, always
problem+json, nothing stored for a rejected request. Both backends.

The requests go to the daemon's real listener (tests/support/live_api.py), so what
aiohttp's parser refuses is answered the way production answers it. The atoms are
what once reached a 500 or the database: NUL and other control characters, lone
surrogates (as JSON escapes and as raw bytes), digits `int()` refuses (`²`), integers
past Python's 4,300-digit limit, `1e999`, NaN and Infinity, deep nesting, forged
cursors made of those, broken gzip/deflate bodies and doubled Authorization headers.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import urllib.parse
from collections.abc import Callable

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.reliability.harness import raw_request_settings
from tests.support.live_api import LiveApi

ADMIN_TOKEN = "tok-admin-hostile"
USER_TOKEN = "tok-user-hostile"
EXAMPLES = int(os.environ.get("OUTBOXD_HOSTILE_EXAMPLES", "200"))


@pytest.fixture
def live(make_live_api: Callable[..., LiveApi]) -> LiveApi:
    def entry(token: str, user: str, role: str) -> dict[str, str]:
        return {"sha256": hashlib.sha256(token.encode()).hexdigest(), "user": user, "role": role}

    return make_live_api(
        server={"max_body_bytes": 16384, "read_timeout_s": 10.0},
        auth={"tokens": [entry(USER_TOKEN, "alice", "user"), entry(ADMIN_TOKEN, "root", "admin")]},
    )


# ------------------------------------------------------------------ atoms

HOSTILE_TEXT = [
    "\x00",
    "a\x00b",
    "\x01",
    "\x1b[31m",
    "\x7f",
    "\x85",
    "\ud800",
    "a\udfffb",
    "²",
    "٣",
    "１",
    "9" * 5000,
    "-1",
    "1e999",
    "NaN",
    "Infinity",
    "",
    " ",
    "../../etc/passwd",
    "%00",
    "é" * 300,
    "\u202e",
    "\ufeff",
]
hostile_text = (
    st.sampled_from(HOSTILE_TEXT)
    | st.text(max_size=40)
    | st.text(st.characters(min_codepoint=0, max_codepoint=0x10FFFF), max_size=20)
)

HOSTILE_JSON = [
    "NaN",
    "Infinity",
    "-Infinity",
    "1e999",
    "-1e999",
    "1" * 5000,
    "-" + "9" * 4301,
    "[" * 3000 + "]" * 3000,
    '{"a":' * 200 + "1" + "}" * 200,
    '"\\ud800"',
    '"a\\udfffb"',
    '"\\u0000"',
    '"a\\u0000b"',
    '{"\\u0000": 1}',
    '{"\\ud800": 1}',
    '"\\u001b"',
    "1.7976931348623157e309",
    "-0",
    "0.5",
    "null",
    "true",
    "[]",
    "{}",
]
hostile_json = st.sampled_from(HOSTILE_JSON) | st.text(max_size=30).map(json.dumps)


def _pct(text: str) -> str:
    """Any text (lone surrogates too) as percent-encoded UTF-8 bytes."""
    return urllib.parse.quote(text.encode("utf-8", "surrogatepass"), safe="")


raw_pct = st.binary(max_size=12).map(lambda b: urllib.parse.quote(b, safe=""))
path_segment = hostile_text.map(_pct) | raw_pct | st.just("00000000-0000-0000-0000-000000000000")


def _cursor(raw: str) -> str:
    return base64.urlsafe_b64encode(raw.encode("utf-8", "surrogatepass")).decode().rstrip("=")


forged_cursor = st.one_of(
    st.sampled_from(
        [
            _cursor('[1e999,"x"]'),
            _cursor('[NaN,"x"]'),
            _cursor("[" + "1" * 5000 + ',"x"]'),
            _cursor("[" * 5000 + "]" * 5000),
            _cursor('[1,"\\ud800"]'),
            _cursor('[1,"a\\u0000b"]'),
            _cursor('[1,["x"]]'),
            _cursor('[true,"x"]'),
            _cursor('[1,"x",3]'),
            _cursor("\udcff"),
            "!!!",
            "a" * 5000,
        ]
    ),
    hostile_json.map(lambda j: _cursor(f'[{j},"x"]')),
    hostile_json.map(lambda j: _cursor(f"[1,{j}]")),
    hostile_text.map(_pct),
)
query_value = hostile_text.map(_pct) | raw_pct | forged_cursor


@st.composite
def query(draw: st.DrawFn, names: list[str]) -> str:
    parts = []
    for name in draw(st.lists(st.sampled_from([*names, "x\x00", "limit", "cursor"]), max_size=4)):
        value = draw(forged_cursor if name == "cursor" else query_value)
        parts.append(f"{_pct(name)}={value}")
    return "?" + "&".join(parts) if parts else ""


BODIES = {
    "/v1/portal-link-jobs": (
        {"portal": '"suwon"', "username": '"20201234"', "password": '"pw"'},
        ["portal", "username", "password"],
    ),
    "/v1/websites": ({"domain": '"example.com"', "faviconUrl": "null"}, ["domain", "faviconUrl"]),
    "/v1/admin/tasks": (
        {"type": '"outbox.prune"', "payload": '{"older_than_days": 3}', "dedupId": '"d-1"'},
        ["type", "payload", "dedupId"],
    ),
}


@st.composite
def json_body(draw: st.DrawFn, path: str) -> bytes:
    """A valid envelope for `path` with one or two fields made hostile (or nested in)."""
    fields, names = BODIES.get(path, BODIES["/v1/websites"])
    chosen = dict(fields)
    for name in draw(st.lists(st.sampled_from(names), min_size=1, max_size=2)):
        value = draw(hostile_json | hostile_text.map(lambda t: json.dumps(t, ensure_ascii=True)))
        if draw(st.booleans()) and name == "payload":
            value = '{"older_than_days": ' + value + "}"
        chosen[name] = value
    text = "{" + ",".join(f'"{k}":{v}' for k, v in chosen.items()) + "}"
    if draw(st.integers(0, 9)) == 0:
        text = draw(hostile_json)
    return text.encode("utf-8", "surrogatepass")


ROUTES: list[tuple[str, str, list[str]]] = [
    ("POST", "/v1/portal-link-jobs", []),
    ("GET", "/v1/jobs/{}", []),
    ("POST", "/v1/websites", []),
    ("GET", "/v1/websites/{}", []),
    ("GET", "/v1/admin/outbox", ["status", "limit", "cursor"]),
    ("POST", "/v1/admin/outbox/{}/redrive", []),
    ("POST", "/v1/admin/jobs/{}/redrive", []),
    ("GET", "/v1/admin/stats", []),
    ("POST", "/v1/admin/tasks", []),
    ("GET", "/v1/admin/tasks", ["type", "limit", "cursor"]),
    ("GET", "/healthz", []),
    ("GET", "/readyz", []),
    ("GET", "/openapi.json", []),
]

header_value = st.one_of(
    hostile_text.map(lambda t: t.encode("utf-8", "surrogatepass")),
    st.binary(max_size=60),
).map(lambda b: b.replace(b"\r", b"").replace(b"\n", b""))


@st.composite
def hostile_request(draw: st.DrawFn) -> bytes:
    method, template, names = draw(st.sampled_from(ROUTES))
    path = template.format(draw(path_segment)) if "{}" in template else template
    path += draw(query(names))
    auth = f"Bearer {ADMIN_TOKEN}".encode()
    headers: list[tuple[bytes, bytes]] = [(b"Host", b"127.0.0.1")]
    how = draw(st.sampled_from(["admin"] * 6 + ["user", "twice", "hostile", "none"]))
    if how == "admin":
        headers.append((b"Authorization", auth))
    elif how == "user":
        headers.append((b"Authorization", f"Bearer {USER_TOKEN}".encode()))
    elif how == "twice":
        headers += [(b"Authorization", auth), (b"Authorization", b"Bearer other")]
    elif how == "hostile":
        headers.append((b"Authorization", b"Bearer " + draw(header_value)))
    key = draw(st.sampled_from([b"k-1", b"k-2"]) | header_value)
    headers.append((b"Idempotency-Key", key))
    if draw(st.booleans()):
        headers.append((b"X-Request-Id", draw(header_value)))
    body = b""
    if method == "POST":
        body = draw(json_body(template))
        headers.append((b"Content-Type", b"application/json"))
        encoding = draw(st.sampled_from([None] * 6 + [b"gzip", b"deflate", b"br", b"x-nope"]))
        if encoding is not None:
            headers.append((b"Content-Encoding", encoding))
    if draw(st.integers(0, 9)) == 0:
        headers.append((draw(st.sampled_from([b"X-Hostile", b"Accept"])), draw(header_value)))
    lines = [f"{method} {path} HTTP/1.1".encode()]
    lines += [k + b": " + v for k, v in headers]
    lines += [b"Content-Length: " + str(len(body)).encode(), b"Connection: close"]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _check(live: LiveApi, raw: bytes) -> int:
    before = live.counts()
    resp = live.send(raw)
    after = live.counts()
    assert resp.status < 500, (resp.status, resp.body[:300], raw[:300])
    if resp.status >= 400:
        assert resp.headers.get("content-type", "").startswith("application/problem+json"), (
            resp.status,
            resp.headers,
            raw[:200],
        )
        problem = json.loads(resp.body)
        assert problem["status"] == resp.status and problem["code"].startswith("C")
        assert resp.headers.get("x-request-id")
        assert after == before, f"a rejected request ({resp.status}) stored something"
    assert resp.headers.get("server") == "outboxd"
    return resp.status


@pytest.mark.timeout(600)
def test_hostile_bytes_never_reach_a_5xx(live: LiveApi) -> None:
    statuses: dict[int, int] = {}

    @raw_request_settings(EXAMPLES)
    @given(raw=hostile_request())
    def prop(raw: bytes) -> None:
        status = _check(live, raw)
        statuses[status] = statuses.get(status, 0) + 1

    prop()
    print(f"\nhostile input: {EXAMPLES} requests, statuses {sorted(statuses.items())}")
    assert any(s >= 400 for s in statuses)
    errors = [e for e in live.events() if e.get("level") in ("error", "critical")]
    assert errors == [], errors[:3]


# ------------------------------------------------------------------ the named examples

EXAMPLES_500 = [
    ("POST", "/v1/websites", b'{"domain": ' + b"1" * 5000 + b"}"),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": {"n": ' + b"1" * 5000 + b"}}"),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": {"n": NaN}}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": {"n": Infinity}}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": {"n": 1e999}}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": {"n": "a\\u0000b"}}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": {"\\u0000": 1}}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "payload": ' + b'{"a":' * 40 + b"1" + b"}" * 41),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "dedupId": "has space"}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "dedupId": "caf\\u00e9"}'),
    ("POST", "/v1/admin/tasks", b'{"type": "noop", "dedupId": "' + b"d" * 129 + b'"}'),
    ("GET", "/v1/admin/tasks?type=a%00b", b""),
    ("GET", "/v1/admin/outbox?status=a%00b", b""),
    ("GET", "/v1/admin/outbox?limit=%C2%B2", b""),
    ("GET", "/v1/admin/tasks?limit=%D9%A3", b""),
    ("GET", "/v1/admin/tasks?cursor=" + _cursor("[" + "1" * 400 + ',"x"]'), b""),
    ("GET", "/v1/admin/tasks?cursor=" + _cursor('[1e999,"x"]'), b""),
    ("GET", "/v1/admin/tasks?cursor=" + _cursor("[" * 3000), b""),
    ("GET", "/v1/admin/outbox?cursor=" + _cursor('[1,"\\ud800"]'), b""),
    ("GET", "/v1/admin/outbox?cursor=" + _cursor('[1,"a\\u0000"]'), b""),
]


@pytest.mark.parametrize(("method", "path", "body"), EXAMPLES_500)
def test_each_input_that_once_reached_a_500_is_400_c01(
    live: LiveApi, method: str, path: str, body: bytes
) -> None:
    raw = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    before = live.counts()
    resp = live.send(raw)
    assert resp.status == 400, (resp.status, resp.body[:300])
    assert resp.json()["code"] == "C01"
    assert live.counts() == before


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/jobs/a%00b"),
        ("GET", "/v1/jobs/a%01b"),
        ("GET", "/v1/jobs/" + "a" * 129),
        ("POST", "/v1/admin/jobs/a%00b/redrive"),
        ("GET", "/v1/admin/jobs/%00"),
        ("GET", "/v1/admin/jobs/a%00b"),
        ("GET", "/v1/admin/jobs/%E2%80%AE"),
        ("POST", "/v1/admin/websites/a%00b.com/retry"),
        ("POST", "/v1/admin/outbox/a%00b/redrive"),
        ("GET", "/v1/websites/a%00b.com"),
        ("GET", "/v1/jobs/%ED%A0%80"),
        ("GET", "/v1/websites/%ED%A0%80.com"),
        ("GET", "/v1/jobs/%FF%FE"),
    ],
)
def test_a_path_id_no_row_can_have_is_not_found(live: LiveApi, method: str, path: str) -> None:
    """NUL, control characters, bidirectional controls, over-long ids and bytes that are
    not UTF-8 name nothing: 404 C04 (on Postgres a NUL used to reach the driver and answer
    500, on the admin routes too)."""
    raw = (
        f"{method} {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
        "Content-Length: 0\r\nConnection: close\r\n\r\n"
    ).encode()
    resp = live.send(raw)
    assert resp.status == 404, (resp.status, resp.body[:300])
    assert resp.json()["code"] == "C04"


def test_two_authorization_headers_are_refused(live: LiveApi) -> None:
    resp = live.get(
        "/v1/admin/stats",
        f"Authorization: Bearer {ADMIN_TOKEN}\r\nAuthorization: Bearer nope\r\n".encode(),
    )
    assert resp.status in (400, 401), resp
    assert resp.headers["content-type"].startswith("application/problem+json")
    one = live.get("/v1/admin/stats", f"Authorization: Bearer {ADMIN_TOKEN}\r\n".encode())
    assert one.status == 200


def test_a_valid_sqs_dedup_id_is_accepted(live: LiveApi) -> None:
    dedup = "A-z_0.9:!\"#$%&'()*+,/;<=>?@[\\]^`{|}~"
    body = json.dumps({"type": "noop", "dedupId": dedup}).encode()
    resp = live.send(
        (
            f"POST /v1/admin/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        ).encode()
        + body
    )
    assert resp.status == 202, resp
