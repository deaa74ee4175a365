"""The admin reads and actions the operator console is built on, and the /ui/ files'
headers, on both backends, in process.

FAILED classifications are made with the claimer's own store transitions
(claim_work + fail_work(final=True)); DEAD jobs with tests/support/ops.
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer
from testkit.fakes.ai import FakeAI

from outboxd.config import ClaimerSettings, ClassifierSettings
from outboxd.daemon.components import build_api_deps
from outboxd.daemon.runtime import ConsoleRuntime, Throughput
from outboxd.http.app import create_app
from outboxd.http.console import CONTENT_SECURITY_POLICY
from outboxd.metrics import Metrics
from outboxd.scrapers.classifier import OpenAIClassifier
from outboxd.security import KeyRing
from outboxd.services.websites import WebsiteService
from outboxd.storage.store import SqlStore
from outboxd.workers.claimer import Claimer
from tests.conftest import SettingsFactory
from tests.support.api import assert_problem, walk
from tests.support.ops import kill_at_publish, kill_in_processing, submit_job, succeed
from tests.support.waits import eventually

Client = TestClient[Any, Any]
AI_KEY = "sk-console-test-" + "3f9a"


async def _failed_website(store: SqlStore, domain: str, error: str) -> None:
    await WebsiteService(store).register(domain, None)
    row = await store.claim_work(time.time(), 0.0, 60.0)
    assert row is not None
    assert await store.fail_work(row, error, True, time.time())


# ------------------------------------------------------------------ jobs


async def test_jobs_list_by_status_with_keyset_pages(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    jobs = [await submit_job(store, keys, user=f"u{i % 2}", key=f"k{i}") for i in range(7)]
    for j in jobs[:5]:
        await kill_in_processing(store, j.id)
    await succeed(store, jobs[5].id)

    pages = await walk(api, "/v1/admin/jobs", 2, status="DEAD")
    assert [len(p) for p in pages] == [2, 2, 1]
    listed = [item["jobId"] for page in pages for item in page]
    # Newest first, every user's, each once.
    assert listed == [j.id for j in reversed(jobs[:5])]
    assert all(item["status"] == "DEAD" for page in pages for item in page)
    assert all(item["error"]["code"] == "RETRIES_EXHAUSTED" for page in pages for item in page)

    everything = [i for p in await walk(api, "/v1/admin/jobs", 3) for i in p]
    assert sorted(i["jobId"] for i in everything) == sorted(j.id for j in jobs)
    # Each with its owner, for the console's user column.
    assert {i["jobId"]: i["user"] for i in everything} == {j.id: j.user_id for j in jobs}

    queued = await (await api.get("/v1/admin/jobs", params={"status": "QUEUED"})).json()
    assert [i["jobId"] for i in queued["items"]] == [jobs[6].id]

    await assert_problem(await api.get("/v1/admin/jobs", params={"status": "dead"}), 400, "C01")
    await assert_problem(await api.get("/v1/admin/jobs", params={"stauts": "DEAD"}), 400, "C01")
    await assert_problem(await api.get("/v1/admin/jobs", params={"cursor": "nope!"}), 400, "C01")


async def test_job_detail_has_its_outbox_rows_and_no_secret(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    job = await submit_job(store, keys, user="alice")
    dead_row = await kill_at_publish(store, job.id, error="sqs said <script>no</script>")
    redriven = await api.post(f"/v1/admin/jobs/{job.id}/redrive")
    assert redriven.status == 202

    resp = await api.get(f"/v1/admin/jobs/{job.id}")
    assert resp.status == 200
    body = await resp.json()
    assert body["jobId"] == job.id and body["status"] == "QUEUED" and body["user"] == "alice"
    rows = body["outbox"]
    assert len(rows) == 2
    # The spent row is history now, not a dead letter: the redrive superseded it.
    assert rows[1]["id"] == dead_row.id and rows[1]["status"] == "SUPERSEDED"
    assert rows[1]["lastError"] == "sqs said <script>no</script>"
    assert rows[0]["status"] == "PENDING" and rows[0]["jobId"] == job.id
    text = await resp.text()
    assert "pw-alice" not in text and "sealed" not in text

    await assert_problem(await api.get("/v1/admin/jobs/no-such-job"), 404, "C04")


# ------------------------------------------------------------------ websites


async def test_failed_websites_listed_and_sent_back_to_pending(
    api: Client, store: SqlStore
) -> None:
    await _failed_website(store, "broken.example", "provider said: bad favicon")
    await WebsiteService(store).register("fine.example", None)

    page = await (await api.get("/v1/admin/websites", params={"status": "FAILED"})).json()
    assert [w["domain"] for w in page["items"]] == ["broken.example"]
    assert page["items"][0]["classification"] == {
        "status": "FAILED",
        "attempts": 1,
        "lastError": "provider said: bad favicon",
    }
    every = [w["domain"] for p in await walk(api, "/v1/admin/websites", 1) for w in p]
    assert sorted(every) == ["broken.example", "fine.example"]

    resp = await api.post("/v1/admin/websites/Broken.Example./retry")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["classification"] == {"status": "PENDING", "attempts": 0, "lastError": None}

    # Pending again means the claimer takes it again, as a fresh row.
    first = await store.claim_work(time.time(), 3600.0, 3600.0)
    second = await store.claim_work(time.time(), 3600.0, 3600.0)
    claimed = {r.website_id for r in (first, second) if r is not None}
    website = await store.get_website("broken.example")
    assert website is not None and website.id in claimed

    await assert_problem(await api.post("/v1/admin/websites/fine.example/retry"), 409, "C11")
    await assert_problem(await api.post("/v1/admin/websites/nowhere.example/retry"), 404, "C04")
    await assert_problem(await api.post("/v1/admin/websites/not a domain/retry"), 404, "C04")
    await assert_problem(await api.get("/v1/admin/websites", params={"status": "X"}), 400, "C01")


# ------------------------------------------------------------------ runtime


async def test_runtime_without_console_state(api: Client) -> None:
    resp = await api.get("/v1/admin/runtime")
    assert resp.status == 200
    body = await resp.json()
    assert body["readiness"] == {"status": "ok", "checks": {"database": "ok"}}
    assert body["claimer"] is None
    assert body["schedules"] == []
    assert body["throughput"] == []
    assert body["taskTypes"] == ["outbox.prune", "noop"]
    # The console's status names come from here, in the order the API defines them.
    assert body["statuses"] == {
        "jobs": ["QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD", "CANCELLED"],
        "relay_outbox": ["PENDING", "SENT", "RETRYABLE_FAILED", "DEAD", "SUPERSEDED"],
        "work_outbox": ["PENDING", "PROCESSING", "COMPLETED", "FAILED"],
        "task_runs": ["PENDING", "SENT", "SUCCEEDED", "FAILED", "DEAD"],
    }


def test_throughput_counts_accepted_finished_and_failed_per_minute() -> None:
    metrics = Metrics()
    now = [6000.0]
    tp = Throughput(metrics, clock=lambda: now[0])
    metrics.jobs_accepted.inc(3)
    metrics.handler_duration.labels("jobs", "succeeded").observe(0.1)
    metrics.handler_duration.labels("jobs", "dead").observe(0.1)
    metrics.handler_duration.labels("jobs", "retry").observe(0.1)  # not finished
    metrics.handler_duration.labels("tasks", "succeeded").observe(0.1)  # not a job
    tp.sample()
    now[0] += 60
    metrics.jobs_accepted.inc()
    series = tp.series()
    assert len(series) == 60
    assert series[-2] == (6000.0, 3, 2, 1)  # one succeeded, one dead
    assert series[-1] == (6060.0, 1, 0, 0)
    now[0] += 3600
    assert all(point[1:] == (0, 0, 0) for point in tp.series())


async def test_runtime_shows_the_claimer_pace_and_a_provider_pause(
    make_settings: SettingsFactory,
    store: SqlStore,
    keys: KeyRing,
) -> None:
    async with FakeAI(api_key=AI_KEY) as ai:
        await _pace_through_a_pause(make_settings, store, keys, ai)


async def _pace_through_a_pause(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing, ai: FakeAI
) -> None:
    classifier = OpenAIClassifier(
        ClassifierSettings(
            provider="openai", base_url=ai.base_url, model="m", api_key_env="K", timeout_s=5.0
        ),
        {"K": AI_KEY},
    )
    settings = ClaimerSettings(
        fixed_delay_s=0.2, retry_delay_s=10.0, processing_timeout_s=30.0, max_attempts=3
    )
    claimer = Claimer(store, classifier, settings, Metrics())
    runtime = ConsoleRuntime(Throughput(Metrics()), claimer=claimer)
    assert runtime.claimer_pace() == (None, None, None)
    deps = build_api_deps(
        make_settings(), store, keys, Metrics(), queues=None, dispatcher=None, runtime=runtime
    )
    client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    await WebsiteService(store).register("paused.example", None)
    ai.rate_limit_next_n(1, retry_after_s=30.0)  # the provider asks for a 30 s pause
    stop = asyncio.Event()
    task = asyncio.create_task(claimer.run(stop))
    try:
        await eventually(lambda: runtime.claimer_pace()[1] is not None, 30, what="a tick")
        body = await (await client.get("/v1/admin/runtime")).json()
    finally:
        stop.set()
        await task
        await client.close()
        await classifier.close()
    pace = {k: datetime.fromisoformat(v).timestamp() for k, v in body["claimer"].items()}
    assert 25 <= pace["pausedUntil"] - pace["lastTickAt"] <= 35
    assert abs(pace["nextTickAt"] - pace["pausedUntil"]) < 2
    assert body["readiness"]["status"] == "ok"


async def test_console_reads_need_the_admin_role(
    two_role_api: tuple[Client, str, str],
) -> None:
    client, user_token, admin_token = two_role_api
    paths = ["/v1/admin/jobs", "/v1/admin/jobs/x", "/v1/admin/websites", "/v1/admin/runtime"]
    for path in paths:
        await assert_problem(await client.get(path), 401, "C02")
        user = {"Authorization": f"Bearer {user_token}"}
        await assert_problem(await client.get(path, headers=user), 403, "C03")
    user = {"Authorization": f"Bearer {user_token}"}
    await assert_problem(
        await client.post("/v1/admin/websites/a.example/retry", headers=user), 403, "C03"
    )
    admin = {"Authorization": f"Bearer {admin_token}"}
    runtime = await (await client.get("/v1/admin/runtime", headers=admin)).json()
    assert len(runtime["throughput"]) == 60


# ------------------------------------------------------------------ the static files


async def test_console_files_are_public_with_strict_headers(
    two_role_api: tuple[Client, str, str],
) -> None:
    client, _user, _admin = two_role_api
    expected = {
        "/ui/": "text/html",
        "/ui/jobs": "text/html",
        "/ui/jobs/0f9e1c1e-0000-4000-8000-000000000000": "text/html",
        "/ui/dead-letters": "text/html",
        "/ui/websites": "text/html",
        "/ui/tasks": "text/html",
        "/ui/assets/app.js": "text/javascript",
        "/ui/assets/app.css": "text/css",
    }
    for path, ctype in expected.items():
        resp = await client.get(path)  # no token: the page asks for one itself
        assert resp.status == 200, path
        assert resp.content_type == ctype
        assert resp.headers["Content-Security-Policy"] == CONTENT_SECURITY_POLICY
        assert resp.headers["X-Content-Type-Options"] == "nosniff"
        assert resp.headers["Referrer-Policy"] == "no-referrer"
        assert "Set-Cookie" not in resp.headers
    csp = CONTENT_SECURITY_POLICY
    assert "default-src 'self'" in csp and "script-src 'self';" in csp
    assert "unsafe-inline" not in csp and "http" not in csp and "*" not in csp
    # What a browser needs to refuse framing, spelled out (not read from the module).
    frame = await client.get("/ui/")
    assert "frame-ancestors 'none'" in _directives(frame.headers["Content-Security-Policy"])
    assert frame.headers["X-Frame-Options"] == "DENY"

    html = await (await client.get("/ui/")).text()
    # No inline script or style, nothing from another origin.
    assert "<style" not in html and "style=" not in html
    assert html.count("<script") == 1 and 'src="/ui/assets/app.js"' in html
    assert "http://" not in html and "https://" not in html and "//" not in html
    js = await (await client.get("/ui/assets/app.js")).text()
    assert "innerHTML" not in js and "insertAdjacentHTML" not in js and "eval(" not in js
    assert "document.cookie" not in js and "localStorage" not in js

    await assert_problem(await client.get("/ui/assets/other.js"), 404, "C04")
    await assert_problem(await client.get("/ui/nowhere"), 404, "C04")
    await assert_problem(await client.get("/ui/jobs/not-a-job-id"), 404, "C04")


def _directives(policy: str) -> list[str]:
    return [d.strip() for d in policy.split(";")]


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [
        ("GET", "/ui/nowhere", 404, "C04"),
        ("GET", "/ui/jobs/not-a-job-id", 404, "C04"),
        ("GET", "/ui/assets/other.js", 404, "C04"),
        ("GET", "/ui/jobs/", 404, "C04"),
        ("POST", "/ui/", 405, "C10"),
        ("DELETE", "/ui/assets/app.js", 405, "C10"),
    ],
)
async def test_console_errors_carry_the_console_headers(
    two_role_api: tuple[Client, str, str], method: str, path: str, status: int, code: str
) -> None:
    """A 404 or 405 under /ui/ is still a page a browser may render or frame: it carries the
    console's policy, nosniff and the frame refusal like the pages do."""
    client, _user, admin = two_role_api
    resp = await client.request(method, path, headers={"Authorization": f"Bearer {admin}"})
    await assert_problem(resp, status, code)
    policy = _directives(resp.headers["Content-Security-Policy"])
    assert "frame-ancestors 'none'" in policy and "default-src 'self'" in policy
    assert "script-src 'self'" in policy
    assert resp.headers["X-Content-Type-Options"] == "nosniff"
    assert resp.headers["X-Frame-Options"] == "DENY"


async def test_the_root_and_the_bare_ui_lead_to_the_console_and_it_has_an_icon(
    two_role_api: tuple[Client, str, str],
) -> None:
    """A person who types the daemon's address lands on the console; its page carries its icon
    (allowed by the policy), and a browser's /favicon.ico is answered with nothing, not 404."""
    client, _user, _admin = two_role_api
    for path in ("/", "/ui"):
        resp = await client.get(path, allow_redirects=False)
        assert (resp.status, resp.headers["Location"]) == (302, "/ui/"), path
        assert resp.headers["X-Request-Id"]
    page = await client.get("/")
    assert page.status == 200 and page.url.path == "/ui/"
    assert '<link rel="icon" href="data:image/svg+xml,' in await page.text()
    assert "img-src 'self' data:" in page.headers["Content-Security-Policy"]
    icon = await client.get("/favicon.ico")
    assert icon.status == 204 and await icon.read() == b""


async def test_api_errors_do_not_carry_the_console_policy(
    two_role_api: tuple[Client, str, str],
) -> None:
    client, _user, _admin = two_role_api
    resp = await client.get("/v1/nowhere")
    assert resp.status == 404
    assert "Content-Security-Policy" not in resp.headers
