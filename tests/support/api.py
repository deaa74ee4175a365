"""Speaking to the in-process API: the headers of an intake, the one check of an error
answer (RFC 9457 problem+json with the daemon's fields), and every page of a listing."""

from __future__ import annotations

import json
from typing import Any

from aiohttp.test_utils import TestClient

from outboxd.security import hash_token

PROBLEM_FIELDS = {"type", "title", "status", "detail", "code", "requestId"}

# Three callers for `auth.tokens`: alice and bob (users) and root (the admin).
ALICE, BOB, ADMIN = "tok-alice-" + "a" * 20, "tok-bob-" + "b" * 20, "tok-admin-" + "c" * 20
TOKENS = [
    {"sha256": hash_token(ALICE), "user": "alice", "role": "user"},
    {"sha256": hash_token(BOB), "user": "bob", "role": "user"},
    {"sha256": hash_token(ADMIN), "user": "root", "role": "admin"},
]


def bearer(token: str, **extra: str) -> dict[str, str]:
    """Headers that authenticate with `token` (and `extra` ones)."""
    return {"Authorization": f"Bearer {token}", **extra}


def keyed(key: str, name: str, value: str | None) -> dict[str, str]:
    """Headers with Idempotency-Key `key` and `name: value`, that one left out when `value`
    is None (the case of a parametrized header that sends none)."""
    headers = {"Idempotency-Key": key}
    if value is not None:
        headers[name] = value
    return headers


async def assert_problem(resp: Any, status: int, code: str) -> dict[str, Any]:
    """`resp` (an aiohttp response) is a `status` problem with `code`; its body."""
    text = await resp.text()
    assert resp.status == status, text
    assert resp.content_type == "application/problem+json", resp.content_type
    body: dict[str, Any] = json.loads(text)
    assert set(body) >= PROBLEM_FIELDS, body
    assert body["status"] == status
    assert body["code"] == code, body
    assert body["type"].startswith("urn:outboxd:problem:")
    assert body["title"] and body["detail"]
    assert body["requestId"] == resp.headers["X-Request-Id"]
    return body


async def walk(
    api: TestClient[Any, Any], path: str, limit: int, **query: str
) -> list[list[dict[str, Any]]]:
    """Every page of a keyset-paginated listing."""
    pages: list[list[dict[str, Any]]] = []
    cursor: str | None = None
    while True:
        params = {"limit": str(limit), **query}
        if cursor is not None:
            params["cursor"] = cursor
        resp = await api.get(path, params=params)
        assert resp.status == 200, await resp.text()
        body = await resp.json()
        pages.append(body["items"])
        cursor = body["nextCursor"]
        if cursor is None:
            return pages
        assert len(pages) < 100, "pagination does not end"
