"""`POST /v1/websites` and `GET /v1/websites/{domain}` on both backends (docs/contract.md#websites).

Registration is the work outbox's transaction boundary: a new website and its one
PENDING work row commit together; an existing one (in any spelling) is returned as is.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing, hash_token
from outboxd.storage.store import SqlStore
from tests.conftest import SettingsFactory
from tests.support.api import assert_problem
from tests.support.db import raw_count, raw_scalar

Client = TestClient[Any, Any]


async def counts(db_url: str) -> tuple[int, int]:
    websites = int(await raw_scalar(db_url, "SELECT COUNT(*) AS n FROM websites"))
    work = int(await raw_scalar(db_url, "SELECT COUNT(*) AS n FROM work_outbox"))
    return websites, work


async def rejected_fields(api: Client, payload: Any) -> list[str]:
    """POST `payload`: a 400 C01 problem; the fields it names."""
    resp = await api.post("/v1/websites", json=payload)
    body = await assert_problem(resp, 400, "C01")
    return [e["field"] for e in body["errors"]]


async def test_new_website_is_201_with_a_pending_classification(
    api: Client, store: SqlStore, db_url: str
) -> None:
    resp = await api.post(
        "/v1/websites", json={"domain": "Example.COM", "faviconUrl": "https://example.com/f.ico"}
    )
    assert resp.status == 201, await resp.text()
    body = await resp.json()
    assert set(body) == {"id", "domain", "faviconUrl", "category", "classification"}
    assert isinstance(body["id"], str) and body["id"]
    assert body["domain"] == "example.com"
    assert body["faviconUrl"] == "https://example.com/f.ico"
    assert body["category"] is None
    assert body["classification"] == {"status": "PENDING", "attempts": 0, "lastError": None}
    assert await counts(db_url) == (1, 1)
    status = await raw_scalar(db_url, "SELECT status FROM work_outbox")
    assert status == "PENDING"


async def test_favicon_may_be_absent_or_null(api: Client) -> None:
    a = await api.post("/v1/websites", json={"domain": "a.example"})
    b = await api.post("/v1/websites", json={"domain": "b.example", "faviconUrl": None})
    assert (a.status, b.status) == (201, 201)
    assert (await a.json())["faviconUrl"] is None
    assert (await b.json())["faviconUrl"] is None


@pytest.mark.parametrize("spelling", ["example.com", "EXAMPLE.com", "example.com.", "Example.Com."])
async def test_same_domain_again_is_200_with_the_same_id(
    api: Client, store: SqlStore, spelling: str, db_url: str
) -> None:
    first = await api.post("/v1/websites", json={"domain": "example.com"})
    assert first.status == 201
    again = await api.post("/v1/websites", json={"domain": spelling})
    assert again.status == 200, await again.text()
    one, two = await first.json(), await again.json()
    assert two["id"] == one["id"]
    assert two["domain"] == "example.com"
    assert two["classification"] == {"status": "PENDING", "attempts": 0, "lastError": None}
    assert await counts(db_url) == (1, 1)


async def test_idna_spellings_are_one_website(api: Client, store: SqlStore, db_url: str) -> None:
    first = await api.post("/v1/websites", json={"domain": "Bücher.example"})
    assert first.status == 201
    assert (await first.json())["domain"] == "xn--bcher-kva.example"
    again = await api.post("/v1/websites", json={"domain": "xn--bcher-kva.example."})
    assert again.status == 200
    assert (await again.json())["id"] == (await first.json())["id"]
    assert await counts(db_url) == (1, 1)


@pytest.mark.parametrize(
    "domain",
    [
        "https://example.com",
        "example.com/path",
        "example.com:8080",
        "127.0.0.1",
        "::1",
        "a..b",
        "a" * 64 + ".com",
        "",
        "example.com..",
        "user@example.com",
    ],
)
async def test_invalid_domain_is_400_c01_naming_domain_and_stores_nothing(
    api: Client, store: SqlStore, domain: str, db_url: str
) -> None:
    resp = await api.post("/v1/websites", json={"domain": domain})
    body = await assert_problem(resp, 400, "C01")
    assert [e["field"] for e in body["errors"]] == ["domain"]
    assert await counts(db_url) == (0, 0)


@pytest.mark.parametrize(
    "payload",
    [{}, {"domain": None}, {"domain": 42}, {"domain": ["example.com"]}],
    ids=["missing", "null", "number", "list"],
)
async def test_domain_missing_or_not_a_string_is_400(
    api: Client, store: SqlStore, payload: dict[str, Any], db_url: str
) -> None:
    assert await rejected_fields(api, payload) == ["domain"]
    assert await counts(db_url) == (0, 0)


async def test_unknown_fields_are_400(api: Client, store: SqlStore, db_url: str) -> None:
    payload = {"domain": "example.com", "category": "news"}
    assert await rejected_fields(api, payload) == ["category"]
    assert await counts(db_url) == (0, 0)


async def test_non_json_body_is_rejected(api: Client, store: SqlStore, db_url: str) -> None:
    resp = await api.post("/v1/websites", data="domain=example.com")
    assert resp.status in (400, 415)
    assert (await resp.json())["code"] == "C01"
    assert await counts(db_url) == (0, 0)


async def test_get_returns_the_same_body_in_any_spelling(api: Client) -> None:
    created = await (await api.post("/v1/websites", json={"domain": "Bücher.example"})).json()
    for spelling in ("xn--bcher-kva.example", "XN--BCHER-KVA.example.", "bücher.example"):
        resp = await api.get(f"/v1/websites/{spelling}")
        assert resp.status == 200, spelling
        assert await resp.json() == created


@pytest.mark.parametrize("domain", ["unknown.example", "not a domain", "127.0.0.1"])
async def test_get_unknown_is_404_c04(api: Client, domain: str) -> None:
    await api.post("/v1/websites", json={"domain": "known.example"})
    resp = await api.get(f"/v1/websites/{domain}")
    await assert_problem(resp, 404, "C04")


async def test_registration_lookup_and_retry_share_the_domain_rule(
    api: Client, db_url: str
) -> None:
    """One rule (services/websites.py): a name over 253 characters is refused by
    registration with its reason, and names no website for the lookup and the retry."""
    too_long = ".".join(["a" * 63] * 4)  # 255 characters, every label legal
    resp = await api.post("/v1/websites", json={"domain": too_long})
    assert resp.status == 400
    body = await resp.json()
    assert body["errors"] == [{"field": "domain", "message": "is longer than 253 characters"}]
    assert await counts(db_url) == (0, 0)
    assert (await api.get(f"/v1/websites/{too_long}")).status == 404
    assert (await api.post(f"/v1/admin/websites/{too_long}/retry")).status == 404
    # The same spelling rule for all three: one registered name, found and retried by any.
    await api.post("/v1/websites", json={"domain": "Rule.Example."})
    assert (await api.get("/v1/websites/RULE.example")).status == 200
    retried = await api.post("/v1/admin/websites/rule.EXAMPLE./retry")
    assert retried.status == 409  # found; its classification is not FAILED


async def test_twenty_concurrent_registrations_make_one_website_and_one_work_row(
    api: Client, store: SqlStore, db_url: str
) -> None:
    spellings = ["race.example", "RACE.example", "race.example.", "Race.Example."]

    async def register(i: int) -> tuple[int, str]:
        resp = await api.post("/v1/websites", json={"domain": spellings[i % len(spellings)]})
        return resp.status, (await resp.json())["id"]

    results = await asyncio.gather(*(register(i) for i in range(20)))
    statuses = sorted(status for status, _ in results)
    assert statuses == [200] * 19 + [201], statuses
    assert len({website_id for _, website_id in results}) == 1
    assert await counts(db_url) == (1, 1)
    ids = await raw_scalar(
        db_url, "SELECT COUNT(*) AS n FROM work_outbox o JOIN websites w ON w.id = o.website_id"
    )
    assert ids == 1


@pytest.mark.parametrize("bidi", ["\u202e", "\u2066", "\u202a"])
async def test_a_favicon_url_with_a_bidi_control_is_400_c01(
    api: Client, store: SqlStore, db_url: str, bidi: str
) -> None:
    body = {"domain": "bidi.example", "faviconUrl": f"https://bidi.example/{bidi}oci.f"}
    resp = await api.post("/v1/websites", json=body)
    assert resp.status == 400, await resp.text()
    problem = await resp.json()
    assert problem["code"] == "C01" and problem["errors"][0]["field"] == "faviconUrl"
    assert await raw_count(db_url, "websites") == 0


async def test_a_classified_website_whose_work_row_was_pruned_stays_listed_completed(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """outbox.prune deletes COMPLETED work rows; their websites stay in the listing and
    answer classification COMPLETED (attempts and last error went with the row)."""
    for domain in ("done.example", "waiting.example"):
        assert (await api.post("/v1/websites", json={"domain": domain})).status == 201
    row = await store.claim_work(time.time(), 60.0, 300.0)
    assert row is not None
    done = await store.website_by_id(row.website_id)
    assert done is not None and done.domain == "done.example"
    assert await store.complete_work(row, "news", time.time())
    pruned = await store.prune(time.time() + 60, time.time() + 60, time.time() + 60, 100)
    assert await raw_count(db_url, "work_outbox") == 1, pruned

    listed = await (await api.get("/v1/admin/websites")).json()
    by_domain = {w["domain"]: w for w in listed["items"]}
    assert set(by_domain) == {"done.example", "waiting.example"}
    assert by_domain["done.example"]["category"] == "news"
    assert by_domain["done.example"]["classification"] == {
        "status": "COMPLETED",
        "attempts": 0,
        "lastError": None,
    }
    assert by_domain["waiting.example"]["classification"]["status"] == "PENDING"
    completed = await (await api.get("/v1/admin/websites?status=COMPLETED")).json()
    assert [w["domain"] for w in completed["items"]] == ["done.example"]
    pending = await (await api.get("/v1/admin/websites?status=PENDING")).json()
    assert [w["domain"] for w in pending["items"]] == ["waiting.example"]
    one = await (await api.get("/v1/websites/done.example")).json()
    assert one["classification"]["status"] == "COMPLETED" and one["category"] == "news"


async def test_new_websites_over_the_hourly_cap_are_429_c12(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    """api.max_websites_per_user_per_hour = 2: a third new website of one user within the
    hour is 429 C12 with a Retry-After of at most an hour; a known domain is still
    answered (it costs no classification); another user is not affected."""
    tokens = {"alice": "tok-web-alice-" + "a" * 20, "bob": "tok-web-bob-" + "b" * 20}
    settings = make_settings(
        auth={"tokens": [{"sha256": hash_token(t), "user": u} for u, t in tokens.items()]},
        api={"max_websites_per_user_per_hour": 2},
    )
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    try:

        async def register(user: str, domain: str) -> Any:
            return await client.post(
                "/v1/websites",
                json={"domain": domain},
                headers={"Authorization": f"Bearer {tokens[user]}"},
            )

        assert (await register("alice", "one.example")).status == 201
        assert (await register("alice", "two.example")).status == 201
        over = await register("alice", "three.example")
        assert over.status == 429, await over.text()
        assert (await over.json())["code"] == "C12"
        assert 1 <= int(over.headers["Retry-After"]) <= 3600
        assert (await register("alice", "one.example")).status == 200
        assert (await register("bob", "three.example")).status == 201
        assert await raw_count(db_url, "websites") == 3
        assert await raw_count(db_url, "work_outbox") == 3
    finally:
        await client.close()
