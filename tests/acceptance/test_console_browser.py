"""The operator console in a real browser: Debian's chromium driven by Playwright.

The daemon runs as a subprocess (testkit/daemon.py) with the fake portal, the fake
AI (a subprocess) and moto behind a TCP proxy the test can cut, on both backends; one
more test runs the embedded default (no tokens, SQLite, embedded SQS). Every request
the browser makes is recorded, and any to another origin is refused and reported.

Screenshots of the overview and of a job page are taken on every run; with
OUTBOXD_UPDATE_SCREENSHOTS=1 they are written to docs/img/ (shown in the README).
"""

from __future__ import annotations

import re
import time
import tomllib
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Route, expect, sync_playwright
from testkit.daemon import DaemonProcess, FakeProcess
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO
from testkit.moto import MotoServer

from outboxd.security import generate_token, hash_token
from tests.acceptance.conftest import (
    ConfigFactory,
    DaemonFactory,
    PortalThread,
    http_request,
    merge,
)
from tests.support.browser import (
    CHROMIUM,
    CHROMIUM_ARGS,
    RequestLog,
    Sent,
    require_chromium,
    screenshot_path,
)
from tests.support.loop_thread import LoopThread
from tests.support.ops import ROOT
from tests.support.sqs_proxy import RefusingGate
from tests.support.tcp_proxy import TcpProxy
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow

ADMIN_TOKEN = generate_token()
USER_TOKEN = generate_token()
VIEWER_TOKEN = generate_token()
OPERATOR_TOKEN = generate_token()
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

    eventually_sync(matches, 30, what="the overview's counts to equal /v1/admin/stats")


def submit_job(
    base_url: str,
    headers: dict[str, str],
    password: str = SAMPLE_PASSWORD,
    username: str = SAMPLE_SNO,
) -> str:
    resp = http_request(
        "POST",
        base_url + "/v1/portal-link-jobs",
        {"portal": "suwon", "username": username, "password": password},
        headers={**headers, "Idempotency-Key": uuid.uuid4().hex},
    )
    assert resp.status == 202, resp.text
    return str(resp.json()["jobId"])


def job_status(base_url: str, job_id: str) -> str:
    return str(
        http_request("GET", f"{base_url}/v1/admin/jobs/{job_id}", headers=ADMIN).json()["status"]
    )


def wait_job(base_url: str, job_id: str, status: str, timeout_s: float = 60) -> None:
    eventually_sync(
        lambda: job_status(base_url, job_id) == status, timeout_s, what=f"job {job_id} {status}"
    )


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
                {"sha256": hash_token(VIEWER_TOKEN), "user": "vera", "role": "viewer"},
                {"sha256": hash_token(OPERATOR_TOKEN), "user": "otto", "role": "operator"},
            ]
        },
    )
    daemon = spawn_daemon(config, name="console")
    daemon.extra_env[AI_KEY_ENV] = AI_KEY
    daemon.start()
    yield daemon
    assert daemon.terminate() == 0, daemon.all_output()[-3000:]
    assert "Traceback" not in daemon.all_output()


@pytest.fixture
def base(console_daemon: DaemonProcess) -> str:
    """The running console daemon's base URL."""
    assert console_daemon.base_url is not None
    return console_daemon.base_url


def test_user_token_refused_then_admin_sees_the_daemon_live(
    base: str, sqs_link: SqsLink, tmp_path: Path, browser: Browser
) -> None:
    tab = open_tab(browser, base)
    page = tab.page

    # A user token: the API's 403, and the page says so.
    sign_in(tab, base, USER_TOKEN)
    expect(page.get_by_test_id("auth-message")).to_contain_text("Forbidden (403)")
    expect(page.get_by_test_id("auth-message")).to_contain_text("needs a viewer token")
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
    # SENT can come after SUCCEEDED: a publish SQS took but answered after
    # relay.publish_timeout_s leaves the row RETRYABLE_FAILED while the consumer runs the
    # message, and the relay publishes it again after its SQS pause (at most 30 s). The
    # page reads the row when its held request ends (at most WAIT_S, 25 s).
    expect(page.get_by_test_id("outbox-table")).to_contain_text("SENT", timeout=90_000)
    assert SAMPLE_PASSWORD not in page.content()

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
    # Finished jobs are told apart by how they ended: the SUCCEEDED one is not a failure.
    expect(page.get_by_test_id("succeeded-total")).to_have_text("1")
    expect(page.get_by_test_id("failed-total")).to_have_text("0")
    expect_counts_equal_stats(page, base, ADMIN)
    page.screenshot(path=str(screenshot_path("console-overview.png", tmp_path)), full_page=True)
    assert tab.foreign == []
    assert ADMIN_TOKEN not in page.content() and USER_TOKEN not in page.content()
    assert page.context.cookies() == []


# Two publish attempts, so a relay row dies quickly while SQS refuses its message.
FAST_RELAY_DEATH = {"relay": {"max_attempts": 2, "backoff_base_s": 0.2, "backoff_max_s": 0.5}}
UTC_TIME = re.compile(r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3} UTC$")
DURATION = re.compile(r"^\d+(\.\d)? (ms|s|min|h)$")
TIMES = ("created", "updated", "finished")


def expect_times_in_utc(page: Page, selector: str) -> None:
    """Every time the selector finds is written out in UTC (and there is at least one)."""
    texts = page.locator(selector).all_inner_texts()
    shown = [t for t in texts if t != "—"]
    assert shown and all(UTC_TIME.match(t) for t in shown), texts


@pytest.mark.parametrize("console_daemon", [FAST_RELAY_DEATH], indirect=True, ids=["relay2"])
def test_dead_letters_a_timeline_websites_and_a_fast_clock(
    console_daemon: DaemonProcess,
    base: str,
    portal_thread: PortalThread,
    sqs_link: SqsLink,
    tmp_path: Path,
    browser: Browser,
) -> None:
    # Two jobs whose relay rows die: SQS refuses the message on every publish attempt (an
    # unreachable SQS would spend no attempt: the rows would wait, not die).
    sqs_link.refuse()
    by_row, by_job = submit_job(base, USER), submit_job(base, USER)

    def dead_row(job_id: str) -> str | None:
        rows = http_request("GET", f"{base}/v1/admin/jobs/{job_id}", headers=ADMIN).json()
        return str(rows["outbox"][0]["id"]) if rows["outbox"][0]["status"] == "DEAD" else None

    row_id = eventually_sync(lambda: dead_row(by_row), 60, what="the relay row to die")
    superseded_id = eventually_sync(lambda: dead_row(by_job), 60, what="the other relay row to die")
    sqs_link.accept()
    # Two jobs that die in the consumer: the portal answers 503 to everything.
    portal_thread.run(lambda: setattr(portal_thread.portal, "always_fail_503", True))
    by_page, by_selection = submit_job(base, USER), submit_job(base, USER)
    resp = http_request("POST", base + "/v1/websites", {"domain": EVIL_DOMAIN}, headers=USER)
    assert resp.status == 201, resp.text
    for job_id in (by_page, by_selection):
        wait_job(base, job_id, "DEAD", timeout_s=90)
    eventually_sync(
        lambda: (
            http_request("GET", f"{base}/v1/websites/{EVIL_DOMAIN}", headers=USER).json()[
                "classification"
            ]["status"]
            == "FAILED"
        ),
        30.0,
        what="the website's classification to fail",
    )
    portal_thread.run(lambda: setattr(portal_thread.portal, "always_fail_503", False))

    tab = open_tab(browser, base)
    page = tab.page
    sign_in(tab, base, ADMIN_TOKEN, "/ui/dead-letters")

    # A DEAD job's timeline: a retried attempt and the one that died, with their errors.
    expect(page.get_by_test_id("dead-jobs")).to_contain_text(by_page)
    expect(page.get_by_test_id("dead-jobs")).to_contain_text("RETRIES_EXHAUSTED")
    page.get_by_role("link", name=by_page).click()
    expect(page.get_by_test_id("job-status")).to_have_text("DEAD")
    expect(page.get_by_test_id("job-error-code")).to_have_text("RETRIES_EXHAUSTED")
    attempts = page.get_by_test_id("timeline-attempt")
    expect(attempts).to_have_count(2)
    expect(attempts.nth(0).get_by_test_id("attempt-outcome")).to_contain_text("retry in")
    expect(attempts.nth(0).get_by_test_id("attempt-detail")).to_contain_text("PORTAL_UNAVAILABLE")
    expect(attempts.nth(1).get_by_test_id("attempt-outcome")).to_have_text("dead")
    # The last attempt's error with the job's message.
    message = http_request("GET", f"{base}/v1/jobs/{by_page}", headers=ADMIN).json()["error"]
    expect(attempts.nth(1).get_by_test_id("attempt-detail")).to_contain_text(
        f"RETRIES_EXHAUSTED: {message['message']}"
    )
    dispatched = page.locator("[data-testid=timeline-event][data-type=dispatched]")
    expect(dispatched).to_contain_text("message ")

    # Redriven from its own page, which then follows it to SUCCEEDED: a third attempt.
    page.get_by_test_id("redrive-job").click()
    expect(page.get_by_test_id("job-status")).to_have_text("SUCCEEDED", timeout=90_000)
    assert any(d.startswith("confirm: Redrive job") for d in tab.dialogs)
    assert job_status(base, by_page) == "SUCCEEDED"
    expect(attempts).to_have_count(3)
    expect(attempts.nth(2).get_by_test_id("attempt-outcome")).to_have_text("succeeded")
    expect(page.locator("[data-testid=timeline-event][data-type=redriven]")).to_contain_text(
        "by root"
    )
    for i in range(3):
        assert DURATION.match(attempts.nth(i).get_by_test_id("attempt-duration").inner_text())
    expect_times_in_utc(page, "[data-testid=timeline] td.time")
    expect_times_in_utc(page, ", ".join(f"dd[data-testid=job-{t}]" for t in TIMES))
    page.screenshot(path=str(screenshot_path("console-job.png", tmp_path)), full_page=True)

    # A selection of two DEAD jobs (one died in the consumer, one at publish): one bulk
    # redrive, after a confirmation. The relay-dead job's row becomes history.
    page.goto(f"{base}/ui/dead-letters")
    expect(page.locator(f"tr[data-outbox-id='{superseded_id}']")).to_contain_text("DEAD")
    posts_before = len(tab.requests.sent)
    for job_id in (by_selection, by_job):
        page.locator(f"tr[data-job-id='{job_id}'] input[type=checkbox]").check()
    page.get_by_test_id("redrive-selected").click()
    expect(page.locator("#notice")).to_contain_text("Redriven 2 item(s).")
    assert any(by_selection in d and by_job in d for d in tab.dialogs if "Redrive 2" in d)
    posts = [s.path for s in tab.requests.sent[posts_before:] if s.method == "POST"]
    assert posts == ["/v1/admin/jobs/redrive"], posts
    expect(page.locator(f"tr[data-outbox-id='{superseded_id}']")).to_have_count(0)
    for job_id in (by_selection, by_job):
        wait_job(base, job_id, "SUCCEEDED", timeout_s=90)
    page.goto(f"{base}/ui/jobs/{by_job}")
    history = page.locator(f"tr[data-outbox-id='{superseded_id}']")
    expect(history).to_contain_text("SUPERSEDED")
    expect(history).to_contain_text("history")

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
    assert failed_row.locator("bdi", has_text=EVIL_ANSWER).count() == 1
    expect(page.get_by_test_id("work-FAILED")).to_have_text("1")
    assert page.locator("main script, main img").count() == 0
    assert page.evaluate("window.pwned") is None
    failed_row.get_by_test_id("retry-website").click()
    expect(page.locator("#notice")).to_contain_text(f"{EVIL_DOMAIN} is PENDING again.")
    eventually_sync(
        lambda: any(
            e.get("event") == "website_classification_retried" and e.get("domain") == EVIL_DOMAIN
            for e in console_daemon.events()
        ),
        30.0,
        what="the retry in the daemon's log",
    )
    assert not any(d.startswith("alert") for d in tab.dialogs)

    # JavaScript's clock run far ahead: nothing runs on a timer, so nothing is sent.
    clock_tab = open_tab(browser, base)
    clock_tab.page.clock.install()
    sign_in(clock_tab, base, ADMIN_TOKEN)
    expect(clock_tab.page.get_by_test_id("tables")).to_be_visible()
    expect_times_in_utc(clock_tab.page, "[data-testid=claimer] dd:nth-of-type(-n+2)")
    expect_times_in_utc(clock_tab.page, "[data-testid=schedules] td.time")
    log = clock_tab.requests
    eventually_sync(
        lambda: held_requests(log, "/v1/admin/stats"),
        30.0,
        what="the overview's stats request to be held",
    )
    log.reset_peak()
    started = time.monotonic()
    for _ in range(5):
        clock_tab.page.clock.run_for(60_000)  # five minutes of timers, at once
        clock_tab.page.wait_for_timeout(200)
    made = log.api_since(started)
    # A poll on a timer would have sent 300; a held request answers a job's change (none
    # now) or its wait's end (25 s).
    assert len(made) <= 2, [s.url for s in made]
    assert log.max_in_flight <= 1, log.max_in_flight
    # And it still follows: a new job shows up without a reload or a timer.
    jobs_before = int(clock_tab.page.get_by_test_id("count-jobs-SUCCEEDED").inner_text())
    wait_job(base, submit_job(base, USER), "SUCCEEDED")
    expect(clock_tab.page.get_by_test_id("count-jobs-SUCCEEDED")).to_have_text(str(jobs_before + 1))
    assert tab.foreign == [] and clock_tab.foreign == []


def held_requests(log: RequestLog, path: str) -> list[Sent]:
    """The requests for `path` that asked to be held (Prefer: wait, with If-None-Match)."""
    return [
        s
        for s in log.api_since(0)
        if s.path == path
        and s.headers.get("prefer", "").startswith("wait=")
        and "if-none-match" in s.headers
    ]


def job_rows(page: Page) -> set[str]:
    rows = page.locator("[data-testid=jobs-table] tr[data-job-id]")
    return {str(rows.nth(i).get_attribute("data-job-id")) for i in range(rows.count())}


def expect_job_rows(page: Page, wanted: set[str]) -> None:
    """The jobs list shows exactly `wanted` (an empty list says so)."""
    if not wanted:
        expect(page.get_by_text("No jobs.")).to_be_visible()
        return
    rows = page.locator("[data-testid=jobs-table] tr[data-job-id]")
    expect(rows).to_have_count(len(wanted))
    assert job_rows(page) == wanted


# A name with a right-to-left override and no end to it: shown as it is, it would turn the
# rest of its line around ("college: ..." drawn before it, backwards).
HOSTILE_NAME = "\u202eevil name"


def test_filters_in_the_url_a_cancel_followed_live_and_isolated_portal_text(
    base: str,
    portal_thread: PortalThread,
    sqs_link: SqsLink,
    tmp_path: Path,
    browser: Browser,
) -> None:
    portal_thread.run(
        lambda: setattr(portal_thread.portal.students[SAMPLE_SNO], "name", HOSTILE_NAME)
    )
    # bob's job succeeds (with the hostile name in its result); root's fails at login.
    done = submit_job(base, USER)
    wait_job(base, done, "SUCCEEDED")
    failed = submit_job(base, ADMIN, password="not-the-password")
    wait_job(base, failed, "FAILED")

    # A QUEUED job (SQS cut) cancelled from its page, which updates by itself.
    sqs_link.cut()
    queued = submit_job(base, USER)
    tab = open_tab(browser, base)
    page = tab.page
    sign_in(tab, base, ADMIN_TOKEN, f"/ui/jobs/{queued}")
    expect(page.get_by_test_id("job-status")).to_have_text("QUEUED")
    eventually_sync(
        lambda: held_requests(tab.requests, f"/v1/jobs/{queued}"),
        30.0,
        what="the job page's request to be held",
    )
    page.evaluate("window.__sameDocument = true")
    page.get_by_test_id("cancel-job").click()
    expect(page.get_by_test_id("job-status")).to_have_text("CANCELLED")
    assert page.evaluate("window.__sameDocument") is True
    assert any(d.startswith(f"confirm: Cancel job {queued}") for d in tab.dialogs)
    expect(page.locator("[data-testid=timeline-event][data-type=cancelled]")).to_contain_text(
        "by admin"
    )
    held = held_requests(tab.requests, f"/v1/jobs/{queued}")
    assert held and held[0].headers["prefer"] == "wait=25", held
    # Idle now (CANCELLED is final): at most the one request held again, never one a second.
    page.wait_for_timeout(500)
    quiet_from = time.monotonic()
    page.wait_for_timeout(3_000)
    quiet = tab.requests.api_since(quiet_from)
    assert len(quiet) <= 1, [s.url for s in quiet]
    sqs_link.mend()

    # The filters narrow the list and live in the URL.
    page.goto(f"{base}/ui/jobs")
    expect_job_rows(page, {done, failed, queued})
    expect_times_in_utc(page, "[data-testid=jobs-table] td.time")
    page.get_by_test_id("job-user-filter").fill("bob")
    page.get_by_test_id("apply-filters").click()
    expect_job_rows(page, {done, queued})
    page.get_by_test_id("job-status-filter").select_option("CANCELLED")
    expect_job_rows(page, {queued})
    assert "user=bob" in page.url and "status=CANCELLED" in page.url
    page.reload()
    expect(page.get_by_test_id("job-user-filter")).to_have_value("bob")
    expect(page.get_by_test_id("job-status-filter")).to_have_value("CANCELLED")
    expect_job_rows(page, {queued})
    page.get_by_test_id("clear-filters").click()
    expect_job_rows(page, {done, failed, queued})
    page.get_by_test_id("job-code-filter").fill("PORTAL_AUTH_FAILED")
    page.get_by_test_id("apply-filters").click()
    expect_job_rows(page, {failed})
    page.get_by_test_id("clear-filters").click()
    # From just after the failed job's creation (UTC, as typed): only the later one.
    created = http_request("GET", f"{base}/v1/jobs/{failed}", headers=ADMIN).json()["createdAt"]
    after = datetime.fromisoformat(created.replace("Z", "+00:00")) + timedelta(milliseconds=1)
    page.get_by_test_id("job-from-filter").fill(after.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3])
    page.get_by_test_id("apply-filters").click()
    expect_job_rows(page, {queued})
    page.reload()
    expect_job_rows(page, {queued})
    page.get_by_test_id("job-to-filter").fill(after.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3])
    page.get_by_test_id("apply-filters").click()
    expect_job_rows(page, set())

    # The search by student number: exactly that username's jobs, found by its keyed hash;
    # the username stays out of the URL and the page (only the box holds what was typed).
    other_sno = "20239999"
    other = submit_job(base, ADMIN, username=other_sno)
    page.goto(f"{base}/ui/jobs")
    page.get_by_test_id("job-username-search").fill(other_sno)
    page.get_by_test_id("job-username-find").click()
    expect_job_rows(page, {other})
    assert other_sno not in page.url and other_sno not in page.content()
    page.get_by_test_id("job-username-search").fill(SAMPLE_SNO)
    page.get_by_test_id("job-username-find").click()
    expect_job_rows(page, {done, failed, queued})
    page.get_by_test_id("clear-filters").click()
    expect_job_rows(page, {done, failed, queued, other})

    # bob's jobs, followed: a new one shows up by itself, and nothing is polled meanwhile.
    page.goto(f"{base}/ui/jobs?user=bob")
    expect_job_rows(page, {done, queued})
    eventually_sync(
        lambda: held_requests(tab.requests, "/v1/admin/jobs"),
        30.0,
        what="the list's request to be held",
    )
    quiet_from = time.monotonic()
    page.wait_for_timeout(3_000)
    assert len(tab.requests.api_since(quiet_from)) <= 1
    newer = submit_job(base, USER)
    expect(page.locator(f"[data-testid=jobs-table] tr[data-job-id='{newer}']")).to_have_count(1)
    page.screenshot(path=str(screenshot_path("console-jobs.png", tmp_path)), full_page=True)

    # The portal's hostile name is isolated: a <bdi>, and the text after it stays after it.
    page.goto(f"{base}/ui/jobs/{done}")
    name = page.locator("[data-testid=job-result] [data-field=name]")
    college = page.locator("[data-testid=job-result] [data-field=college]")
    expect(name).to_contain_text("evil name")
    shown = name.locator("bdi")
    assert shown.evaluate("n => n.tagName") == "BDI"
    assert shown.evaluate("n => getComputedStyle(n).unicodeBidi") == "isolate"
    assert shown.inner_text() == HOSTILE_NAME
    name_box, college_box = name.bounding_box(), college.bounding_box()
    assert name_box is not None and college_box is not None
    # On one line, the college after the name, left to right.
    assert abs(college_box["y"] - name_box["y"]) < 2, (name_box, college_box)
    assert college_box["x"] >= name_box["x"] + name_box["width"] - 1, (name_box, college_box)
    label = college.evaluate("n => n.firstChild.textContent + n.childNodes[1].textContent")
    assert label == ", college: "
    expect_times_in_utc(page, ", ".join(f"dd[data-testid=job-{t}]" for t in TIMES))
    assert tab.foreign == []


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
    # Nothing runs; then a job the failing portal keeps RUNNING (retried, waiting in SQS):
    # the jobs card shows its age, which "oldest pending" (QUEUED jobs only) never did.
    running = page.get_by_test_id("oldest-running-jobs")
    expect(running).to_have_text("—")
    portal = portal_thread.portal
    portal_thread.run(lambda: setattr(portal, "always_fail_503", True))
    submit_job(base, {})
    expect(running).to_have_text(re.compile(r"^\d+(\.\d)? (ms|s|min)$"), timeout=30_000)
    expect(page.get_by_test_id("oldest-jobs")).to_have_text("—")
    portal_thread.run(lambda: setattr(portal, "always_fail_503", False))

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


def test_dependencies_paused_with_a_reason_then_resumed(
    console_daemon: DaemonProcess, base: str, browser: Browser
) -> None:
    """The Dependencies page shows each outside system's state; a pause needs a reason and
    shows it with its end; a job sent meanwhile waits (the portal hears nothing), and
    Resume lets it run."""
    tab = open_tab(browser, base)
    page = tab.page
    sign_in(tab, base, ADMIN_TOKEN, "/ui/dependencies")
    for name in ("portal", "ai", "sqs"):
        expect(page.get_by_test_id(f"dep-state-{name}")).to_have_text("up")
    form = page.get_by_test_id("dep-pause-portal")
    posts_before = len(tab.requests.sent)
    form.get_by_role("button", name="Pause").click()  # no reason: the form refuses
    expect(page.get_by_test_id("dep-state-portal")).to_have_text("up")
    sent = [x for x in tab.requests.sent[posts_before:] if x.method == "POST"]
    assert sent == [], sent
    page.get_by_test_id("dep-reason-input-portal").fill("the university asked for a quiet hour")
    page.get_by_test_id("dep-minutes-portal").fill("60")
    form.get_by_role("button", name="Pause").click()
    expect(page.get_by_test_id("dep-state-portal")).to_have_text("paused")
    expect(page.get_by_test_id("dep-reason-portal")).to_have_text(
        "the university asked for a quiet hour"
    )
    expect(page.get_by_test_id("dep-until-portal")).to_contain_text("UTC")
    assert any(d.startswith("confirm: Pause calls to portal") for d in tab.dialogs)
    listed = http_request("GET", f"{base}/v1/admin/dependencies", headers=ADMIN).json()
    portal = next(i for i in listed["items"] if i["name"] == "portal")
    assert portal["state"] == "paused" and portal["pausedBy"] == "root"

    job_id = submit_job(base, USER)

    def waiting() -> bool:
        body = http_request("GET", f"{base}/v1/jobs/{job_id}", headers=USER).json()
        return (body["waitingFor"] or {}).get("state") == "paused"

    eventually_sync(waiting, 30, what="the job to wait for the paused portal")
    page.get_by_role("button", name="Refresh").click()
    expect(page.get_by_test_id("dep-waiting-portal")).to_have_text("1")
    page.get_by_test_id("dep-resume-portal").click()
    expect(page.get_by_test_id("dep-state-portal")).to_have_text("up")
    wait_job(base, job_id, "SUCCEEDED")
    assert not tab.foreign


def test_a_viewer_sees_no_actions_an_operator_no_tasks_and_the_audit_page_filters(
    console_daemon: DaemonProcess, base: str, browser: Browser
) -> None:
    """Roles in the console: a viewer reads the dependencies and tasks but is offered no
    pause, no resume and no enqueue; an operator pauses (and is offered no task enqueue);
    the audit page lists that pause and the viewer's refused attempt, and filters by actor."""
    viewer_tab = open_tab(browser, base)
    sign_in(viewer_tab, base, VIEWER_TOKEN, "/ui/dependencies")
    page = viewer_tab.page
    expect(page.get_by_test_id("dep-state-portal")).to_have_text("up")
    expect(page.get_by_test_id("dep-pause-portal")).to_be_hidden()
    page.goto(base + "/ui/tasks")
    expect(page.get_by_role("heading", name="Tasks")).to_be_visible()
    expect(page.get_by_test_id("task-form")).to_be_hidden()
    # The server refuses what the page does not offer, and writes it down.
    refused = http_request(
        "POST",
        f"{base}/v1/admin/dependencies/portal/pause",
        {"reason": "a viewer trying"},
        headers={"Authorization": f"Bearer {VIEWER_TOKEN}"},
    )
    assert refused.status == 403

    operator_tab = open_tab(browser, base)
    sign_in(operator_tab, base, OPERATOR_TOKEN, "/ui/dependencies")
    op = operator_tab.page
    op.get_by_test_id("dep-reason-input-ai").fill("provider maintenance")
    op.get_by_test_id("dep-pause-ai").get_by_role("button", name="Pause").click()
    expect(op.get_by_test_id("dep-state-ai")).to_have_text("paused")
    op.get_by_test_id("dep-resume-ai").click()
    expect(op.get_by_test_id("dep-state-ai")).to_have_text("up")
    op.goto(base + "/ui/tasks")
    expect(op.get_by_role("heading", name="Tasks")).to_be_visible()
    expect(op.get_by_test_id("task-form")).to_be_hidden()

    page.goto(base + "/ui/audit")
    rows = page.get_by_test_id("audit-row")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("resumeDependency")
    expect(rows.nth(2)).to_contain_text("vera")
    expect(rows.nth(2).get_by_test_id("audit-outcome")).to_have_text("403")
    page.get_by_test_id("audit-actor").fill("otto")
    page.get_by_test_id("audit-filter").get_by_role("button", name="Filter").click()
    expect(rows).to_have_count(2)
    assert "actor=otto" in page.url
    assert not viewer_tab.foreign and not operator_tab.foreign
