"""Shared pieces of the reliability suite (its fixtures are in conftest.py); the acceptance
tests use `Db` and `http` too.

- `Fakes`: the strict fake portal (with as many students as needed, each job its own
  student) and the fake AI, both on one background event loop, recording every effect
  with wall-clock times so they can be compared with what the daemons stored;
- `daemon_config`: a daemon configuration with small timings, so recovery is quick;
- `http`: a plain synchronous HTTP client for loopback daemons; `raw_post` and
  `raw_request_settings` for properties over raw requests;
- `Db`: reads of the daemons' database with a driver of our own (never the store under
  test), from synchronous code;
- `log_events`: the JSON log lines of daemon processes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client as httpclient
import json
import sqlite3
import time
from collections import defaultdict
from collections.abc import Coroutine, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import asyncpg
from aiohttp import web
from hypothesis import HealthCheck, settings
from testkit.daemon import DaemonProcess
from testkit.fakes.ai import FakeAI
from testkit.fakes.portal import INFO_COOKIE, Course, FakePortal, Semester, Student, Totals

from outboxd.security import generate_key
from outboxd.storage.db import sqlite_path
from tests.support.config import merge
from tests.support.db import COUNTED, RawDb, raw_rows
from tests.support.loop_thread import LoopThread
from tests.support.responses import Response
from tests.support.students import it_student
from tests.support.waits import eventually_sync

AI_KEY_ENV = "RELIABILITY_AI_KEY"
AI_KEY = "sk-reliability-5150"
STUDENT_BASE = 30_000_000
JOB_TERMINAL = ("SUCCEEDED", "FAILED", "DEAD")
WORK_TERMINAL = ("COMPLETED", "FAILED")
RELAY_TERMINAL = ("SENT", "DEAD")
T = TypeVar("T")


# ------------------------------------------------------------------ the outside world


def student_number(i: int) -> str:
    return str(STUDENT_BASE + i)


def make_student(i: int) -> Student:
    """A small student (one semester, one course): one job, about ten portal requests."""
    return it_student(
        student_number(i),
        f"pw-{i}",
        f"student-{i}",
        2,
        semesters=[
            Semester(
                year=2024,
                code=10,
                credits_attempted=3,
                credits_earned=3,
                gpa=4.0,
                percentile=90,
                rank="1/10",
                name="1학기",
                courses=[Course("CS101", "자료구조", 3, "A0", 4.0, "전공필수", "컴퓨터학부")],
            )
        ],
        totals=Totals(3, 3, 4.0, 90),
    )


class RecordingPortal(FakePortal):
    """The fake portal, plus per-student records of logins and complete data fetches
    (wall clock), and a switch that resets every connection."""

    def __init__(self, n_students: int) -> None:
        super().__init__([make_student(i) for i in range(n_students)])
        self.logins: defaultdict[str, list[float]] = defaultdict(list)
        self.fetches: defaultdict[str, list[float]] = defaultdict(list)
        self.reset_connections = False

    @web.middleware
    async def _observe(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.reset_connections and request.transport is not None:
            request.transport.abort()  # an RST instead of an answer
            raise ConnectionResetError("fake portal: connection reset")
        return await super()._observe(request, handler)

    async def _login(self, request: web.Request) -> web.StreamResponse:
        form = await request.post()  # aiohttp caches the form for the real handler
        self.logins[str(form.get("userId", ""))].append(time.time())
        return await super()._login(request)

    async def _grades(self, request: web.Request) -> web.StreamResponse:
        resp = await super()._grades(request)
        user = self._info_sessions.get(request.cookies.get(INFO_COOKIE, ""))
        if resp.status == 200 and user is not None and not self.garbage:
            # One semester per student: its grades are the last piece of the record.
            self.fetches[user].append(time.time())
        return resp


class RecordingAI(FakeAI):
    """The fake AI with a connection-reset switch."""

    def __init__(self, record_file: Path) -> None:
        super().__init__(api_key=AI_KEY, record_file=record_file)
        self.reset_connections = False

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        if self.reset_connections and request.transport is not None:
            request.transport.abort()
            raise ConnectionResetError("fake AI: connection reset")
        return await super()._handle(request)


def _set_all(target: object, values: Mapping[str, Any]) -> None:
    for k, v in values.items():
        setattr(target, k, v)


class Fakes:
    """The fake portal and fake AI on one background loop."""

    def __init__(self, workdir: Path, n_students: int = 2000) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.ai_record = workdir / "ai-calls.jsonl"
        self.ai_record.unlink(missing_ok=True)
        self.thread = LoopThread()
        self.portal = RecordingPortal(n_students)
        self.ai = RecordingAI(self.ai_record)
        self.thread.run(self.portal.start())
        self.thread.run(self.ai.start())

    @property
    def portal_urls(self) -> dict[str, str]:
        return self.portal.where()

    def set_portal(self, **switches: Any) -> None:
        self.thread.call(lambda: _set_all(self.portal, switches))

    def set_ai(self, **switches: Any) -> None:
        self.thread.call(lambda: _set_all(self.ai, switches))

    def logins(self) -> dict[str, list[float]]:
        return self.thread.call(lambda: {k: list(v) for k, v in self.portal.logins.items()})

    def fetches(self) -> dict[str, list[float]]:
        return self.thread.call(lambda: {k: list(v) for k, v in self.portal.fetches.items()})

    def ai_calls(self) -> list[dict[str, Any]]:
        if not self.ai_record.exists():
            return []
        lines = self.ai_record.read_text("utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]

    def close(self) -> None:
        try:
            with contextlib.suppress(Exception):
                self.thread.run(self.ai.stop(), timeout_s=10)
            with contextlib.suppress(Exception):
                self.thread.run(self.portal.stop(), timeout_s=10)
        finally:
            self.thread.close()


# ------------------------------------------------------------------ daemons


def write_keys_file(path: Path) -> Path:
    path.write_text(generate_key() + "\n", encoding="ascii")
    path.chmod(0o600)
    return path


def daemon_config(
    db_url: str,
    sqs_endpoint: str,
    queue_names: Mapping[str, str],
    fakes: Fakes,
    keys_file: Path,
    **sections: Any,
) -> dict[str, Any]:
    """Every role, small timings: visibility 2 s, heartbeat 1 s, relay every 0.2 s,
    claimer processing timeout 2 s, and retry budgets no kill or short fault exhausts."""
    base: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": db_url, "acquire_timeout_s": 2.0},
        "sqs": {
            "endpoint_url": sqs_endpoint,
            **queue_names,
            "wait_time_s": 1,
            "visibility_timeout_s": 2,
            "max_receive_count": 20,
        },
        "relay": {
            "interval_s": 0.2,
            "publish_timeout_s": 1.0,
            "backoff_base_s": 0.2,
            "backoff_max_s": 1.0,
            "max_attempts": 50,
        },
        "consumer": {"heartbeat_s": 1.0, "backoff_base_s": 0.1, "max_concurrency": 4},
        "claimer": {
            "fixed_delay_s": 0.1,
            "retry_delay_s": 0.3,
            "processing_timeout_s": 2.0,
            "max_attempts": 50,
        },
        "scrapers": {
            "suwon": {
                **fakes.portal_urls,
                "timeout_s": 1.5,
                "min_interval_s": 0.0,
                "max_concurrency": 4,
            },
            "classifier": {
                "provider": "openai",
                "base_url": fakes.ai.base_url,
                "model": "fake-model",
                "api_key_env": AI_KEY_ENV,
                "timeout_s": 1.0,
            },
        },
        "security": {"keys_file": str(keys_file)},
        "logging": {"level": "info", "format": "json"},
        "daemon": {"shutdown_timeout_s": 3.0},
    }
    return merge(base, sections)


def new_daemon(workdir: Path, config: Mapping[str, Any], name: str) -> DaemonProcess:
    return DaemonProcess(workdir / name, config, env={AI_KEY_ENV: AI_KEY}, name=name)


# ------------------------------------------------------------------ HTTP


CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    ConnectionError,
    httpclient.HTTPException,
    TimeoutError,
    OSError,
)


@dataclass
class Resp(Response):
    """An answer with how long it took."""

    elapsed_s: float


def http(
    method: str,
    base: str,
    path: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 10.0,
) -> Resp:
    """One request on a fresh connection; raises one of CONNECTION_ERRORS when the
    daemon is not there or dies before answering."""
    if not base.startswith("http://127.0.0.1:"):
        raise ValueError(f"loopback daemons only, not {base!r}")
    host, port = base.removeprefix("http://").split(":")
    data = None if body is None else json.dumps(body).encode()
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    started = time.monotonic()
    conn = httpclient.HTTPConnection(host, int(port), timeout=timeout_s)
    try:
        conn.request(method, path, body=data, headers=hdrs)
        resp = conn.getresponse()
        payload = resp.read()
        return Resp(resp.status, dict(resp.getheaders()), payload, time.monotonic() - started)
    finally:
        conn.close()


def register_website(base: str, domain: str) -> dict[str, Any]:
    """POST /v1/websites for a new domain (201): the website."""
    resp = http("POST", base, "/v1/websites", {"domain": domain})
    assert resp.status == 201, resp.text
    return dict(resp.json())


def raw_post(path: str, body: bytes, extra: bytes = b"") -> bytes:
    """A whole POST request as bytes (JSON body, `extra` header lines), closing after."""
    return (
        f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n".encode()
        + extra
        + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )


def raw_request_settings(examples: int) -> settings:
    """Hypothesis settings for a property over raw requests: no deadline (a loaded machine
    is slow), no example database, and large or slow-to-make inputs allowed."""
    return settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


# ------------------------------------------------------------------ the database, read directly


class Db:
    """tests/support/db.py's raw reader from synchronous code, for polling while daemons
    run: a database not created or migrated yet reads as empty, and a Postgres connection
    a fault test terminates is opened again. `?` placeholders."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._runner: asyncio.Runner | None = None
        self._raw: RawDb | None = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._runner is None:
            self._runner = asyncio.Runner()
        return self._runner.run(coro)

    def rows(self, query: str, *args: Any) -> list[dict[str, Any]]:
        if self.url.startswith("sqlite:///"):
            if not sqlite_path(self.url, Path.cwd()).exists():
                return []  # a read must not create the file
            try:
                return self._run(raw_rows(self.url, query, *args))
            except sqlite3.OperationalError as exc:
                if "no such table" in str(exc):
                    return []
                raise

        lost: list[BaseException] = []

        def attempt() -> list[list[dict[str, Any]]] | None:
            try:
                if self._raw is None:
                    self._raw = self._run(RawDb(self.url).open())
                return [self._run(self._raw.rows(query, *args))]
            except asyncpg.UndefinedTableError:
                return [[]]
            except (
                OSError,
                asyncpg.PostgresConnectionError,
                asyncpg.InterfaceError,
                asyncpg.AdminShutdownError,
            ) as exc:
                self._raw = None  # terminated under us: a new one next time
                lost.append(exc)
                return None

        try:
            return eventually_sync(attempt, 1.0, what="a connection", interval=0.2)[0]
        except AssertionError:
            raise lost[-1] from None

    def scalar(self, query: str, *args: Any) -> Any:
        rows = self.rows(query, *args)
        return next(iter(rows[0].values())) if rows else None

    def counts(self) -> dict[str, int]:
        return {t: int(self.scalar(f"SELECT COUNT(*) AS n FROM {t}") or 0) for t in COUNTED}

    def close(self) -> None:
        if self._runner is not None:
            if self._raw is not None:
                with contextlib.suppress(Exception):
                    self._runner.run(self._raw.close())
            self._runner.close()
            self._runner = None
            self._raw = None


# ------------------------------------------------------------------ logs


def log_events(daemons: Iterable[DaemonProcess]) -> Iterator[dict[str, Any]]:
    """Every JSON log line of every daemon (all its starts), with `ts` as epoch seconds."""
    for d in daemons:
        for e in d.events():
            ts = e.get("timestamp")
            if isinstance(ts, str):
                with contextlib.suppress(ValueError):
                    e["ts"] = datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp()
            yield e


@dataclass
class ErrorWindow:
    """When a fault showed as errors: the first and last failing observation."""

    name: str
    fault_start: float
    fault_end: float
    failures: list[float]

    @property
    def first(self) -> float | None:
        return min(self.failures) if self.failures else None

    @property
    def last(self) -> float | None:
        return max(self.failures) if self.failures else None

    def describe(self) -> str:
        if not self.failures:
            return f"{self.name}: no failing request"
        assert self.first is not None and self.last is not None
        return (
            f"{self.name}: fault {self.fault_end - self.fault_start:.2f}s; "
            f"{len(self.failures)} failures from +{self.first - self.fault_start:.2f}s "
            f"to +{self.last - self.fault_start:.2f}s (window {self.last - self.first:.2f}s, "
            f"last failure {self.last - self.fault_end:+.2f}s after the fault ended)"
        )
