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
import math
import re
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, Protocol

import aiohttp
import structlog
from yarl import URL

from outboxd.config import SuwonScraperSettings
from outboxd.errors import OutboxdError
from outboxd.metrics import RequestOutcome

__all__ = [
    "CheckHook",
    "InstancePacing",
    "PortalError",
    "PortalErrorCode",
    "PortalPacing",
    "ProgressCallback",
    "SuwonScraper",
]

_log = structlog.get_logger(__name__)

PortalErrorCode = Literal[
    "PORTAL_AUTH_FAILED", "PORTAL_UNAVAILABLE", "PORTAL_SESSION_EXPIRED", "PORTAL_BAD_RESPONSE"
]
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


class PortalError(OutboxdError):
    """A job-level portal failure; `message` is short English text without secrets or bodies."""

    def __init__(
        self,
        code: PortalErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        outage: bool = False,
    ) -> None:
        super().__init__(message)
        self.code: PortalErrorCode = code
        self.message = message
        # Only a credential problem is final: retrying a rejected login can lock the account.
        self.retryable = code != "PORTAL_AUTH_FAILED" if retryable is None else retryable
        # The portal did not answer (refused, reset, timed out, a 5xx): its breaker counts it.
        self.outage = outage

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"PortalError(code={self.code!r}, message={self.message!r}, "
            f"retryable={self.retryable!r}, outage={self.outage!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_portal_error, (self.code, self.message, self.retryable, self.outage))


def _rebuild_portal_error(
    code: PortalErrorCode, message: str, retryable: bool, outage: bool = False
) -> PortalError:
    return PortalError(code, message, retryable=retryable, outage=outage)


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

# Legacy Korean pages may come as EUC-KR, with or without a charset header, so the markers
# are looked for as bytes in both encodings rather than trusting a decode.
_WRONG_CREDENTIALS: Final = ("비밀번호가 일치하지 않습니다", "존재하지 않는 사용자", "로그인 실패")
_LOCKED: Final = ("잠금",)
# A whole word only: "isLocked"-style identifiers in a normal page's script must not match.
_LOCKED_WORD_RE: Final = re.compile(rb"\blocked\b", re.IGNORECASE)
_JS_REDIRECT_RE: Final = re.compile(r"""location\.href\s*=\s*(["'])(.*?)\1""", re.DOTALL)
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_MAX_REDIRECTS: Final = 10

# --- Source names -> result names: the only place that knows the info system's vocabulary --

_Kind = Literal["text", "number", "term"]
# The credit figures a semester and the totals row both carry, under the same names.
_CREDIT_FIELDS: Final[tuple[tuple[str, str, _Kind], ...]] = (
    ("creditsAttempted", "applPoint", "number"),
    ("creditsEarned", "gainPoint", "number"),
    ("gpa", "gainAvmk", "number"),
    ("percentile", "gainTavgPont", "number"),
)
_FIELD_MAP: Final[Mapping[str, tuple[tuple[str, str, _Kind], ...]]] = {
    "student": (
        ("studentNumber", "sno", "text"),
        ("name", "nm", "text"),
        ("college", "colNm", "text"),
        ("department", "deptNm", "text"),
        ("major", "majorNm", "text"),
        ("status", "studStatNm", "text"),
        ("year", "grade", "number"),
    ),
    "semester": (
        ("year", "cretGainYear", "number"),
        ("term", "cretSmrCd", "term"),
        *_CREDIT_FIELDS,
        ("rank", "dpmjOrdp", "text"),
    ),
    "course": (
        ("code", "subjtCd", "text"),
        ("title", "subjtNm", "text"),
        ("credits", "gainPoint", "number"),
        ("grade", "cretGrdCd", "text"),
        ("gradePoints", "gainGpa", "number"),
        ("category", "facDvnm", "text"),
        ("department", "estbDpmjNm", "text"),
    ),
    "totals": _CREDIT_FIELDS,
}
_TERMS: Final[Mapping[str, str]] = {"10": "1", "15": "summer", "20": "2", "25": "winter"}
_PROFILE_KEY: Final = "studentInfo"
_SEMESTERS_KEY: Final = "listSmrCretSumTabYearSmr"
_TOTALS_KEY: Final = "selectSmrCretSumTabSjTotal"
_COURSES_KEY: Final = "listSmrCretSumTabSubjt"
_SEMESTER_YEAR: Final = "cretGainYear"
_SEMESTER_CODE: Final = "cretSmrCd"
_SESSION_ERROR_KEYS: Final = ("errorMessage", "errorCode")

_INT_RE: Final = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _bad(message: str) -> PortalError:
    return PortalError("PORTAL_BAD_RESPONSE", message)


def _encoded(markers: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(m.encode(enc) for m in markers for enc in ("utf-8", "euc-kr"))


_WRONG_CREDENTIALS_BYTES: Final = _encoded(_WRONG_CREDENTIALS)
_LOCKED_BYTES: Final = _encoded(_LOCKED)


def _contains_any(body: bytes, markers: tuple[bytes, ...]) -> bool:
    return any(m in body for m in markers)


def _number(value: Any, source: str) -> int | float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise _bad(f"field {source} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise _bad(f"field {source} is not a finite number")
    if isinstance(value, str):
        text = value.strip()
        if _INT_RE.fullmatch(text):
            return int(text)
        if _FLOAT_RE.fullmatch(text):
            return float(text)
    raise _bad(f"field {source} is not a number")


def _text(value: Any, source: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise _bad(f"field {source} is not text")


def _term(value: Any, source: str) -> str:
    code = _text(value, source)
    term = _TERMS.get(code.strip()) if code is not None else None
    if term is None:
        raise _bad(f"field {source} is not a known semester code")
    return term


def _map(section: str, row: Any) -> dict[str, Any]:
    """Renames and converts one source object; an absent or null leaf becomes None."""
    if not isinstance(row, dict):
        raise _bad(f"{section} is not an object")
    out: dict[str, Any] = {}
    for name, source, kind in _FIELD_MAP[section]:
        value = row.get(source)
        if kind == "number":
            out[name] = _number(value, source)
        elif kind == "term":
            out[name] = _term(value, source)
        else:
            out[name] = _text(value, source)
    return out


def _list(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, ...)
    if value is None:
        return []
    if not isinstance(value, list):
        raise _bad(f"{key} is missing or not a list")
    return value


def _json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        # `from None`: a decode error carries the whole body, which may hold personal data.
        raise _bad("info system answered something that is not JSON") from None
    if not isinstance(data, dict):
        raise _bad("info system answered JSON that is not an object")
    return data


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
        student = _map("student", profile.get(_PROFILE_KEY))

        await job.progress("SEMESTERS", 0, 0)
        summary = await self._info_call(job, _SEMESTERS_PATH, {"sno": job.username})
        rows = _list(summary, _SEMESTERS_KEY)
        semesters = [_map("semester", row) for row in rows]
        totals_row = summary.get(_TOTALS_KEY)
        totals = _map("totals", {} if totals_row is None else totals_row)

        await job.progress("GRADES", 0, len(rows))
        for done, (row, semester) in enumerate(zip(rows, semesters, strict=True), start=1):
            # Echo the row's own values: the info system compares them as it sent them.
            body = {
                "sno": job.username,
                _SEMESTER_YEAR: row.get(_SEMESTER_YEAR),
                _SEMESTER_CODE: row.get(_SEMESTER_CODE),
            }
            grades = await self._info_call(job, _GRADES_PATH, body)
            semester["courses"] = [_map("course", c) for c in _list(grades, _COURSES_KEY)]
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
            job, "POST", login, data=form, headers={"Referer": str(index)}, refused=_login_refused
        )
        # Checked before the status: a rejection must never look retryable.
        refusal = _login_refused(page.body)
        if refusal is not None:
            raise PortalError("PORTAL_AUTH_FAILED", refusal)
        _expect_ok(page)

        await job.progress("SSO", 0, 0)
        sso = URL(self._portal + _SSO_PATH.format(info=self._info), encoded=True)
        page = _expect_ok(await self._send(job, "GET", sso))
        match = _JS_REDIRECT_RE.search(page.body.decode("utf-8", errors="replace"))
        if match is None:
            raise _bad("SSO page has no location.href redirect")
        try:
            # encoded=True: the one-time ticket must reach the info system byte for byte.
            target = page.url.join(URL(match.group(2).strip(), encoded=True))
        except ValueError:
            raise _bad("SSO redirect is not a valid URL") from None
        if target.scheme not in ("http", "https") or not target.host:
            raise _bad("SSO redirect is not an http(s) URL")
        _expect_ok(await self._send(job, "GET", target))

    async def _info_call(self, job: _Job, path: str, body: dict[str, Any]) -> dict[str, Any]:
        url = URL(self._info + path, encoded=True)
        payload = json.dumps(body, ensure_ascii=False).encode()
        while True:
            page = _expect_ok(
                await self._send(job, "POST", url, data=payload, headers=self._json_headers)
            )
            data = _json_object(page.body)
            if not any(key in data for key in _SESSION_ERROR_KEYS):
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
                raise _bad("portal sent an unusable URL") from None
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
                    raise _bad("portal redirected to an invalid URL") from None
                if status in (301, 302, 303):
                    method, data, headers = "GET", None, None
                continue
            return _Page(url=url, status=status, body=body)
        raise _bad("portal redirected too many times")


def _login_refused(body: bytes) -> str | None:
    """Why the portal refused a login, by its answer page; None when it did not."""
    if _contains_any(body, _WRONG_CREDENTIALS_BYTES):
        return "portal rejected the username or password"
    if _contains_any(body, _LOCKED_BYTES) or _LOCKED_WORD_RE.search(body):
        return "portal account is locked"
    return None


def _expect_ok(page: _Page) -> _Page:
    if page.status >= 400:
        raise _bad(f"portal answered HTTP {page.status}")
    return page
