"""A strict fake of the Suwon portal and info system (docs/portal.md), served on loopback.

Two real aiohttp servers on 127.0.0.1: the portal and the info system, on different ports
with different cookie names. Each step checks the state the previous one left behind, so
a client that skips a step, loses a cookie or mangles the SSO ticket fails as it would
against the real thing:

- `POST /enpass/login` without the index page's session cookie answers a 400 error page.
- `mainLogin.face` without a logged-in portal session answers a JS redirect to the login
  page (no ticket).
- `/sso_security_check` without a valid, unused one-time ticket, or with its query string
  re-encoded, answers 403. The info system learns the user only from that ticket.
- Info JSON calls need `Content-Type: application/json` and `Origin: <info base URL>`
  (else 400), and the info session cookie (else the session-expired JSON with status 200).

Use in tests::

    async with FakePortal() as portal:   # default student SAMPLE_SNO / SAMPLE_PASSWORD
        settings = SuwonScraperSettings(portal_base_url=portal.portal_base_url,
                                        info_base_url=portal.info_base_url)
        portal.fail_next_n_with_503(1)   # or always_fail_503, delay_s, garbage, ...

Standalone (for tests that run the daemon as a subprocess)::

    python -m testkit.fakes.portal --port-file PATH [--fail-first-n N] [--delay-s X]

writes `{"portal_base_url": ..., "info_base_url": ...}` to PATH once both servers listen,
and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

# The sample student has one home, shared with bench/e2e.py.
from testkit.daemon import SAMPLE_PASSWORD as SAMPLE_PASSWORD
from testkit.daemon import SAMPLE_SNO as SAMPLE_SNO
from testkit.fakes.common import FakeServer, serve_until_signalled

Scalar = str | int | float
"""A value as the info system may send it: the real one mixes numbers and numeric strings."""

PORTAL_COOKIE = "ENVIEW_SESSIONID"
INFO_COOKIE = "INFO_JSESSIONID"
SESSION_EXPIRED_JSON: dict[str, str] = {
    "errorMessage": "세션이 만료되었습니다. 다시 로그인하세요.",
    "errorCode": "SESSION_EXPIRED",
}
TICKET_TTL_S = 60.0


@dataclass
class Course:
    code: str
    title: str
    credits: Scalar
    grade: str
    grade_points: Scalar
    category: str
    department: str


@dataclass
class Semester:
    year: Scalar  # cretGainYear, e.g. "2024" or 2024
    code: Scalar  # cretSmrCd: 10 first, 15 summer, 20 second, 25 winter
    credits_attempted: Scalar
    credits_earned: Scalar
    gpa: Scalar
    percentile: Scalar
    rank: str  # "6/33"
    courses: list[Course] = field(default_factory=list)
    name: str = ""  # cretSmrNm, e.g. "1학기"


@dataclass
class Totals:
    credits_attempted: Scalar
    credits_earned: Scalar
    gpa: Scalar
    percentile: Scalar


@dataclass
class Student:
    sno: str
    password: str
    name: str
    college: str
    department: str
    major: str
    status: str
    year: Scalar  # year of study ("grade")
    semesters: list[Semester] = field(default_factory=list)
    totals: Totals | None = None  # None: sums of credits, credit-weighted GPA and percentile


def sample_student() -> Student:
    """The default student: three semesters (one summer), numbers mixing strings and numbers."""
    return Student(
        sno=SAMPLE_SNO,
        password=SAMPLE_PASSWORD,
        name="김수원",
        college="IT대학",
        department="컴퓨터학부",
        major="컴퓨터SW",
        status="재학",
        year="3",
        semesters=[
            Semester(
                year="2020",
                code="10",
                credits_attempted="18",
                credits_earned=18,
                gpa="4.12",
                percentile=93.5,
                rank="6/33",
                name="1학기",
                courses=[
                    Course("CS101", "자료구조", "3", "A+", 4.5, "전공필수", "컴퓨터학부"),
                    Course("GE110", "글쓰기와 소통", 2, "B+", "3.5", "교양필수", "교양대학"),
                ],
            ),
            Semester(
                year=2020,
                code=15,
                credits_attempted=3,
                credits_earned="3",
                gpa=4.0,
                percentile="90",
                rank="1/5",
                name="하계계절학기",
                courses=[Course("GE201", "창업과 혁신", 3, "A0", "4.0", "교양선택", "교양대학")],
            ),
            Semester(
                year="2020",
                code="20",
                credits_attempted=19.0,
                credits_earned="19",
                gpa="3.85",
                percentile="91.2",
                rank="8/33",
                name="2학기",
                courses=[
                    Course("CS201", "운영체제", 3.0, "A0", 4.0, "전공필수", "컴퓨터학부"),
                    Course("CS230", "캡스톤 세미나", "1", "P", "0", "전공선택", "컴퓨터학부"),
                ],
            ),
        ],
        totals=Totals(credits_attempted="40", credits_earned=40, gpa="3.99", percentile=92.1),
    )


def _totals(student: Student) -> Totals:
    if student.totals is not None:
        return student.totals
    attempted = sum(float(s.credits_attempted) for s in student.semesters)
    earned = sum(float(s.credits_earned) for s in student.semesters)
    weight = attempted or 1.0

    def weighted(attr: str) -> float:
        return round(
            sum(float(getattr(s, attr)) * float(s.credits_attempted) for s in student.semesters)
            / weight,
            2,
        )

    return Totals(attempted, earned, weighted("gpa"), weighted("percentile"))


def _page(title: str, body: str, status: int = 200) -> web.Response:
    html = f"<html><head><title>{title}</title></head><body>{body}</body></html>"
    return web.Response(status=status, text=html, content_type="text/html", charset="utf-8")


def _redirect(location: str) -> web.Response:
    return web.Response(status=302, headers={"Location": location})


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class FakePortal(FakeServer):
    """The portal and info servers plus switches to make them fail; see the module docstring.

    Switches (set any time): `always_fail_503`, `always_expire`, `delay_s`, `garbage`,
    `locked_users`, `sso_quote` (quote character of the JS redirect), `broken_sso_page`
    (mainLogin.face answers a page without `location.href`), `reject_status` (the HTTP
    status of the wrong-password / unknown-user / locked pages: 200 as the real portal,
    or e.g. 401 to check a rejection is recognised by its text, whatever the status); methods
    `fail_next_n_with_503(n)` and `expire_sessions_after(n)`.
    Records: `login_attempts`, `requests`, `in_flight_max`, `sessions` (per student: the
    monotonic start of the first and end of the last request made as them, login included),
    `calls` (every request as (monotonic start, end, the student it was made as or None,
    path, status)).
    """

    def __init__(self, students: list[Student] | None = None) -> None:
        self.students: dict[str, Student] = {
            s.sno: s for s in (students if students is not None else [sample_student()])
        }
        self.portal_base_url = ""
        self.info_base_url = ""
        # Failure switches.
        self.always_fail_503 = False
        self.always_expire = False
        self.delay_s = 0.0
        self.garbage = False
        self.broken_sso_page = False
        self.sso_quote = '"'
        self.locked_users: set[str] = set()
        self.reject_status = 200
        # Records.
        self.login_attempts: dict[str, int] = {}
        self.requests: list[tuple[float, str, str]] = []
        self.calls: list[tuple[float, float, str | None, str, int]] = []
        self.in_flight_max = 0
        self.sessions: dict[str, list[float]] = {}
        self._in_flight = 0
        self._fail_503_left = 0
        self._expire_after: int | None = None
        # Server state: portal session id -> logged-in sno (None before login).
        self._portal_sessions: dict[str, str | None] = {}
        # ticket -> (sno, the exact raw query string issued, expiry on the monotonic clock)
        self._tickets: dict[str, tuple[str, str, float]] = {}
        self._info_sessions: dict[str, str] = {}
        self._runners: list[web.AppRunner] = []

    # --- switches ------------------------------------------------------------------------

    def fail_next_n_with_503(self, n: int) -> None:
        """The next `n` requests, to either server and any path, answer 503."""
        self._fail_503_left = n

    def expire_sessions_after(self, n: int) -> None:
        """After `n` more info data calls succeed, the next one finds every info session expired.

        Happens once: sessions made by a later SSO hand-off work normally.
        """
        self._expire_after = n

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self, host: str = "127.0.0.1") -> None:
        self.portal_base_url = await self._serve(self._portal_app(), host)
        self.info_base_url = await self._serve(self._info_app(), host)

    async def stop(self) -> None:
        runners, self._runners = self._runners, []
        for runner in runners:
            await runner.cleanup()

    def where(self) -> dict[str, str]:
        return {"portal_base_url": self.portal_base_url, "info_base_url": self.info_base_url}

    async def _serve(self, app: web.Application, host: str) -> str:
        # handler_cancellation: a client that timed out must not leave a delayed handler
        # holding up stop().
        runner = web.AppRunner(
            app, handler_cancellation=True, shutdown_timeout=0.5, access_log=None
        )
        await runner.setup()
        self._runners.append(runner)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((host, 0))
        site = web.SockSite(runner, sock)
        await site.start()
        port = sock.getsockname()[1]
        return f"http://{host}:{port}"

    @web.middleware
    async def _observe(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.monotonic()
        self.requests.append((started, request.method, request.path))
        self._in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self._in_flight)
        status = 500
        try:
            if self.delay_s > 0:
                await asyncio.sleep(self.delay_s)
            if self.always_fail_503 or self._fail_503_left > 0:
                self._fail_503_left = max(0, self._fail_503_left - 1)
                status = 503
                return web.Response(status=503, text="Service Unavailable")
            resp = await handler(request)
            status = resp.status
            return resp
        finally:
            self._in_flight -= 1
            user = await self._note_session(request, started)
            self.calls.append((started, time.monotonic(), user, request.path, status))

    async def _note_session(self, request: web.Request, started: float) -> str | None:
        user = self._info_sessions.get(request.cookies.get(INFO_COOKIE, ""))
        if user is None:
            user = self._portal_sessions.get(request.cookies.get(PORTAL_COOKIE, ""))
        if user is None and request.path == "/enpass/login":
            user = str((await request.post()).get("userId", "")) or None  # read once, cached
        if user is not None:
            span = self.sessions.setdefault(user, [started, started])
            span[1] = time.monotonic()
        return user

    # --- the portal ----------------------------------------------------------------------

    def _app(self, routes: list[tuple[str, str, Handler]]) -> web.Application:
        """One of the two servers: its routes (method, path, handler), each request observed."""
        app = web.Application(middlewares=[self._observe])
        for method, path, handler in routes:
            app.router.add_route(method, path, handler)
        return app

    def _portal_app(self) -> web.Application:
        return self._app(
            [
                ("GET", "/enview/index.jsp", self._index),
                ("POST", "/enpass/login", self._login),
                ("GET", "/enview/user/enpassLoginProcess.face", self._login_process),
                ("GET", "/enview/portal/", self._portal_main),
                ("GET", "/enview/user/mainLogin.face", self._main_login),
            ]
        )

    def _portal_user(self, request: web.Request) -> tuple[str | None, str | None]:
        sid = request.cookies.get(PORTAL_COOKIE)
        if sid is None or sid not in self._portal_sessions:
            return None, None
        return sid, self._portal_sessions[sid]

    async def _index(self, request: web.Request) -> web.StreamResponse:
        sid = secrets.token_hex(16)
        self._portal_sessions[sid] = None
        resp = _page("수원대학교 포털", '<form method="post" action="/enpass/login">로그인</form>')
        resp.set_cookie(PORTAL_COOKIE, sid, path="/", httponly=True)
        return resp

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()
        user_id = str(form.get("userId", ""))
        if user_id:
            self.login_attempts[user_id] = self.login_attempts.get(user_id, 0) + 1
        sid, _ = self._portal_user(request)
        if sid is None:
            return _page("오류", "세션 정보가 없습니다. 처음부터 다시 시도하세요.", status=400)
        service = request.query.get("service", "")
        expected_form = {"langKnd": "ko", "_enpass_login_": "submit", "gateway": "true"}
        if (
            request.query.get("_epLogin_") != "enview"
            or not service.startswith(self.portal_base_url + "/enview/user/enpassLoginProcess")
            or any(form.get(k) != v for k, v in expected_form.items())
            or form.get("username") != user_id
            or form.get("password") != form.get("pwd")
        ):
            return _page("오류", "잘못된 요청입니다.", status=400)
        student = self.students.get(user_id)
        rejected = self.reject_status
        if user_id in self.locked_users:
            return _page("로그인", "계정이 잠금 상태입니다 (account locked).", status=rejected)
        if student is None:
            return _page("로그인", "존재하지 않는 사용자입니다.", status=rejected)
        if form.get("pwd") != student.password:
            return _page("로그인", "비밀번호가 일치하지 않습니다.", status=rejected)
        # A fresh session id after login, as real portals do against session fixation.
        del self._portal_sessions[sid]
        new_sid = secrets.token_hex(16)
        self._portal_sessions[new_sid] = user_id
        resp = _redirect(service)
        resp.set_cookie(PORTAL_COOKIE, new_sid, path="/", httponly=True)
        return resp

    async def _login_process(self, request: web.Request) -> web.StreamResponse:
        _, user = self._portal_user(request)
        if user is None:
            return _redirect("/enview/index.jsp")
        return _redirect(request.query.get("destination", "/enview/portal/"))

    async def _portal_main(self, request: web.Request) -> web.StreamResponse:
        _, user = self._portal_user(request)
        if user is None:
            return _redirect("/enview/index.jsp")
        return _page("수원대학교 포털", f"{self.students[user].name}님 환영합니다.")

    async def _main_login(self, request: web.Request) -> web.StreamResponse:
        url = request.query.get("url", "")
        if url != self.info_base_url + "/sso_security_check" or (
            request.query.get("langKnd") != "ko"
        ):
            return _page("오류", "잘못된 요청입니다.", status=400)
        _, user = self._portal_user(request)
        if user is None:
            script = "alert('로그인이 필요합니다.'); location.href = '/enview/index.jsp';"
            return _page("로그인", f"<script>{script}</script>")
        if self.broken_sso_page:
            return _page("SSO", "<script>document.forms[0].submit();</script>")
        ticket = secrets.token_urlsafe(24)
        # The escapes in `sig` catch a client that lets its URL library re-encode the query.
        query = f"ticket={ticket}&sig={secrets.token_hex(4)}%2F%7E%3D&langKnd=ko"
        self._tickets[ticket] = (user, query, time.monotonic() + TICKET_TTL_S)
        q = self.sso_quote
        script = f"location.href = {q}{url}?{query}{q};"
        return _page("SSO", f"<script type='text/javascript'>{script}</script>")

    # --- the info system -----------------------------------------------------------------

    def _info_app(self) -> web.Application:
        return self._app(
            [
                ("GET", "/sso_security_check", self._sso_check),
                ("GET", "/websquare/websquare.jsp", self._websquare),
                ("POST", "/scrgBas/selectScrgBas.do", self._profile),
                ("POST", "/smrCretSum/listSmrCretSumTabYearSmrStud.do", self._semesters),
                ("POST", "/cretBas/listSmrCretSumTabSubjt.do", self._grades),
            ]
        )

    async def _sso_check(self, request: web.Request) -> web.StreamResponse:
        ticket = request.query.get("ticket", "")
        issued = self._tickets.pop(ticket, None)
        if issued is None:
            return _page("403", "유효하지 않은 접근입니다.", status=403)
        user, query, expires_at = issued
        if request.rel_url.raw_query_string != query or time.monotonic() > expires_at:
            return _page("403", "유효하지 않은 접근입니다.", status=403)
        sid = secrets.token_hex(16)
        self._info_sessions[sid] = user
        resp = _redirect("/websquare/websquare.jsp?w2xPath=/views/usw/main.xml")
        resp.set_cookie(INFO_COOKIE, sid, path="/", httponly=True)
        return resp

    async def _websquare(self, request: web.Request) -> web.StreamResponse:
        if request.cookies.get(INFO_COOKIE) not in self._info_sessions:
            return _page("403", "세션이 없습니다.", status=403)
        return _page("학사정보시스템", "<div id='websquare'></div>")

    async def _info_request(
        self, request: web.Request
    ) -> tuple[Student, dict[str, Any]] | web.Response:
        """Checks headers, session and body: (student, body), or the refusal to answer."""
        if (
            request.content_type != "application/json"
            or request.headers.get("Origin") != self.info_base_url
        ):
            return web.Response(status=400, text="Bad Request")
        try:
            body = json.loads(await request.read())
        except ValueError:
            return web.Response(status=400, text="Bad Request")
        if not isinstance(body, dict):
            return web.Response(status=400, text="Bad Request")
        user = self._info_sessions.get(request.cookies.get(INFO_COOKIE, ""))
        if user is None or self.always_expire:
            return web.json_response(SESSION_EXPIRED_JSON)
        if self._expire_after is not None:
            if self._expire_after <= 0:
                self._expire_after = None
                self._info_sessions.clear()
                return web.json_response(SESSION_EXPIRED_JSON)
            self._expire_after -= 1
        if str(body.get("sno")) != user:
            return web.json_response(
                {"errorMessage": "조회 권한이 없습니다.", "errorCode": "E_AUTH"}
            )
        if self.garbage:
            return web.json_response({"result": "OK", "data": [1, "two", None]})
        return self.students[user], body

    async def _profile(self, request: web.Request) -> web.StreamResponse:
        checked = await self._info_request(request)
        if isinstance(checked, web.Response):
            return checked
        student, _ = checked
        info = {
            "sno": student.sno,
            "nm": student.name,
            "colNm": student.college,
            "deptNm": student.department,
            "majorNm": student.major,
            "studStatNm": student.status,
            "grade": student.year,
        }
        return web.json_response({"studentInfo": info})

    async def _semesters(self, request: web.Request) -> web.StreamResponse:
        checked = await self._info_request(request)
        if isinstance(checked, web.Response):
            return checked
        student, _ = checked
        rows = [
            {
                "sno": student.sno,
                "cretGainYear": s.year,
                "cretSmrCd": s.code,
                "applPoint": s.credits_attempted,
                "gainPoint": s.credits_earned,
                "gainAvmk": s.gpa,
                "gainTavgPont": s.percentile,
                "dpmjOrdp": s.rank,
            }
            for s in student.semesters
        ]
        totals = _totals(student)
        total = {
            "applPoint": totals.credits_attempted,
            "gainPoint": totals.credits_earned,
            "gainAvmk": totals.gpa,
            "gainTavgPont": totals.percentile,
        }
        return web.json_response(
            {"listSmrCretSumTabYearSmr": rows, "selectSmrCretSumTabSjTotal": total}
        )

    async def _grades(self, request: web.Request) -> web.StreamResponse:
        checked = await self._info_request(request)
        if isinstance(checked, web.Response):
            return checked
        student, body = checked
        if "cretGainYear" not in body or "cretSmrCd" not in body:
            return web.Response(status=400, text="Bad Request")
        courses = [
            {
                "subjtCd": c.code,
                "subjtNm": c.title,
                "gainPoint": c.credits,
                "cretGrdCd": c.grade,
                "gainGpa": c.grade_points,
                "facDvnm": c.category,
                "estbDpmjNm": c.department,
                "cretSmrNm": s.name,
            }
            for s in student.semesters
            if str(s.year) == str(body["cretGainYear"]) and str(s.code) == str(body["cretSmrCd"])
            for c in s.courses
        ]
        return web.json_response({"listSmrCretSumTabSubjt": courses})


# --- standalone -----------------------------------------------------------------------------


async def _serve_forever(port_file: Path, fail_first_n: int, delay_s: float) -> None:
    portal = FakePortal()
    portal.fail_next_n_with_503(fail_first_n)
    portal.delay_s = delay_s
    await serve_until_signalled(portal, port_file)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Serve the fake Suwon portal on loopback.")
    parser.add_argument("--port-file", type=Path, required=True, help="where to write the URLs")
    parser.add_argument("--fail-first-n", type=int, default=0, help="first N requests get 503")
    parser.add_argument("--delay-s", type=float, default=0.0, help="delay before every answer")
    args = parser.parse_args(argv)
    asyncio.run(_serve_forever(args.port_file, args.fail_first_n, args.delay_s))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
