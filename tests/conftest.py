"""Fixtures shared by every layer: backends, the SQS server, settings, an in-process API."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from testkit.moto import MotoServer

from outboxd.config import Settings
from outboxd.config_file import settings_from_mapping
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore, open_store
from tests.support import postgres as pg
from tests.support import waits
from tests.support.config import merge
from tests.support.live_api import LiveApi
from tests.support.sdnotify import short_tmp_dir

# A test run started by systemd (stdout to the journal) must not make every daemon the
# tests spawn prefix its log lines with `<N>`: only the tests that set it get journald mode.
os.environ.pop("JOURNAL_STREAM", None)

BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)]
# For a behaviour only one backend has (LISTEN/NOTIFY, a pool, one file's write lock): the
# test runs on that one, never on both with a skip.
postgres_only = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)
sqlite_only = pytest.mark.parametrize("backend", ["sqlite"])


@pytest.fixture(autouse=True)
def _real_clock_marker(request: pytest.FixtureRequest) -> Iterator[None]:
    """Lets support/waits.consistently run only in tests marked real_clock."""
    waits.real_clock_allowed = request.node.get_closest_marker("real_clock") is not None
    yield
    waits.real_clock_allowed = False


@pytest.fixture(scope="session")
def pg_database() -> Iterator[str]:
    """A database of this session's own (dropped at the end)."""
    reason = pg.unreachable_reason()
    if reason is not None:
        if pg.required():
            pytest.fail(f"OUTBOXD_REQUIRE_POSTGRES is set but Postgres is unreachable: {reason}")
        pytest.skip(f"no Postgres reachable: {reason}")
    name, dsn = pg.create_database()
    yield dsn
    pg.drop_database(name)


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db_url(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """A fresh, empty database on the test's backend."""
    if backend == "sqlite":
        return f"sqlite:///{tmp_path / 'outboxd.db'}"
    dsn = str(request.getfixturevalue("pg_database"))
    pg.truncate(dsn)
    return dsn


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto") / "moto.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def queue_names() -> dict[str, str]:
    """Queue names of this test's own, so tests sharing one moto never see each other."""
    tag = uuid.uuid4().hex[:12]
    return {"jobs_queue": f"t{tag}-jobs", "tasks_queue": f"t{tag}-tasks.fifo"}


SettingsFactory = Callable[..., Settings]


@pytest.fixture
def make_settings(db_url: str, tmp_path: Path) -> SettingsFactory:
    """Settings on the test's database; keyword sections override the defaults."""

    def factory(**sections: dict[str, Any]) -> Settings:
        base: dict[str, Any] = {
            "server": {"host": "127.0.0.1", "port": 0},
            "storage": {"url": db_url, "acquire_timeout_s": 2.0},
            "sqs": {"endpoint_url": None, "create_queues": True},
            "logging": {"level": "debug"},
        }
        return settings_from_mapping(merge(base, sections), env={}, base_dir=tmp_path)

    return factory


@pytest.fixture
def keys() -> KeyRing:
    return KeyRing([os.urandom(32)])


@pytest_asyncio.fixture
async def store(db_url: str, tmp_path: Path) -> AsyncIterator[SqlStore]:
    s = await open_store(db_url, tmp_path, 5, 2.0)
    await s.db.migrate()
    yield s
    await s.close()


@pytest_asyncio.fixture
async def api(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> AsyncIterator[TestClient[Any, Any]]:
    """The API in-process with no queue configured: jobs stay QUEUED with a PENDING row."""
    settings = make_settings()
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    client: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    yield client
    await client.close()


@pytest.fixture
def make_live_api(
    db_url: str, make_settings: SettingsFactory, tmp_path: Path
) -> Iterator[Callable[..., LiveApi]]:
    """The daemon's real listener in-process (support/live_api.py) on the test's database;
    keyword sections override the settings. Each is closed at the end."""
    made: list[LiveApi] = []

    def factory(**sections: dict[str, Any]) -> LiveApi:
        made.append(LiveApi(db_url, make_settings(**sections), tmp_path))
        return made[-1]

    yield factory
    for live in made:
        live.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A fresh folder under /tmp, for AF_UNIX socket paths (tmp_path can be too long)."""
    with short_tmp_dir() as path:
        yield path
