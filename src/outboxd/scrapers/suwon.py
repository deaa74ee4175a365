"""The Suwon University portal client: login, SSO hand-off and academic record (docs/portal.md).

One `fetch_record` call is one student's job. It runs with its own cookie jar, makes
its requests one after another, and shares the instance's politeness limits
(`max_concurrency` jobs at once, `min_interval_s` between any two requests) with every
other job of the same `SuwonScraper`. Those limits come from a `PortalPacing`: this
instance's own by default, or one shared by every instance (`pace_scope = "cluster"`,
given by the daemon; see docs/pacing.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import aiohttp
import structlog
from yarl import URL

from outboxd.config import SuwonScraperSettings
from outboxd.metrics import RequestOutcome
from outboxd.scrapers.suwon_answers import (
    COURSES_KEY,
    PROFILE_KEY,
    SEMESTER_CODE,
    SEMESTER_YEAR,
    SEMESTERS_KEY,
    SESSION_ERROR_KEYS,
    TOTALS_KEY,
    PortalError,
    bad_response,
    json_object,
    list_of,
    login_refused,
    map_section,
)

__all__ = [
    "CheckHook",
    "InstancePacing",
    "PortalPacing",
    "ProgressCallback",
    "SuwonScraper",
]

_log = structlog.get_logger(__name__)

ProgressCallback = Callable[[str, int, int], Awaitable[None]]
"""Called as (step, done, total); steps LOGIN, SSO, PROFILE, SEMESTERS, GRADES."""
CheckHook = Callable[[], Awaitable[None]]
"""Awaited before every portal request (each redirect hop too); whatever it raises ends the
call there (the consumer's cancel: a request already sent is not cut off)."""
CountRequest = Callable[[RequestOutcome], None]
"""Called once per portal request (each redirect hop too) with how it ended
(`Metrics.portal_request`)."""


def _uncounted(_outcome: RequestOutcome) -> None:
    return None


# --- The portal's paths (docs/portal.md) ---------------------------------------------------

_INDEX_PATH: Final = "/enview/index.jsp"
_LOGIN_PATH: Final = (
    "/enpass/login?_epLogin_=enview"
    "&service={portal}/enview/user/enpassLoginProcess.face?destination=/enview/portal/?langKnd=ko"
)
_SSO_PATH: Final = "/enview/user/mainLogin.face?url={info}/sso_security_check&langKnd=ko"
_REFERER_PATH: Final = (
    "/websquare/websquare.jsp?w2xPath=/views/usw/sa/hj/SA_HJ_1230.xml"
    "&w2xHome=/views/&w2xDocumentRoot="
)
_PROFILE_PATH: Final = "/scrgBas/selectScrgBas.do"
_SEMESTERS_PATH: Final = "/smrCretSum/listSmrCretSumTabYearSmrStud.do"
_GRADES_PATH: Final = "/cretBas/listSmrCretSumTabSubjt.do"

_JS_REDIRECT_RE: Final = re.compile(r"""location\.href\s*=\s*(["'])(.*?)\1""", re.DOTALL)
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS: Final = 10


def _tls_context(verify: bool) -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    # The real servers only negotiate what OpenSSL 3 refuses at its default security level.
    ctx.set_ciphers("DEFAULT@SECLEVEL=1")
    if not verify:
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
    return ctx


class _Spacer:
    """Starts requests at least `interval_s` apart, across every job of one scraper."""

    def __init__(self, interval_s: float) -> None:
        self._interval_s = interval_s
        self._lock = asyncio.Lock()
        self._next_at = 0.0

    async def wait(self, check: CheckHook | None = None) -> None:
        if self._interval_s <= 0:
            if check is not None:
                await check()
            return
        # Holding the lock while sleeping queues waiters in order instead of letting
        # them all wake at the same instant.
        async with self._lock:
            delay = self._next_at - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            if check is not None:
                await check()
            # Stamped after the last await before the request, never before one: a slow
            # `check` must not let this request start closer to the next one.
            self._next_at = time.monotonic() + self._interval_s


class PortalPacing(Protocol):
    """The portal's politeness limits: a session per job, a spaced start per request."""

    def session(self) -> contextlib.AbstractAsyncContextManager[None]:
        """Held from a job's login to the end of its scraping."""
        ...

    async def before_request(self, check: CheckHook | None = None) -> None:
        """Returns when the next portal request may start, `check` awaited on the way: the
        caller sends the request at once, so the pace holds from that moment."""
        ...


class InstancePacing:
    """This instance's own limits: a semaphore of sessions and a spacer of requests."""

    def __init__(self, max_concurrency: int, min_interval_s: float) -> None:
        self._jobs = asyncio.Semaphore(max_concurrency)
        self._spacer = _Spacer(min_interval_s)

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        async with self._jobs:
            yield

    async def before_request(self, check: CheckHook | None = None) -> None:
        await self._spacer.wait(check)


@dataclass(frozen=True)
class _Page:
    url: URL
    status: int
    body: bytes


@dataclass
class _Job:
    http: aiohttp.ClientSession
    username: str
    password: str = field(repr=False)
    progress: ProgressCallback
    check: CheckHook | None = None
    relogged_in: bool = False


class SuwonScraper:
    """Fetches one student's academic record per call; see the module docstring for limits."""

    def __init__(
        self,
        settings: SuwonScraperSettings,
        pacing: PortalPacing | None = None,
        count: CountRequest = _uncounted,
    ) -> None:
        self._settings = settings
        self._count = count
        self._portal = settings.portal_base_url.rstrip("/")
        self._info = settings.info_base_url.rstrip("/")
        self._pacing: PortalPacing = pacing or InstancePacing(
            settings.max_concurrency, settings.min_interval_s
        )
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
        self._json_headers = {
            "Content-Type": 'application/json; charset="UTF-8"',
            "Accept": "application/json, text/javascript, */*; q=0.01",
            "Origin": self._info,
            "Referer": self._info + _REFERER_PATH,
        }
        # Shared so jobs reuse TCP/TLS connections; cookies live in each job's own session.
        self._connector: aiohttp.TCPConnector | None = None
        self._closed = False

    async def close(self) -> None:
        """Closes the shared connections; safe to call more than once."""
        self._closed = True
        connector, self._connector = self._connector, None
        if connector is not None:
            await connector.close()

    async def fetch_record(
        self,
        username: str,
        password: str,
        progress: ProgressCallback,
        check: CheckHook | None = None,
    ) -> dict[str, Any]:
        """Logs in as the student and returns {student, semesters, totals} (docs/portal.md).

        `check` is awaited before each request. Raises PortalError (or what `check` raised);
        RuntimeError once closed. A rejected login is never retried; an
        expired info session is answered with one fresh login within this call (progress
        then reports LOGIN and SSO again). A field the info system leaves out or sends as
        null comes back as None; a present field of the wrong type is PORTAL_BAD_RESPONSE.
        """
        if self._closed:
            raise RuntimeError("SuwonScraper is closed")
        async with self._pacing.session():
            jar = aiohttp.CookieJar(unsafe=True)  # the fakes, and tests, run on 127.0.0.1
            async with aiohttp.ClientSession(
                connector=self._get_connector(),
                connector_owner=False,
                cookie_jar=jar,
                timeout=self._timeout,
                headers={
                    "User-Agent": "Mozilla/5.0 (compatible; outboxd)",
                    "Accept-Language": "ko-KR,ko;q=0.9,en;q=0.8",
                },
            ) as http:
                job = _Job(
                    http=http, username=username, password=password, progress=progress, check=check
                )
                return await self._fetch(job)

    def _get_connector(self) -> aiohttp.TCPConnector:
        # Created lazily: a connector must be born inside the running event loop.
        if self._connector is None or self._connector.closed:
            self._connector = aiohttp.TCPConnector(
                ssl=_tls_context(self._settings.verify_tls), limit=0
            )
        return self._connector

    async def _fetch(self, job: _Job) -> dict[str, Any]:
        await self._sign_in(job)

        await job.progress("PROFILE", 0, 0)
        profile = await self._info_call(job, _PROFILE_PATH, {"sno": job.username})
        student = map_section("student", profile.get(PROFILE_KEY))

        await job.progress("SEMESTERS", 0, 0)
        summary = await self._info_call(job, _SEMESTERS_PATH, {"sno": job.username})
        rows = list_of(summary, SEMESTERS_KEY)
        semesters = [map_section("semester", row) for row in rows]
        totals_row = summary.get(TOTALS_KEY)
        totals = map_section("totals", {} if totals_row is None else totals_row)

        await job.progress("GRADES", 0, len(rows))
        for done, (row, semester) in enumerate(zip(rows, semesters, strict=True), start=1):
            # Echo the row's own values: the info system compares them as it sent them.
            body = {
                "sno": job.username,
                SEMESTER_YEAR: row.get(SEMESTER_YEAR),
                SEMESTER_CODE: row.get(SEMESTER_CODE),
            }
            grades = await self._info_call(job, _GRADES_PATH, body)
            semester["courses"] = [map_section("course", c) for c in list_of(grades, COURSES_KEY)]
            await job.progress("GRADES", done, len(rows))

        return {"student": student, "semesters": semesters, "totals": totals}

    async def _sign_in(self, job: _Job) -> None:
        await job.progress("LOGIN", 0, 0)
        index = URL(self._portal + _INDEX_PATH, encoded=True)
        _expect_ok(await self._send(job, "GET", index))
        login = URL(self._portal + _LOGIN_PATH.format(portal=self._portal), encoded=True)
        form = {
            "userId": job.username,
            "pwd": job.password,
            "langKnd": "ko",
            "_enpass_login_": "submit",
            "gateway": "true",
            "username": job.username,
            "password": job.password,
        }
        page = await self._send(
            job, "POST", login, data=form, headers={"Referer": str(index)}, refused=login_refused
        )
        # Checked before the status: a rejection must never look retryable.
        refusal = login_refused(page.body)
        if refusal is not None:
            raise PortalError("PORTAL_AUTH_FAILED", refusal)
        _expect_ok(page)

        await job.progress("SSO", 0, 0)
        sso = URL(self._portal + _SSO_PATH.format(info=self._info), encoded=True)
        page = _expect_ok(await self._send(job, "GET", sso))
        match = _JS_REDIRECT_RE.search(page.body.decode("utf-8", errors="replace"))
        if match is None:
            raise bad_response("SSO page has no location.href redirect")
        try:
            # encoded=True: the one-time ticket must reach the info system byte for byte.
            target = page.url.join(URL(match.group(2).strip(), encoded=True))
        except ValueError:
            raise bad_response("SSO redirect is not a valid URL") from None
        if target.scheme not in ("http", "https") or not target.host:
            raise bad_response("SSO redirect is not an http(s) URL")
        _expect_ok(await self._send(job, "GET", target))

    async def _info_call(self, job: _Job, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = URL(self._info + path, encoded=True)
        payload = json.dumps(body, ensure_ascii=False).encode()
        while True:
            page = _expect_ok(
                await self._send(job, "POST", url, data=payload, headers=self._json_headers)
            )
            data = json_object(page.body)
            if not any(key in data for key in SESSION_ERROR_KEYS):
                return data
            if job.relogged_in:
                raise PortalError(
                    "PORTAL_SESSION_EXPIRED", "info session expired again after a fresh login"
                )
            job.relogged_in = True
            _log.debug("portal_session_expired_relogin", path=path)
            job.http.cookie_jar.clear()
            await self._sign_in(job)

    async def _send(
        self,
        job: _Job,
        method: str,
        url: URL,
        *,
        data: Mapping[str, str] | bytes | None = None,
        headers: Mapping[str, str] | None = None,
        refused: Callable[[bytes], str | None] | None = None,
    ) -> _Page:
        """One request and its redirects, each spaced, timed and counted on its own: a
        final page with a 4xx, or one `refused` finds a refusal in, counts as `rejected`."""
        http = job.http
        # Redirects are followed by hand so that every hop passes the check and the spacer.
        for _ in range(_MAX_REDIRECTS + 1):
            # The check runs after the spacer's wait (a cancel made meanwhile counts) and
            # inside it: nothing is awaited between the pace's go and the request.
            await self._pacing.before_request(job.check)
            # The pace's moment on the wall clock, comparable across instances on one host.
            sent_at = time.time()
            started = time.monotonic()
            try:
                async with http.request(
                    method, url, data=data, headers=headers, allow_redirects=False
                ) as resp:
                    body = await resp.read()
                    status = resp.status
                    location = resp.headers.get("Location")
            except TimeoutError:
                self._count("timeout")
                raise PortalError(
                    "PORTAL_UNAVAILABLE",
                    f"portal did not answer within {self._timeout.total}s",
                    outage=True,
                ) from None
            except aiohttp.InvalidURL:
                self._count("error")
                raise bad_response("portal sent an unusable URL") from None
            except aiohttp.ClientError as exc:
                self._count("error")
                raise PortalError(
                    "PORTAL_UNAVAILABLE", f"portal unreachable ({type(exc).__name__})", outage=True
                ) from exc
            _log.debug(
                "portal_request",
                method=method,
                host=url.host,
                path=url.path,
                status=status,
                sent_at=round(sent_at, 6),
                elapsed_ms=round((time.monotonic() - started) * 1000),
            )
            if status >= 500 or status == 429:
                self._count("unavailable" if status >= 500 else "rate_limited")
                raise PortalError(
                    "PORTAL_UNAVAILABLE", f"portal answered HTTP {status}", outage=status >= 500
                )
            if status >= 400 or (
                refused is not None
                and status not in _REDIRECT_STATUSES
                and refused(body) is not None
            ):
                self._count("rejected")
            else:
                self._count("ok")
            if status in _REDIRECT_STATUSES and location:
                try:
                    url = url.join(URL(location, encoded=True))
                except ValueError:
                    raise bad_response("portal redirected to an invalid URL") from None
                if status in (301, 302, 303):
                    method, data, headers = "GET", None, None
                continue
            return _Page(url=url, status=status, body=body)
        raise bad_response("portal redirected too many times")


def _expect_ok(page: _Page) -> _Page:
    if page.status >= 400:
        raise bad_response(f"portal answered HTTP {page.status}")
    return page
