"""The operator console in a real browser: Debian's chromium driven by Playwright.

The daemon runs as a subprocess (tests/support/daemon.py) with the fake portal, the fake
AI (a subprocess) and moto behind a TCP proxy the test can cut, on both backends; one
more test runs the embedded default (no tokens, SQLite, embedded SQS). Every request
the browser makes is recorded, and any to another origin is refused and reported.

Screenshots of the overview and of a job page are taken on every run; with
OUTBOXD_UPDATE_SCREENSHOTS=1 they are written to docs/img/ (shown in the README).
"""

from __future__ import annotations

import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.security import generate_token, hash_token
from tests.acceptance.conftest import (
    ConfigFactory,
    DaemonFactory,
    PortalThread,
    http_request,
    merge,
    wait_for,
)
from tests.support.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    RequestLog,
    require_chromium,
    screenshot_path,
)
from tests.support.daemon import DaemonProcess, FakeProcess
from tests.support.loop_thread import LoopThread
from tests.support.moto import MotoServer
from tests.support.ops import ROOT
from tests.support.sqs_proxy import RefusingGate
from tests.support.tcp_proxy import TcpProxy

pytestmark = pytest.mark.slow

ADMIN_TOKEN = generate_token()
USER_TOKEN = generate_token()
ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
USER = {"Authorization": f"Bearer {USER_TOKEN}"}
AI_KEY_ENV = "CONSOLE_FAKE_AI_KEY"
AI_KEY = "sk-console-" + uuid.uuid4().hex[:8]
EVIL_DOMAIN = "evil.example"
EVIL_ANSWER = "<script>window.pwned=1</script><img src=x>"
UI_TIMEOUT_MS = 60_000


# ---------------------------------------------------------------- the browser


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Per test, and requested last: while Playwright's sync API is up, its event loop
    counts as running in this thread, so fixtures that call asyncio.run (the Postgres
    ones) must be set up before it."""
    require_chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@dataclass
class Tab:
    page: Page
    requests: RequestLog
    foreign: list[str]
    dialogs: list[str]


def open_tab(browser: Browser, base_url: str) -> Tab:
    """A fresh context and page; requests to any other origin are refused and recorded."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    origin = urlsplit(base_url)
    foreign: list[str] = []

    def only_the_daemon(route: Route) -> None:
        url = urlsplit(route.request.url)
        if (url.scheme, url.netloc) == (origin.scheme, origin.netloc):
            route.continue_()
        else:
            foreign.append(route.request.url)
            route.abort()

    context.route("**/*", only_the_daemon)
    page = context.new_page()
    page.set_default_timeout(UI_TIMEOUT_MS)
    dialogs: list[str] = []

    def on_dialog(dialog: Any) -> None:
        dialogs.append(f"{dialog.type}: {dialog.message}")
        dialog.accept()

    page.on("dialog", on_dialog)
    return Tab(page, RequestLog(page), foreign, dialogs)


def sign_in(tab: Tab, base_url: str, token: str, path: str = "/ui/") -> None:
    """The console asks for a token (401); entering it reloads the page with it."""
    tab.page.goto(base_url + path)
    expect(tab.page.get_by_test_id("auth-message")).to_contain_text("needs an admin token")
    tab.page.get_by_test_id("token-input").fill(token)
    with tab.page.expect_navigation():
        tab.page.get_by_role("button", name="Use token").click()


def expect_counts_equal_stats(page: Page, base_url: str, headers: dict[str, str]) -> None:
    """Every count the overview shows equals /v1/admin/stats (zero where absent)."""

    def matches() -> bool:
        stats = http_request("GET", base_url + "/v1/admin/stats", headers=headers).json()
        for table in ("jobs", "relay_outbox", "work_outbox", "task_runs"):
            cells = page.locator(f"[data-testid^='count-{table}-']")
            shown = {
                (cells.nth(i).get_attribute("data-testid") or "").split("-", 2)[2]: int(
                    cells.nth(i).inner_text()
                )
                for i in range(cells.count())
            }
            expected = stats["tables"][table]
            if any(shown.get(s) != n for s, n in expected.items()):
                return False
            if any(n != 0 for s, n in shown.items() if s not in expected):
                return False
        return True

    wait_for("the overview's counts to equal /v1/admin/stats", matches, timeout_s=30)


def submit_job(base_url: str, headers: dict[str, str], password: str = SAMPLE_PASSWORD) -> str:
    resp = http_request(
        "POST",
        base_url + "/v1/portal-link-jobs",
        {"portal": "suwon", "username": SAMPLE_SNO, "password": password},
        headers={**headers, "Idempotency-Key": uuid.uuid4().hex},
    )
    assert resp.status == 202, resp.text
    return str(resp.json()["jobId"])


def job_status(base_url: str, job_id: str) -> str:
    return str(
        http_request("GET", f"{base_url}/v1/admin/jobs/{job_id}", headers=ADMIN).json()["status"]
    )


def wait_job(base_url: str, job_id: str, status: str, timeout_s: float = 60) -> None:
    wait_for(f"job {job_id} {status}", lambda: job_status(base_url, job_id) == status, timeout_s)


# ---------------------------------------------------------------- a daemon with tokens


@pytest.fixture
def fake_ai(tmp_path: Path) -> Iterator[FakeProcess]:
    """The fake AI, answering a category with markup for EVIL_DOMAIN (an untrusted error)."""
    ai = FakeProcess(
        tmp_path,
        "testkit.fakes.ai",
        "--api-key",
        AI_KEY,
        "--category",
        f"{EVIL_DOMAIN}={EVIL_ANSWER}",
    )
    yield ai
    ai.stop()


@dataclass
class SqsLink:
    """moto behind a refusing gate behind a TCP proxy: `cut()` makes SQS unreachable and
    `mend()` brings it back (an outage: no attempt spent); `refuse()` makes it refuse every
    message (each publish attempt counts) until `accept()`."""

    loop: LoopThread
    proxy: TcpProxy
    gate: RefusingGate

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.proxy.port}"

    def cut(self) -> None:
        self.loop.run(self.proxy.stop())

    def mend(self) -> None:
        self.loop.run(self.proxy.start())

    def refuse(self) -> None:
        self.loop.call(lambda: setattr(self.gate, "refusing", True))

    def accept(self) -> None:
        self.loop.call(lambda: setattr(self.gate, "refusing", False))


@pytest.fixture
def sqs_link(moto_server: MotoServer) -> Iterator[SqsLink]:
    loop = LoopThread()
    gate = RefusingGate(moto_server.endpoint_url)
    upstream = urlsplit(loop.run(gate.start()))
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 80)
    loop.run(proxy.start())
    try:
        yield SqsLink(loop, proxy, gate)
    finally:
        loop.run(proxy.stop())
        loop.run(gate.stop())
        loop.close()


@pytest.fixture
def console_daemon(
    request: pytest.FixtureRequest,
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    fake_ai: FakeProcess,
    sqs_link: SqsLink,
) -> Iterator[DaemonProcess]:
    # Indirect parametrization can add sections (a test's own relay settings).
    extra: dict[str, Any] = getattr(request, "param", {})
    config = pipeline_config(
        **extra,
        sqs={"endpoint_url": sqs_link.endpoint_url, "max_receive_count": 2},
        daemon={"roles": ["api", "relay", "consumer", "claimer", "scheduler"]},
        claimer={
            "fixed_delay_s": 0.2,
            "retry_delay_s": 1.0,
            "processing_timeout_s": 3.0,
            "max_attempts": 1,
        },
        scrapers={
            "classifier": {
                "provider": "openai",
                "base_url": fake_ai.info["base_url"],
                "model": "fake-model",
                "api_key_env": AI_KEY_ENV,
                "timeout_s": 2.0,
            }
        },
        scheduler={"jobs": [{"name": "console-demo", "every_s": 3600.0, "task": "noop"}]},
        auth={
            "tokens": [
                {"sha256": hash_token(USER_TOKEN), "user": "bob", "role": "user"},
                {"sha256": hash_token(ADMIN_TOKEN), "user": "root", "role": "admin"},
            ]
        },
    )
    daemon = spawn_daemon(config, name="console")
    daemon.extra_env[AI_KEY_ENV] = AI_KEY
    daemon.start()
    yield daemon
    assert daemon.terminate() == 0, daemon.all_output()[-3000:]
    assert "Traceback" not in daemon.all_output()


def test_user_token_refused_then_admin_sees_the_daemon_live(
    console_daemon: DaemonProcess, sqs_link: SqsLink, tmp_path: Path, browser: Browser
) -> None:
    base = console_daemon.base_url
    assert base is not None
    tab = open_tab(browser, base)
    page = tab.page

    # A user token: the API's 403, and the page says so.
    sign_in(tab, base, USER_TOKEN)
    expect(page.get_by_test_id("auth-message")).to_contain_text("Forbidden (403)")
    expect(page.get_by_test_id("auth-message")).to_contain_text("admin role")
    assert page.get_by_test_id("tables").count() == 0
    page.get_by_test_id("token-input").fill(ADMIN_TOKEN)
    with page.expect_navigation():
        page.get_by_role("button", name="Use token").click()

    # The admin token: the overview, equal to /v1/admin/stats.
    expect(page.get_by_test_id("tables")).to_be_visible()
    assert page.locator("#auth").is_hidden()
    for status in ("PENDING", "RETRYABLE_FAILED", "SENT", "DEAD"):
        expect(page.get_by_test_id(f"count-relay_outbox-{status}")).to_have_text("0")
    expect(page.get_by_test_id("readiness-status")).to_have_text("ok")
    expect(page.get_by_test_id("schedules")).to_contain_text("console-demo")
    expect(page.get_by_test_id("claimer")).to_contain_text("last tick")
    expect(page.get_by_test_id("queue-jobs-dlq")).to_have_text("0")

    # QUEUED while SQS is cut, then SUCCEEDED on the same page, never reloaded.
    sqs_link.cut()
    job_id = submit_job(base, USER)
    page.goto(f"{base}/ui/jobs/{job_id}")
    expect(page.get_by_test_id("job-id")).to_have_text(job_id)
    expect(page.get_by_test_id("job-status")).to_have_text("QUEUED")
    page.evaluate("window.__sameDocument = true")
    sqs_link.mend()
    expect(page.get_by_test_id("job-status")).to_have_text("SUCCEEDED", timeout=90_000)
    assert page.evaluate("window.__sameDocument") is True
    expect(page.get_by_test_id("job-result")).to_contain_text("student")
    expect(page.get_by_test_id("outbox-table")).to_contain_text("SENT")
    assert SAMPLE_PASSWORD not in page.content()
    page.screenshot(path=str(screenshot_path("console-job.png", tmp_path)), full_page=True)

    # Jobs: the list by status, and the lookup by id.
    page.goto(f"{base}/ui/jobs")
    page.get_by_test_id("job-status-filter").select_option("SUCCEEDED")
    expect(page.get_by_test_id("jobs-table")).to_contain_text(job_id)
    page.get_by_test_id("job-status-filter").select_option("DEAD")
    expect(page.get_by_text("No jobs.")).to_be_visible()
    page.get_by_test_id("job-lookup").fill(job_id)
    with page.expect_navigation():
        page.get_by_role("button", name="Open").click()
    expect(page.get_by_test_id("job-status")).to_have_text("SUCCEEDED")

    # Tasks: the enqueue form.
    page.goto(f"{base}/ui/tasks")
    page.get_by_test_id("task-type").select_option("noop")
    page.get_by_role("button", name="Enqueue").click()
    expect(page.locator("#notice")).to_contain_text("Enqueued task")
    expect(page.get_by_test_id("tasks-table")).to_contain_text("noop")

    # The overview again, now with rows, still equal to the API's numbers.
    page.goto(f"{base}/ui/")
    expect(page.get_by_test_id("accepted-total")).to_have_text("1")
    expect_counts_equal_stats(page, base, ADMIN)
    page.screenshot(path=str(screenshot_path("console-overview.png", tmp_path)), full_page=True)
    assert tab.foreign == []
    assert ADMIN_TOKEN not in page.content() and USER_TOKEN not in page.content()
    assert page.context.cookies() == []


# Two publish attempts, so a relay row dies quickly while SQS is cut.
FAST_RELAY_DEATH = {"relay": {"max_attempts": 2, "backoff_base_s": 0.2, "backoff_max_s": 0.5}}


@pytest.mark.parametrize("console_daemon", [FAST_RELAY_DEATH], indirect=True, ids=["relay2"])
def test_dead_letters_websites_and_a_fast_clock(
    console_daemon: DaemonProcess,
    portal_thread: PortalThread,
    sqs_link: SqsLink,
    browser: Browser,
) -> None:
    base = console_daemon.base_url
    assert base is not None
    # A job whose relay row dies: SQS refuses the message on every publish attempt (an
    # unreachable SQS would spend no attempt: the row would wait, not die).
    sqs_link.refuse()
    by_row = submit_job(base, USER)

    def dead_row() -> str | None:
        rows = http_request("GET", f"{base}/v1/admin/jobs/{by_row}", headers=ADMIN).json()
        return str(rows["outbox"][0]["id"]) if rows["outbox"][0]["status"] == "DEAD" else None

    row_id = wait_for("the relay row to die", dead_row, timeout_s=60)
    sqs_link.accept()
    # Two jobs that die in the consumer: the portal answers 503 to everything.
    portal_thread.run(lambda: setattr(portal_thread.portal, "always_fail_503", True))
    by_page, by_selection = submit_job(base, USER), submit_job(base, USER)
    resp = http_request("POST", base + "/v1/websites", {"domain": EVIL_DOMAIN}, headers=USER)
    assert resp.status == 201, resp.text
    for job_id in (by_page, by_selection):
        wait_job(base, job_id, "DEAD", timeout_s=90)
    wait_for(
        "the website's classification to fail",
        lambda: (
            http_request("GET", f"{base}/v1/websites/{EVIL_DOMAIN}", headers=USER).json()[
                "classification"
            ]["status"]
            == "FAILED"
        ),
    )
    portal_thread.run(lambda: setattr(portal_thread.portal, "always_fail_503", False))

    tab = open_tab(browser, base)
    page = tab.page
    sign_in(tab, base, ADMIN_TOKEN, "/ui/dead-letters")

    # One DEAD job redriven from its own page, which then follows it to SUCCEEDED.
    expect(page.get_by_test_id("dead-jobs")).to_contain_text(by_page)
    expect(page.get_by_test_id("dead-jobs")).to_contain_text("RETRIES_EXHAUSTED")
    page.get_by_role("link", name=by_page).click()
    expect(page.get_by_test_id("job-status")).to_have_text("DEAD")
    expect(page.get_by_test_id("job-error-code")).to_have_text("RETRIES_EXHAUSTED")
    page.get_by_test_id("redrive-job").click()
    expect(page.get_by_test_id("job-status")).to_have_text("SUCCEEDED", timeout=90_000)
    assert any(d.startswith("confirm: Redrive job") for d in tab.dialogs)
    assert job_status(base, by_page) == "SUCCEEDED"

    # The other from a selection on the dead-letters page, after a confirmation.
    page.goto(f"{base}/ui/dead-letters")
    row = page.locator(f"tr[data-job-id='{by_selection}']")
    row.locator("input[type=checkbox]").check()
    page.get_by_test_id("redrive-selected").click()
    expect(page.locator("#notice")).to_contain_text("Redriven 1 item(s).")
    assert any(by_selection in d for d in tab.dialogs if d.startswith("confirm: Redrive 1"))
    wait_job(base, by_selection, "SUCCEEDED", timeout_s=90)

    # The DEAD relay row, redriven from its own row: its job runs to SUCCEEDED.
    page.goto(f"{base}/ui/dead-letters")
    dead = page.locator(f"tr[data-outbox-id='{row_id}']")
    expect(dead).to_contain_text("DEAD")
    expect(dead).to_contain_text(by_row)
    dead.get_by_test_id("redrive").click()
    expect(page.locator("#notice")).to_contain_text("Redriven 1 item(s).")
    assert any(f"outbox row {row_id}" in d for d in tab.dialogs)
    wait_job(base, by_row, "SUCCEEDED", timeout_s=90)

    # The AI's answer (markup) is shown as text in the FAILED row, never parsed.
    page.goto(f"{base}/ui/websites")
    failed_row = page.locator(f"tr[data-domain='{EVIL_DOMAIN}']")
    expect(failed_row).to_contain_text(EVIL_ANSWER)
    expect(page.get_by_test_id("work-FAILED")).to_have_text("1")
    assert page.locator("main script, main img").count() == 0
    assert page.evaluate("window.pwned") is None
    failed_row.get_by_test_id("retry-website").click()
    expect(page.locator("#notice")).to_contain_text(f"{EVIL_DOMAIN} is PENDING again.")
    wait_for(
        "the retry in the daemon's log",
        lambda: any(
            e.get("event") == "website_classification_retried" and e.get("domain") == EVIL_DOMAIN
            for e in console_daemon.events()
        ),
    )
    assert not any(d.startswith("alert") for d in tab.dialogs)

    # JavaScript's clock run far ahead: the refresh stays one request chain.
    clock_tab = open_tab(browser, base)
    clock_tab.page.clock.install()
    sign_in(clock_tab, base, ADMIN_TOKEN)
    expect(clock_tab.page.get_by_test_id("tables")).to_be_visible()
    log = clock_tab.requests
    log.reset_peak()
    before = log.paths["/v1/admin/stats"]
    started = time.monotonic()
    for _ in range(5):
        clock_tab.page.clock.run_for(60_000)  # five minutes of timers, at once
        clock_tab.page.wait_for_timeout(200)
    real_s = time.monotonic() - started
    made = log.paths["/v1/admin/stats"] - before
    # A setInterval would have fired 300 refreshes; one chain makes at most one per run_for
    # plus one per real second.
    assert made <= 5 + real_s + 2, (made, real_s)
    assert log.max_in_flight <= 1, log.max_in_flight
    # And it still refreshes: a new job shows up without a reload.
    jobs_before = int(clock_tab.page.get_by_test_id("count-jobs-SUCCEEDED").inner_text())
    wait_job(base, submit_job(base, USER), "SUCCEEDED")
    clock_tab.page.clock.run_for(2_000)
    expect(clock_tab.page.get_by_test_id("count-jobs-SUCCEEDED")).to_have_text(str(jobs_before + 1))
    assert tab.foreign == [] and clock_tab.foreign == []


# ---------------------------------------------------------------- the embedded default


def test_embedded_default_shows_relay_states_and_a_job_without_its_password(
    spawn_daemon: DaemonFactory, portal_thread: PortalThread, browser: Browser
) -> None:
    config = merge(
        tomllib.loads((ROOT / "config.toml").read_text()),
        {
            "server": {"port": 0},
            # The shipped file's portal is a real host; tests talk to loopback only.
            "scrapers": {"suwon": {**portal_thread.urls, "min_interval_s": 0.0}},
        },
    )
    daemon = spawn_daemon(config, name="embedded")
    (daemon.workdir / "var").mkdir()
    base = daemon.start(timeout_s=90)
    job_id = submit_job(base, {})
    wait_job(base, job_id, "SUCCEEDED", timeout_s=90)

    tab = open_tab(browser, base)
    page = tab.page
    page.goto(base + "/ui/")
    # No tokens configured: nothing is asked.
    expect(page.get_by_test_id("tables")).to_be_visible()
    assert page.locator("#auth").is_hidden()
    relay = page.get_by_test_id("table-relay_outbox")
    for status in ("PENDING", "RETRYABLE_FAILED", "SENT", "DEAD"):
        expect(relay).to_contain_text(status)
    expect_counts_equal_stats(page, base, {})
    expect(page.get_by_test_id("count-relay_outbox-SENT")).to_have_text("1")
    expect(page.get_by_test_id("count-relay_outbox-DEAD")).to_have_text("0")
    expect(page.get_by_test_id("schedules")).to_contain_text("nightly-prune")

    page.goto(f"{base}/ui/jobs/{job_id}")
    expect(page.get_by_test_id("job-id")).to_have_text(job_id)
    expect(page.get_by_test_id("job-status")).to_have_text("SUCCEEDED")
    assert SAMPLE_PASSWORD not in page.content()
    assert SAMPLE_PASSWORD not in page.inner_text("body")

    # Every script and stylesheet came from the daemon; nothing else was even asked for.
    assert tab.foreign == []
    assert tab.requests.urls and all(u.startswith(base + "/") for u in tab.requests.urls)
    loaded = {urlsplit(u).path for u in tab.requests.urls}
    assert {"/ui/assets/app.js", "/ui/assets/app.css"} <= loaded
    assert page.context.cookies() == []
    assert daemon.terminate() == 0
