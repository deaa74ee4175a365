"""The Suwon portal client against the strict fake portal (real servers on loopback)."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import signal
import sys
import time
import traceback
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from structlog.testing import capture_logs
from testkit.fakes.portal import (
    SAMPLE_PASSWORD,
    SAMPLE_SNO,
    SESSION_EXPIRED_JSON,
    FakePortal,
    Student,
    sample_student,
)
from testkit.records import EXPECTED_RECORD
from yarl import URL

from outboxd.config import SuwonScraperSettings
from outboxd.scrapers.suwon import SuwonScraper
from outboxd.scrapers.suwon_answers import PortalError
from tests.support.waits import eventually

REPO_ROOT = Path(__file__).resolve().parents[2]
# How early an asyncio timer may fire (the loop's clock resolution, far below this): the
# only slack a gap measured on the pacing process's own monotonic clock gets.
CLOCK_TOLERANCE_S = 0.001

NUMBER_FIELDS = {
    "year",
    "creditsAttempted",
    "creditsEarned",
    "gpa",
    "percentile",
    "credits",
    "gradePoints",
}
FULL_PROGRESS = [
    ("LOGIN", 0, 0),
    ("SSO", 0, 0),
    ("PROFILE", 0, 0),
    ("SEMESTERS", 0, 0),
    ("GRADES", 0, 3),
    ("GRADES", 1, 3),
    ("GRADES", 2, 3),
    ("GRADES", 3, 3),
]


class Progress:
    """Records every progress call."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, int, int]] = []

    async def __call__(self, step: str, done: int, total: int) -> None:
        self.calls.append((step, done, total))


def settings_for(portal: FakePortal, **overrides: Any) -> SuwonScraperSettings:
    base = SuwonScraperSettings(
        portal_base_url=portal.portal_base_url,
        info_base_url=portal.info_base_url,
        timeout_s=5.0,
        max_concurrency=2,
        min_interval_s=0.0,
    )
    return dataclasses.replace(base, **overrides)


@pytest_asyncio.fixture
async def portal() -> AsyncIterator[FakePortal]:
    async with FakePortal() as fake:
        yield fake


ScraperFactory = Callable[..., SuwonScraper]


@pytest_asyncio.fixture
async def make_scraper(portal: FakePortal) -> AsyncIterator[ScraperFactory]:
    made: list[SuwonScraper] = []

    def make(**overrides: Any) -> SuwonScraper:
        scraper = SuwonScraper(settings_for(portal, **overrides))
        made.append(scraper)
        return scraper

    yield make
    for scraper in made:
        await scraper.close()


async def fetch_error(
    scraper: SuwonScraper, username: str = SAMPLE_SNO, password: str = SAMPLE_PASSWORD
) -> PortalError:
    with pytest.raises(PortalError) as caught:
        await scraper.fetch_record(username, password, Progress())
    return caught.value


def student(sno: str, name: str) -> Student:
    return dataclasses.replace(sample_student(), sno=sno, name=name, password=f"pw-{sno}")


def assert_numbers_are_numbers(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            if key in NUMBER_FIELDS:
                assert isinstance(item, int | float) and not isinstance(item, bool), key
            else:
                assert_numbers_are_numbers(item)
    elif isinstance(value, list):
        for item in value:
            assert_numbers_are_numbers(item)


# --- success ---------------------------------------------------------------------------------


async def test_fetch_record_maps_profile_semesters_courses_and_totals(
    make_scraper: ScraperFactory,
) -> None:
    """A full fetch returns the camelCase record with numbers as numbers and terms mapped."""
    record = await make_scraper().fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress())

    assert record == EXPECTED_RECORD
    assert_numbers_are_numbers(record)
    assert [s["term"] for s in record["semesters"]] == ["1", "summer", "2"]
    assert [len(s["courses"]) for s in record["semesters"]] == [2, 1, 2]
    json.dumps(record)  # the job stores it as JSON


async def test_progress_reports_each_step_and_semesters_fetched(
    make_scraper: ScraperFactory,
) -> None:
    """Progress goes LOGIN, SSO, PROFILE, SEMESTERS, then GRADES counting semesters done."""
    progress = Progress()
    await make_scraper().fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, progress)
    assert progress.calls == FULL_PROGRESS


async def test_requests_follow_the_portal_flow_in_order(
    portal: FakePortal, make_scraper: ScraperFactory
) -> None:
    """One job makes the docs/portal.md requests in order, with one grades call per semester."""
    await make_scraper().fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress())
    assert [(method, path) for _, method, path in portal.requests] == [
        ("GET", "/enview/index.jsp"),
        ("POST", "/enpass/login"),
        ("GET", "/enview/user/enpassLoginProcess.face"),
        ("GET", "/enview/portal/"),
        ("GET", "/enview/user/mainLogin.face"),
        ("GET", "/sso_security_check"),
        ("GET", "/websquare/websquare.jsp"),
        ("POST", "/scrgBas/selectScrgBas.do"),
        ("POST", "/smrCretSum/listSmrCretSumTabYearSmrStud.do"),
        ("POST", "/cretBas/listSmrCretSumTabSubjt.do"),
        ("POST", "/cretBas/listSmrCretSumTabSubjt.do"),
        ("POST", "/cretBas/listSmrCretSumTabSubjt.do"),
    ]
    assert portal.login_attempts == {SAMPLE_SNO: 1}


async def test_single_quoted_sso_redirect_is_followed(
    portal: FakePortal, make_scraper: ScraperFactory
) -> None:
    """A `location.href = '...'` redirect in single quotes works like a double-quoted one."""
    portal.sso_quote = "'"
    record = await make_scraper().fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress())
    assert record == EXPECTED_RECORD


# --- authentication --------------------------------------------------------------------------


async def test_wrong_password_fails_auth_after_exactly_one_login(
    portal: FakePortal, make_scraper: ScraperFactory
) -> None:
    """A wrong password is PORTAL_AUTH_FAILED, not retryable, after a single login attempt."""
    error = await fetch_error(make_scraper(), password="not-the-password")
    assert (error.code, error.retryable) == ("PORTAL_AUTH_FAILED", False)
    assert portal.login_attempts == {SAMPLE_SNO: 1}


async def test_unknown_user_fails_auth(portal: FakePortal, make_scraper: ScraperFactory) -> None:
    """An unknown student number is PORTAL_AUTH_FAILED after a single login attempt."""
    error = await fetch_error(make_scraper(), username="19990000")
    assert (error.code, error.retryable) == ("PORTAL_AUTH_FAILED", False)
    assert portal.login_attempts == {"19990000": 1}


async def test_locked_account_fails_auth(portal: FakePortal, make_scraper: ScraperFactory) -> None:
    """A locked account is PORTAL_AUTH_FAILED, not retryable, even with the right password."""
    portal.locked_users.add(SAMPLE_SNO)
    error = await fetch_error(make_scraper())
    assert (error.code, error.retryable) == ("PORTAL_AUTH_FAILED", False)
    assert "locked" in error.message
    assert portal.login_attempts == {SAMPLE_SNO: 1}


# --- session expiry --------------------------------------------------------------------------


@pytest.mark.parametrize("calls_before_expiry", [1, 3])
async def test_session_expiring_once_is_healed_by_one_new_login(
    portal: FakePortal, make_scraper: ScraperFactory, calls_before_expiry: int
) -> None:
    """An info session that expires once mid-job triggers one fresh login and the job succeeds."""
    portal.expire_sessions_after(calls_before_expiry)
    progress = Progress()
    record = await make_scraper().fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, progress)
    assert record == EXPECTED_RECORD
    assert portal.login_attempts == {SAMPLE_SNO: 2}
    assert [c[0] for c in progress.calls].count("LOGIN") == 2
    assert progress.calls[-1] == ("GRADES", 3, 3)


async def test_session_expiring_again_is_session_expired(
    portal: FakePortal, make_scraper: ScraperFactory
) -> None:
    """An info session that is expired again after the fresh login is PORTAL_SESSION_EXPIRED."""
    portal.always_expire = True
    error = await fetch_error(make_scraper())
    assert (error.code, error.retryable) == ("PORTAL_SESSION_EXPIRED", True)
    assert portal.login_attempts == {SAMPLE_SNO: 2}


# --- transport and shape failures ------------------------------------------------------------


@pytest.mark.parametrize(
    ("fault", "code"),
    [
        ("always_fail_503", "PORTAL_UNAVAILABLE"),
        ("garbage", "PORTAL_BAD_RESPONSE"),
        ("broken_sso_page", "PORTAL_BAD_RESPONSE"),
    ],
    ids=["503", "wrong-json-shape", "sso-page-without-redirect"],
)
async def test_a_portal_fault_is_retryable_with_its_code(
    portal: FakePortal, make_scraper: ScraperFactory, fault: str, code: str
) -> None:
    """A 503 answer is PORTAL_UNAVAILABLE; info JSON of the wrong shape and an SSO page
    with no location.href are PORTAL_BAD_RESPONSE. All are retryable."""
    setattr(portal, fault, True)
    error = await fetch_error(make_scraper())
    assert (error.code, error.retryable) == (code, True)


async def test_one_503_fails_the_job_without_poisoning_the_next(
    portal: FakePortal, make_scraper: ScraperFactory
) -> None:
    """A single 503 fails that job as PORTAL_UNAVAILABLE; the next job succeeds."""
    scraper = make_scraper()
    portal.fail_next_n_with_503(1)
    assert (await fetch_error(scraper)).code == "PORTAL_UNAVAILABLE"
    assert await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress()) == EXPECTED_RECORD


async def test_timeout_is_unavailable(portal: FakePortal, make_scraper: ScraperFactory) -> None:
    """An answer slower than timeout_s is PORTAL_UNAVAILABLE and retryable."""
    portal.delay_s = 1.0
    started = time.monotonic()
    error = await fetch_error(make_scraper(timeout_s=0.2))
    assert (error.code, error.retryable) == ("PORTAL_UNAVAILABLE", True)
    assert time.monotonic() - started < 0.9


async def test_connection_refused_is_unavailable() -> None:
    """A portal that refuses connections is PORTAL_UNAVAILABLE and retryable."""
    async with FakePortal() as stopped:
        settings = settings_for(stopped)
    scraper = SuwonScraper(settings)
    try:
        error = await fetch_error(scraper)
    finally:
        await scraper.close()
    assert (error.code, error.retryable) == ("PORTAL_UNAVAILABLE", True)


@pytest.mark.parametrize(
    "breakage", ["wrong_password", "locked", "expired", "503", "garbage", "timeout"]
)
async def test_password_never_appears_in_errors_or_logs(breakage: str) -> None:
    """Whatever fails, the password is in no PortalError message, str, repr, traceback or log."""
    secret = "Zebra-Secret-9137-비밀"
    async with FakePortal([dataclasses.replace(sample_student(), password=secret)]) as fake:
        password = secret
        timeout_s = 5.0
        if breakage == "wrong_password":
            password = secret + "-typo"
        elif breakage == "locked":
            fake.locked_users.add(SAMPLE_SNO)
        elif breakage == "expired":
            fake.always_expire = True
        elif breakage == "503":
            fake.fail_next_n_with_503(2)
        elif breakage == "garbage":
            fake.garbage = True
        else:
            fake.delay_s, timeout_s = 0.5, 0.1
        scraper = SuwonScraper(settings_for(fake, timeout_s=timeout_s))
        try:
            with capture_logs() as logs:
                error = await fetch_error(scraper, password=password)
        finally:
            await scraper.close()
    rendered = [error.message, str(error), repr(error), "".join(traceback.format_exception(error))]
    if breakage != "timeout":
        assert logs, "the debug events were captured, so checking them means something"
    rendered.append(repr(logs))
    for text in rendered:
        assert secret not in text
        assert password not in text


# --- politeness ------------------------------------------------------------------------------


async def scrape_three_at_once(
    prefix: str, delay_s: float, max_concurrency: int
) -> tuple[list[Student], list[dict[str, Any]], int]:
    """Three students scraped concurrently: them, their records, and the fake's peak in flight."""
    students = [student(f"{prefix}{i}", f"학생{i}") for i in range(3)]
    async with FakePortal(students) as fake:
        fake.delay_s = delay_s
        scraper = SuwonScraper(settings_for(fake, max_concurrency=max_concurrency))
        try:
            records = await asyncio.gather(
                *(scraper.fetch_record(s.sno, s.password, Progress()) for s in students)
            )
        finally:
            await scraper.close()
        return students, records, fake.in_flight_max


async def test_max_concurrency_one_serialises_jobs() -> None:
    """With max_concurrency=1 three concurrent jobs never have two requests in flight."""
    students, records, in_flight_max = await scrape_three_at_once("2020000", 0.01, 1)
    assert in_flight_max == 1
    assert [r["student"]["studentNumber"] for r in records] == [s.sno for s in students]
    assert [r["student"]["name"] for r in records] == [s.name for s in students]


async def test_concurrent_jobs_overlap_when_allowed_and_keep_their_own_sessions() -> None:
    """With max_concurrency=3 jobs do overlap (the fake sees it) yet each gets its own record."""
    students, records, in_flight_max = await scrape_three_at_once("2021000", 0.02, 3)
    assert in_flight_max >= 2
    assert [r["student"]["name"] for r in records] == [s.name for s in students]


async def test_min_interval_spaces_every_request_across_jobs(
    portal: FakePortal, make_scraper: ScraperFactory
) -> None:
    """min_interval_s spaces all requests of one instance, redirects and parallel jobs included,
    from the last moment before each is sent: the end of its cancel check, however long that
    check takes (unevenly, as a database read does on a busy machine)."""
    interval = 0.04
    scraper = make_scraper(min_interval_s=interval)
    checked: list[float] = []

    async def slow_check() -> None:
        """Every other check takes a good part of the interval: a check awaited after the
        spacer's stamp (not inside it) would let the next request start that much early."""
        if len(checked) % 2:
            await asyncio.sleep(interval * 0.75)
        checked.append(time.monotonic())

    await asyncio.gather(
        scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress(), slow_check),
        scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress(), slow_check),
    )
    # Every request the portal saw, redirect hops included, passed the check and the spacer.
    assert len(portal.requests) == len(checked) == 24
    gaps = [b - a for a, b in itertools.pairwise(checked)]
    # Measured on the client's own clock where the pace is decided, not at the server's
    # arrival (one busy event loop stamps those late or early); the tolerance is only for
    # a timer firing within the loop's clock resolution.
    assert min(gaps) >= interval - CLOCK_TOLERANCE_S, gaps


async def test_close_is_idempotent_and_refuses_new_jobs(make_scraper: ScraperFactory) -> None:
    """close() can be called twice, and a closed scraper refuses fetch_record."""
    scraper = make_scraper()
    await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress())
    await scraper.close()
    await scraper.close()
    with pytest.raises(RuntimeError):
        await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress())


# --- the fake is strict ----------------------------------------------------------------------


def client() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))


async def sso_redirect_target(http: aiohttp.ClientSession, portal: FakePortal) -> str:
    """Logs in by hand and returns the SSO page's location.href target."""
    base = portal.portal_base_url
    (await http.get(f"{base}/enview/index.jsp")).release()
    login = URL(
        f"{base}/enpass/login?_epLogin_=enview&service={base}/enview/user/"
        "enpassLoginProcess.face?destination=/enview/portal/?langKnd=ko",
        encoded=True,
    )
    form = {
        "userId": SAMPLE_SNO,
        "pwd": SAMPLE_PASSWORD,
        "langKnd": "ko",
        "_enpass_login_": "submit",
        "gateway": "true",
        "username": SAMPLE_SNO,
        "password": SAMPLE_PASSWORD,
    }
    async with http.post(login, data=form) as resp:
        assert resp.status == 200
    sso = URL(
        f"{base}/enview/user/mainLogin.face?url={portal.info_base_url}/sso_security_check"
        "&langKnd=ko",
        encoded=True,
    )
    async with http.get(sso) as resp:
        page = await resp.text()
    return page.split('location.href = "', 1)[1].split('"', 1)[0]


async def test_fake_info_call_without_session_answers_session_expired_json(
    portal: FakePortal,
) -> None:
    """An info data call without the SSO hand-off gets the session-expired JSON with status 200."""
    headers = {"Content-Type": 'application/json; charset="UTF-8"', "Origin": portal.info_base_url}
    async with (
        client() as http,
        http.post(
            f"{portal.info_base_url}/scrgBas/selectScrgBas.do",
            data=json.dumps({"sno": SAMPLE_SNO}),
            headers=headers,
        ) as resp,
    ):
        assert resp.status == 200
        assert await resp.json() == SESSION_EXPIRED_JSON


async def test_fake_info_call_needs_json_headers(portal: FakePortal) -> None:
    """An info data call without JSON Content-Type and Origin is refused with 400."""
    async with (
        client() as http,
        http.post(
            f"{portal.info_base_url}/scrgBas/selectScrgBas.do",
            data=json.dumps({"sno": SAMPLE_SNO}),
        ) as resp,
    ):
        assert resp.status == 400


async def test_fake_sso_check_needs_a_valid_ticket(portal: FakePortal) -> None:
    """sso_security_check without a ticket, or with a made-up one, answers 403."""
    async with client() as http:
        for query in ("", "?ticket=made-up&langKnd=ko"):
            async with http.get(f"{portal.info_base_url}/sso_security_check{query}") as resp:
                assert resp.status == 403


async def test_fake_ticket_is_one_time(portal: FakePortal) -> None:
    """A genuine SSO ticket works once, exactly as sent, and a replay answers 403."""
    async with client() as http:
        target = await sso_redirect_target(http, portal)
        async with http.get(URL(target, encoded=True), allow_redirects=False) as resp:
            assert resp.status == 302
        async with http.get(URL(target, encoded=True), allow_redirects=False) as resp:
            assert resp.status == 403


async def test_fake_rejects_a_re_encoded_ticket_url(portal: FakePortal) -> None:
    """A ticket URL whose query was re-encoded by the client answers 403."""
    async with client() as http:
        target = await sso_redirect_target(http, portal)
        assert str(URL(target)) != target  # yarl's default quoting changes it
        async with http.get(URL(target), allow_redirects=False) as resp:
            assert resp.status == 403


async def test_fake_login_without_index_cookie_is_an_error_page(portal: FakePortal) -> None:
    """Posting the login form without the index page's cookie answers an error page."""
    async with (
        client() as http,
        http.post(
            f"{portal.portal_base_url}/enpass/login?_epLogin_=enview",
            data={"userId": SAMPLE_SNO, "pwd": SAMPLE_PASSWORD},
            allow_redirects=False,
        ) as resp,
    ):
        assert resp.status == 400


async def test_fake_sso_without_login_redirects_to_login_without_ticket(
    portal: FakePortal,
) -> None:
    """mainLogin.face without a logged-in portal session redirects to the login page, no ticket."""
    async with client() as http:
        (await http.get(f"{portal.portal_base_url}/enview/index.jsp")).release()
        async with http.get(
            f"{portal.portal_base_url}/enview/user/mainLogin.face",
            params={"url": f"{portal.info_base_url}/sso_security_check", "langKnd": "ko"},
        ) as resp:
            page = await resp.text()
    assert "location.href = '/enview/index.jsp'" in page
    assert "ticket" not in page


async def test_fake_runs_standalone_and_stops_on_sigterm(tmp_path: Path) -> None:
    """`python -m testkit.fakes.portal` writes its URLs, honors --fail-first-n; exits on SIGTERM."""
    port_file = tmp_path / "portal.json"
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "testkit.fakes.portal",
        "--port-file",
        str(port_file),
        "--fail-first-n",
        "1",
        cwd=REPO_ROOT,
    )
    try:

        def started() -> bool:
            assert proc.returncode is None, "fake portal exited early"
            return port_file.exists()

        await eventually(started, 10, what="the fake portal to write its URLs")
        urls = json.loads(port_file.read_text())
        scraper = SuwonScraper(SuwonScraperSettings(min_interval_s=0.0, **urls))
        try:
            assert (await fetch_error(scraper)).code == "PORTAL_UNAVAILABLE"
            record = await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, Progress())
        finally:
            await scraper.close()
        assert record == EXPECTED_RECORD
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(proc.wait(), timeout=10) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
