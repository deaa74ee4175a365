"""Fixtures for the acceptance tests: the daemon as a subprocess, with its outside world.

Everything here is synchronous (the daemon harness blocks), so the fake portal runs in
an event loop of its own on a thread (`portal_thread`), where tests can still read its
records (`login_attempts`, `requests`) and flip its switches.
"""

from __future__ import annotations

import asyncio
import http.client
import json
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import DaemonProcess
from testkit.fakes.portal import FakePortal, Student, sample_student
from testkit.moto import MotoServer, free_port

from outboxd.security import generate_key
from outboxd.storage.db import sqlite_path
from tests.acceptance.claimer_rig import KEY, KEY_ENV, ClaimerRig
from tests.reliability.harness import Db
from tests.support import postgres as pg
from tests.support.config import merge
from tests.support.db import raw_rows
from tests.support.loop_thread import LoopThread
from tests.support.postgres import dump_all
from tests.support.responses import Response

# ---------------------------------------------------------------- the fake portal, threaded


class PortalThread:
    """A FakePortal served from a LoopThread of its own."""

    def __init__(self, students: list[Student] | None = None) -> None:
        self.portal = FakePortal(students)
        self.lt = LoopThread()
        self.run(self.portal.start)

    def run(self, fn: Callable[[], Any]) -> Any:
        """Run `fn` (a plain function or a coroutine function) on the portal's loop."""

        async def call() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out

        return self.lt.run(call(), timeout_s=30)

    def add_student(self, student: Student) -> None:
        self.run(lambda: self.portal.students.__setitem__(student.sno, student))

    def login_attempts(self, sno: str) -> int:
        return int(self.run(lambda: self.portal.login_attempts.get(sno, 0)))

    @property
    def urls(self) -> dict[str, str]:
        return self.portal.where()

    def close(self) -> None:
        try:
            self.run(self.portal.stop)
        finally:
            self.lt.close()


@pytest.fixture
def portal_thread() -> Iterator[PortalThread]:
    """The strict fake portal with the sample student, on loopback."""
    p = PortalThread([sample_student()])
    try:
        yield p
    finally:
        p.close()


# ---------------------------------------------------------------- daemon configuration


@pytest.fixture
def secret_keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "outboxd.keys"
    path.write_text(generate_key() + "\n", encoding="ascii")
    path.chmod(0o600)
    return path


ConfigFactory = Callable[..., dict[str, Any]]


@pytest.fixture
def pipeline_config(
    db_url: str,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    portal_thread: PortalThread,
    secret_keys_file: Path,
) -> ConfigFactory:
    """A daemon config on the test's database, queues and fake portal, with small
    timings so recovery is quick; keyword sections are merged over it."""

    def factory(**sections: Any) -> dict[str, Any]:
        base: dict[str, Any] = {
            "server": {"host": "127.0.0.1", "port": 0},
            "storage": {"url": db_url},
            "sqs": {
                "endpoint_url": moto_server.endpoint_url,
                **queue_names,
                "wait_time_s": 1,
                "visibility_timeout_s": 2,
                "max_receive_count": 5,
            },
            "relay": {
                "interval_s": 0.2,
                "publish_timeout_s": 1.0,
                "backoff_base_s": 0.2,
                "backoff_max_s": 1.0,
            },
            "consumer": {"heartbeat_s": 0.5, "backoff_base_s": 0},
            "scrapers": {"suwon": {**portal_thread.urls, "timeout_s": 5.0, "min_interval_s": 0.0}},
            "security": {"keys_file": str(secret_keys_file)},
            "logging": {"level": "info", "format": "json"},
            "daemon": {"shutdown_timeout_s": 5.0},
        }
        return merge(base, sections)

    return factory


def offline_config(moto: MotoServer, sqlite_file: str, **sections: Any) -> dict[str, Any]:
    """A daemon on a SQLite file (relative: beside its config) and queues of its own on the
    test's moto, its portal a loopback port nobody listens on, so nothing leaves the
    machine; keyword sections are merged over it."""
    tag = uuid.uuid4().hex[:10]
    dead_end = f"http://127.0.0.1:{free_port()}"
    base = {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": f"sqlite:///{sqlite_file}"},
        "sqs": {
            "endpoint_url": moto.endpoint_url,
            "jobs_queue": f"q{tag}-jobs",
            "tasks_queue": f"q{tag}-tasks.fifo",
            "wait_time_s": 1,
        },
        "daemon": {"shutdown_timeout_s": 5},
        "scrapers": {"suwon": {"portal_base_url": dead_end, "info_base_url": dead_end}},
    }
    return merge(base, sections)


DaemonFactory = Callable[..., DaemonProcess]


@pytest.fixture
def spawn_daemon(tmp_path: Path) -> Iterator[DaemonFactory]:
    """DaemonProcess objects (not started), all SIGKILLed at the end if still running."""
    made: list[DaemonProcess] = []

    def factory(config: Mapping[str, Any], name: str = "daemon") -> DaemonProcess:
        d = DaemonProcess(tmp_path / name, config, name=name)
        made.append(d)
        return d

    yield factory
    for d in made:
        d.kill()


@pytest.fixture
def pipeline_daemon(pipeline_config: ConfigFactory, spawn_daemon: DaemonFactory) -> DaemonProcess:
    """A daemon (not started) with every role on pipeline_config() as it is."""
    return spawn_daemon(pipeline_config())


@pytest.fixture
def fresh_db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """A database nobody has created (SQLite) or migrated (Postgres) yet: the shared
    Postgres one already is."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'fresh' / 'outboxd.db'}"
        return
    request.getfixturevalue("pg_database")  # skips or fails like the others when unreachable
    name, dsn = pg.create_database()
    try:
        yield dsn
    finally:
        pg.drop_database(name)


@pytest.fixture
def private_moto(tmp_path: Path) -> Iterator[MotoServer]:
    """A moto server of this test's own, to stop and start (an SQS outage)."""
    server = MotoServer(tmp_path / "private-moto.log")
    server.start()
    try:
        yield server
    finally:
        server.stop()


# ---------------------------------------------------------------- HTTP


# What a client sees when the server dies mid-request or is not there.
CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    urllib.error.URLError,
    ConnectionError,
    http.client.RemoteDisconnected,
    http.client.IncompleteRead,
    TimeoutError,
)


def http_request(
    method: str,
    url: str,
    body: Any = None,
    headers: Mapping[str, str] | None = None,
    timeout_s: float = 15.0,
    raw: bytes | None = None,
) -> Response:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    hdrs = {"Content-Type": "application/json"} if data is not None else {}
    hdrs.update(headers or {})
    if not url.startswith("http://127.0.0.1:"):
        raise ValueError(f"tests talk to loopback daemons only, not {url!r}")
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)  # noqa: S310
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            return Response(resp.status, dict(resp.headers.items()), resp.read())
    except urllib.error.HTTPError as err:
        with err:
            return Response(err.code, dict(err.headers.items()), err.read())


# ---------------------------------------------------------------- the database, read directly


def db_rows(db_url: str, query: str, *args: Any) -> list[dict[str, Any]]:
    """Rows of `query` through the one raw reader (tests/support/db.py), from sync code."""
    return asyncio.run(raw_rows(db_url, query, *args))


def db_bytes(db_url: str) -> bytes:
    """Everything the database holds, as bytes: the SQLite file with its -wal and -shm
    (free pages included), or every row of every Postgres table."""
    if db_url.startswith("sqlite:///"):
        path = sqlite_path(db_url, Path.cwd())
        return b"".join(p.read_bytes() for p in sorted(path.parent.glob(path.name + "*")))
    return asyncio.run(dump_all(db_url)).encode("utf-8", "replace")


# ---------------------------------------------------------------- the claimer's rig


@pytest.fixture
def rig(
    backend: str,
    db_url: str,
    tmp_path: Path,
    moto_server: MotoServer,
    queue_names: dict[str, str],
) -> Iterator[ClaimerRig]:
    """Daemons and a fake AI process on the test's database and queues (claimer_rig.py)."""
    env = {KEY_ENV: KEY, "OUTBOXD_SECRET_KEYS": generate_key()}
    rig = ClaimerRig(backend, db_url, Db(db_url), tmp_path, moto_server, queue_names, env)
    try:
        yield rig
    finally:
        rig.close()
