"""Bad input: a hypothesis property test of the HTTP API, on both backends.

Requests are written byte by byte on a raw socket to the API served in-process, so
anything goes: arbitrary JSON (and not-JSON), any method and route, Idempotency-Key
values (missing, empty, reused, too long, not ASCII), content types, Authorization
headers, encodings (UTF-8, UTF-16, Latin-1, invalid bytes) and sizes (over
`server.max_body_bytes`).

Properties, per request: no 5xx; an error answered by the API is problem+json with its
code; a rejected request stores nothing (row counts of every table before and after);
an accepted one stores whole things (each job with its outbox row, each website with
its work row).

Two classes of input that once found bugs have tests of their own below: JSON strings
holding lone UTF-16 surrogate escapes (`"\\ud800"`, now 400 C01), and an Authorization
header that is not UTF-8 (now 401 C02).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestServer
from hypothesis import given
from hypothesis import strategies as st

from outboxd.config import Settings
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore, open_store
from tests.reliability.harness import raw_post, raw_request_settings
from tests.support.db import raw_counts
from tests.support.live_api import RawResponse, parse_response

USER_TOKEN = "tok-user-7f3a"
ADMIN_TOKEN = "tok-admin-91c2"
MAX_BODY = 4096
EXAMPLES = int(os.environ.get("OUTBOXD_API_EXAMPLES", "400"))


class InProcessApi:
    """The API on a loop of its own, spoken to with raw bytes."""

    def __init__(self, db_url: str, settings: Settings, tmp_path: Path) -> None:
        self.runner = asyncio.Runner()
        self.db_url = db_url
        self.store: SqlStore = self.runner.run(open_store(db_url, tmp_path, 5, 2.0))
        self.runner.run(self.store.db.migrate())
        deps = build_api_deps(
            settings, self.store, KeyRing([os.urandom(32)]), Metrics(), None, None
        )

        async def start() -> TestServer:
            server = TestServer(create_app(deps), host="127.0.0.1")
            await server.start_server()
            return server

        self.server = self.runner.run(start())
        self.port = self.server.port

    def send(self, raw: bytes) -> RawResponse:
        async def go() -> bytes:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            try:
                writer.write(raw)
                await writer.drain()
                return await asyncio.wait_for(reader.read(), 10)
            finally:
                writer.close()

        return parse_response(self.runner.run(asyncio.wait_for(go(), 15)))

    def counts(self) -> dict[str, int]:
        """Rows per table, read with a driver of our own."""
        return self.runner.run(raw_counts(self.db_url))

    def close(self) -> None:
        try:
            self.runner.run(self.server.close())
            self.runner.run(self.store.close())
        finally:
            self.runner.close()


@pytest.fixture
def live_api(
    db_url: str, make_settings: Callable[..., Settings], tmp_path: Path
) -> Iterator[InProcessApi]:
    settings = make_settings(
        server={"max_body_bytes": MAX_BODY},
        auth={
            "tokens": [
                {"sha256": hashlib.sha256(USER_TOKEN.encode()).hexdigest(), "user": "alice"},
                {
                    "sha256": hashlib.sha256(ADMIN_TOKEN.encode()).hexdigest(),
                    "user": "root",
                    "role": "admin",
                },
            ]
        },
        logging={"level": "error"},
    )
    api = InProcessApi(db_url, settings, tmp_path)
    try:
        yield api
    finally:
        api.close()


# ------------------------------------------------------------------ strategies

header_text = st.text(
    alphabet=st.characters(min_codepoint=0x20, blacklist_categories=("Cs", "Cc")), max_size=80
)
# Any bytes a header value can carry on the wire (no CR, LF or NUL).
header_bytes = st.binary(max_size=80).map(
    lambda b: b.replace(b"\r", b"").replace(b"\n", b"").replace(b"\x00", b"")
)
json_scalars = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text()
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
domainish = st.one_of(
    st.from_regex(r"[a-z0-9-]{1,20}(\.[a-z0-9-]{1,20}){1,3}\.?", fullmatch=True),
    st.text(max_size=40),
    st.sampled_from(
        [
            "Example.COM.",
            "http://a.com/x",
            "a.com:80",
            "127.0.0.1",
            "xn--80ak6aa92e.com",
            "münchen.de",
            "a..b",
            "-a.com",
            "a" * 64 + ".com",
            "例え.テスト",
            "",
        ]
    ),
)


def _field_mix(
    valid: dict[str, st.SearchStrategy[Any]], fuzzed: dict[str, st.SearchStrategy[Any]]
) -> st.SearchStrategy[dict[str, Any]]:
    """Often a valid body; else the fields with fuzzed values, some missing or extra."""
    mixed = st.fixed_dictionaries(
        {}, optional={**{k: v | json_values for k, v in fuzzed.items()}, "extra": json_values}
    )
    return st.one_of(st.fixed_dictionaries(valid), st.fixed_dictionaries(fuzzed), mixed)


printable = st.text(
    alphabet=st.characters(blacklist_categories=("Cs", "Cc")), min_size=1, max_size=40
)
valid_domain = st.from_regex(
    r"[a-z][a-z0-9-]{0,15}[a-z0-9](\.[a-z][a-z0-9]{0,10}){1,2}", fullmatch=True
)
job_body = _field_mix(
    {"portal": st.just("suwon"), "username": printable, "password": printable},
    {
        "portal": st.sampled_from(["suwon", "SUWON", "other", ""]),
        "username": st.text(max_size=70),
        "password": st.text(max_size=260),
    },
)
website_body = _field_mix(
    {"domain": valid_domain, "faviconUrl": st.none() | printable.map("https://x.example/".__add__)},
    {"domain": domainish, "faviconUrl": st.none() | st.text()},
)
task_body = _field_mix(
    {
        "type": st.sampled_from(["noop", "outbox.prune"]),
        "payload": st.just({}),
        "dedupId": st.none() | printable,
    },
    {
        "type": st.sampled_from(["noop", "outbox.prune", "rm -rf"]),
        "payload": json_values,
        "dedupId": st.none() | st.text(max_size=140),
    },
)


@st.composite
def encoded_body(draw: st.DrawFn, route: str | None) -> bytes | None:
    by_route = {
        "/v1/portal-link-jobs": job_body,
        "/v1/websites": website_body,
        "/v1/admin/tasks": task_body,
    }
    kind = (
        draw(st.sampled_from(["route"] * 6 + ["any", "raw", "huge"]))
        if route
        else draw(st.sampled_from(["job", "website", "task", "any", "raw", "none", "huge"]))
    )
    if kind == "none":
        return None
    if kind == "raw":
        return draw(st.binary(max_size=200))
    if kind == "huge":
        return json.dumps({"domain": "a.com", "faviconUrl": "https://x/" + "a" * MAX_BODY}).encode()
    strategy = {
        "route": by_route.get(route or "", json_values),
        "job": job_body,
        "website": website_body,
        "task": task_body,
        "any": json_values,
    }[kind]
    text = json.dumps(draw(strategy), ensure_ascii=draw(st.booleans()))
    encoding = draw(st.sampled_from(["utf-8"] * 6 + ["utf-16", "latin-1", "utf-8-sig"]))
    return text.encode(encoding, errors="replace")


@st.composite
def requests(draw: st.DrawFn) -> tuple[str, bytes]:
    """Half the time a well-formed envelope (a route's method, a valid token, JSON, a
    key) around a fuzzed body, so validation and storage are reached; else anything."""
    well_formed = draw(st.booleans())
    route = draw(st.sampled_from(["/v1/portal-link-jobs", "/v1/websites", "/v1/admin/tasks"]))
    if well_formed:
        method, path = "POST", route
    else:
        method = draw(st.sampled_from(["POST", "POST", "POST", "GET", "PUT", "DELETE", "PATCH"]))
        path = draw(
            st.sampled_from(
                [
                    route,
                    "/v1/websites/example.com",
                    "/v1/jobs/00000000-0000-0000-0000-000000000000",
                    "/v1/admin/outbox?status=DEAD&limit=5",
                    "/v1/admin/outbox/xyz/redrive",
                    "/v1/admin/jobs/xyz/redrive",
                    "/v1/admin/stats",
                    "/v1/admin/tasks?limit=0",
                    "/v1/nope",
                ]
            )
        )
    headers: list[tuple[bytes, bytes]] = []
    tokens = st.sampled_from([f"Bearer {USER_TOKEN}", f"Bearer {ADMIN_TOKEN}"])
    if well_formed and route == "/v1/admin/tasks":
        tokens = st.just(f"Bearer {ADMIN_TOKEN}")
    auth = draw(
        tokens
        if well_formed
        else st.one_of(
            st.none(),
            tokens,
            st.sampled_from(
                [
                    "Bearer wrong",
                    "Bearer ",
                    "Basic YWxpY2U6cHc=",
                    f"bearer {USER_TOKEN}",
                    USER_TOKEN,
                ]
            ),
            header_text.map("Bearer ".__add__),
            header_text,
        )
    )
    if auth is not None:
        headers.append((b"Authorization", auth.encode("utf-8")))
    keys = st.one_of(
        st.sampled_from([b"k1", b"k2", b"k3", b"x" * 255]),
        st.uuids().map(lambda u: str(u).encode()),
    )
    key = draw(
        keys
        if well_formed
        else st.one_of(
            st.none(),
            keys,
            st.sampled_from([b"", b"x" * 256, b"a b"]),
            st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), max_size=300).map(
                str.encode
            ),
            header_bytes,
        )
    )
    if key is not None:
        headers.append((b"Idempotency-Key", key))
    json_types = st.sampled_from(
        [
            b"application/json",
            b"application/json; charset=utf-8",
            b"APPLICATION/JSON",
            b"application/problem+json",
        ]
    )
    ctype = draw(
        json_types
        if well_formed
        else st.one_of(
            st.none(),
            json_types,
            st.sampled_from(
                [
                    b"text/plain",
                    b"application/x-www-form-urlencoded",
                    b"multipart/form-data; boundary=x",
                    b"application/json; charset=latin-1",
                ]
            ),
            header_bytes,
        )
    )
    if ctype is not None:
        headers.append((b"Content-Type", ctype))
    if draw(st.booleans()):
        request_ids = st.sampled_from([b"req-1", b"a" * 200]) | header_bytes
        headers.append((b"X-Request-Id", draw(st.just(b"req-ok") if well_formed else request_ids)))
    body = draw(encoded_body(route if well_formed else None))
    lines = [f"{method} {path} HTTP/1.1".encode(), b"Host: 127.0.0.1"]
    lines += [k + b": " + v for k, v in headers]
    if body is not None:
        lines.append(b"Content-Length: " + str(len(body)).encode())
    lines.append(b"Connection: close")
    raw = b"\r\n".join(lines) + b"\r\n\r\n" + (body or b"")
    return method, raw


# ------------------------------------------------------------------ the property


def _check(api: InProcessApi, raw: bytes, parser_rejections: list[int]) -> None:
    before = api.counts()
    resp = api.send(raw)
    after = api.counts()
    assert resp.status < 500, (resp.status, resp.body[:300], raw[:300])
    if resp.status >= 400:
        assert after == before, f"a rejected request ({resp.status}) stored something"
        if "x-request-id" in resp.headers:  # answered by the API, not the HTTP parser
            assert resp.headers.get("content-type", "").startswith("application/problem+json")
            problem = json.loads(resp.body)
            assert problem["status"] == resp.status and problem["code"].startswith("C")
        else:
            parser_rejections.append(resp.status)
    # Whatever was accepted is whole: a job with its outbox row, a website with its work.
    assert after["relay_outbox"] - before["relay_outbox"] >= after["jobs"] - before["jobs"]
    assert after["websites"] - before["websites"] == after["work_outbox"] - before["work_outbox"]


@pytest.mark.timeout(120)
def test_no_input_makes_the_api_fail_or_store_half(live_api: InProcessApi) -> None:
    parser_rejections: list[int] = []

    @raw_request_settings(EXAMPLES)
    @given(req=requests())
    def prop(req: tuple[str, bytes]) -> None:
        _check(live_api, req[1], parser_rejections)

    prop()
    counts = live_api.counts()
    print(
        f"\napi properties: {EXAMPLES} requests, rows stored {counts}, "
        f"{len(parser_rejections)} rejected by the HTTP parser"
    )
    # The generator does reach the happy paths, so "nothing stored" was not vacuous.
    assert counts["jobs"] > 0 and counts["websites"] > 0


# ------------------------------------------------------------------ bugs found


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/portal-link-jobs", rb'{"portal":"suwon","username":"a\ud800","password":"p"}'),
        ("/v1/portal-link-jobs", rb'{"portal":"suwon","username":"u","password":"\udfff"}'),
        ("/v1/websites", rb'{"domain":"a.example","faviconUrl":"https://x/\ud800"}'),
        ("/v1/admin/tasks", rb'{"type":"noop","payload":{"k":"\ud800"}}'),
        ("/v1/admin/tasks", rb'{"type":"noop","dedupId":"\ud800"}'),
    ],
    ids=["username", "password", "faviconUrl", "task-payload", "dedupId"],
)
def test_a_lone_surrogate_escape_is_a_validation_error(
    live_api: InProcessApi, path: str, body: bytes
) -> None:
    before = live_api.counts()
    resp = live_api.send(
        raw_post(
            path,
            body,
            b"Authorization: Bearer "
            + ADMIN_TOKEN.encode()
            + b"\r\n"
            + b"Idempotency-Key: surrogate-1\r\n",
        )
    )
    assert live_api.counts() == before
    assert resp.status == 400, (resp.status, resp.body[:200])
    assert json.loads(resp.body)["code"] == "C01"


@pytest.mark.parametrize("token", [b"\xff\xfe", b"tok-\xe9"], ids=["binary", "latin-1"])
def test_a_bearer_token_that_is_not_utf8_is_unauthenticated(
    live_api: InProcessApi, token: bytes
) -> None:
    body = b'{"portal":"suwon","username":"u","password":"p"}'
    resp = live_api.send(
        raw_post(
            "/v1/portal-link-jobs",
            body,
            b"Authorization: Bearer " + token + b"\r\nIdempotency-Key: tok-1\r\n",
        )
    )
    assert resp.status == 401, (resp.status, resp.body[:200])
    assert json.loads(resp.body)["code"] == "C02"
    assert live_api.counts()["jobs"] == 0
