"""The claimer end to end: `outboxd serve` subprocesses, a standalone fake AI, a real database.

- two daemons on one Postgres share the work outbox: no website is called twice, and two
  drain a backlog faster than one (the ratio is printed, not asserted);
- a daemon SIGKILLed while its row is PROCESSING: after `processing_timeout_s` another
  instance (Postgres) or the restarted one (SQLite) finishes it;
- the rules provider of the shipped config.toml classifies with no outside service.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sqlite3
import time
import tomllib
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from outboxd.security import generate_key
from tests.support.daemon import DaemonProcess, FakeProcess
from tests.support.moto import MotoServer

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
KEY_ENV = "FAKE_AI_KEY"
KEY = "sk-e2e-claimer-77c1"


# --- helpers --------------------------------------------------------------------------------


def http(method: str, url: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    assert url.startswith("http://127.0.0.1:"), url  # loopback only
    req = urllib.request.Request(url, data=data, method=method)  # noqa: S310
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def register(base_url: str, domain: str) -> dict[str, Any]:
    status, body = http("POST", f"{base_url}/v1/websites", {"domain": domain})
    assert status == 201, body
    return dict(body)


def get_website(base_url: str, domain: str) -> dict[str, Any]:
    status, body = http("GET", f"{base_url}/v1/websites/{urllib.parse.quote(domain)}")
    assert status == 200, body
    return dict(body)


class Db:
    """Synchronous reads of the daemons' database, for polling from a sync test."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._runner: asyncio.Runner | None = None
        self._conn: Any = None
        if url.startswith("postgresql://"):
            self._runner = asyncio.Runner()
            self._conn = self._runner.run(asyncpg.connect(url, timeout=5))

    def rows(self, sql: str) -> list[dict[str, Any]]:
        if self._runner is not None:
            return [dict(r) for r in self._runner.run(self._conn.fetch(sql))]
        path = self.url.removeprefix("sqlite:///")
        if not Path(path).exists():
            return []
        conn = sqlite3.connect(path, timeout=5)
        conn.row_factory = sqlite3.Row
        try:
            return [dict(r) for r in conn.execute(sql).fetchall()]
        except sqlite3.OperationalError as exc:  # tables not migrated yet
            if "no such table" in str(exc):
                return []
            raise
        finally:
            conn.close()

    def work(self) -> dict[str, dict[str, Any]]:
        """Every work row with its website's domain and category, by domain."""
        rows = self.rows(
            "SELECT w.domain, w.category, o.status, o.attempt_count, o.attempted_at"
            " FROM work_outbox o JOIN websites w ON w.id = o.website_id"
        )
        return {r["domain"]: r for r in rows}

    def close(self) -> None:
        if self._runner is not None:
            self._runner.run(self._conn.close())
            self._runner.close()
            self._runner = None


def wait_for(
    predicate: Callable[[], bool], timeout_s: float, what: str, poll_s: float = 0.05
) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(poll_s)


def read_record(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_overlap_per_domain(calls: list[dict[str, Any]]) -> None:
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_domain.setdefault(call["domain"], []).append(call)
    for domain, items in by_domain.items():
        items.sort(key=lambda c: c["start"])
        for a, b in itertools.pairwise(items):
            assert b["start"] >= a["end"], f"two concurrent calls for {domain}: {a} {b}"


def daemon_config(
    db_url: str,
    moto: MotoServer,
    queue_names: dict[str, str],
    classifier: dict[str, Any],
    **claimer: float,
) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": db_url},
        "sqs": {"endpoint_url": moto.endpoint_url, "region": "us-east-1", **queue_names},
        "claimer": {
            "fixed_delay_s": 0.2,
            "retry_delay_s": 1.0,
            "processing_timeout_s": 2.0,
            "max_attempts": 5,
            **claimer,
        },
        "scrapers": {"classifier": classifier},
        "daemon": {"roles": ["api", "claimer"], "shutdown_timeout_s": 5.0},
        "logging": {"level": "info", "format": "json"},
    }


def openai_classifier(ai: FakeProcess) -> dict[str, Any]:
    return {
        "provider": "openai",
        "base_url": ai.info["base_url"],
        "model": "fake-model",
        "api_key_env": KEY_ENV,
        # Below claimer.processing_timeout_s, as config validation requires.
        "timeout_s": 1.8,
    }


@pytest.fixture
def daemons() -> Iterator[list[DaemonProcess]]:
    """Every daemon a test starts; killed at the end whatever happened."""
    made: list[DaemonProcess] = []
    yield made
    for d in made:
        d.kill()


@pytest.fixture
def fakes() -> Iterator[list[FakeProcess]]:
    made: list[FakeProcess] = []
    yield made
    for f in made:
        f.stop()


@pytest.fixture
def env() -> dict[str, str]:
    return {KEY_ENV: KEY, "OUTBOXD_SECRET_KEYS": generate_key()}


@pytest.fixture
def db(db_url: str) -> Iterator[Db]:
    d = Db(db_url)
    yield d
    d.close()


# --- two daemons on one Postgres ------------------------------------------------------------


@pytest.mark.parametrize("backend", [pytest.param("postgres", marks=pytest.mark.postgres)])
def test_two_daemons_share_the_work_and_never_call_for_one_website_twice(
    backend: str,
    db_url: str,
    db: Db,
    tmp_path: Path,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    env: dict[str, str],
    daemons: list[DaemonProcess],
    fakes: list[FakeProcess],
) -> None:
    record = tmp_path / "ai-calls.jsonl"
    ai = FakeProcess(
        tmp_path,
        "tests.fakes.ai",
        "--api-key",
        KEY,
        "--delay-s",
        "0.3",
        "--record-file",
        str(record),
    )
    fakes.append(ai)
    config = daemon_config(db_url, moto_server, queue_names, openai_classifier(ai))
    one = DaemonProcess(tmp_path / "one", config, env=env, name="one")
    two = DaemonProcess(tmp_path / "two", config, env=env, name="two")
    daemons.extend([one, two])
    n = 8

    def drain(prefix: str, apis: list[str]) -> float:
        domains = [f"{prefix}-{i}.example" for i in range(n)]
        started = time.monotonic()
        for i, domain in enumerate(domains):
            register(apis[i % len(apis)], domain)

        def done() -> bool:
            work = db.work()
            return all(work.get(d, {}).get("status") == "COMPLETED" for d in domains)

        wait_for(done, 60, f"{n} websites classified ({prefix})")
        return time.monotonic() - started

    url_one = one.start()
    alone_s = drain("alone", [url_one])
    url_two = two.start()
    together_s = drain("together", [url_one, url_two])
    ratio = alone_s / together_s
    print(
        f"\nclaimer throughput: 1 daemon {n} websites in {alone_s:.2f}s, "
        f"2 daemons in {together_s:.2f}s, ratio {ratio:.2f}"
    )

    calls = read_record(record)
    domains = [c["domain"] for c in calls]
    assert len(calls) == 2 * n, calls  # nothing failed: exactly one call per website
    assert sorted(domains) == sorted(set(domains))
    assert all(c["status"] == 200 for c in calls)
    assert_no_overlap_per_domain(calls)
    work = db.work()
    assert len(work) == 2 * n
    assert all(r["category"] == "technology" and r["attempt_count"] == 1 for r in work.values())
    # Both instances took part once two were running.
    for d in (one, two):
        classified = [e for e in d.events() if e.get("event") == "website_classified"]
        assert any(str(e.get("domain", "")).startswith("together-") for e in classified), (
            d.config_path.stem
        )
    assert one.terminate() == 0
    assert two.terminate() == 0


# --- a daemon killed with a row in PROCESSING ------------------------------------------------


def test_a_row_left_processing_by_a_killed_daemon_is_finished_after_the_timeout(
    backend: str,
    db_url: str,
    db: Db,
    tmp_path: Path,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    env: dict[str, str],
    daemons: list[DaemonProcess],
    fakes: list[FakeProcess],
) -> None:
    record = tmp_path / "ai-calls.jsonl"
    ai = FakeProcess(
        tmp_path,
        "tests.fakes.ai",
        "--api-key",
        KEY,
        "--delay-s",
        "1.0",
        "--record-file",
        str(record),
        "--category",
        "crash.example=finance",
    )
    fakes.append(ai)
    timeout_s = 2.0
    config = daemon_config(
        db_url, moto_server, queue_names, openai_classifier(ai), processing_timeout_s=timeout_s
    )
    first = DaemonProcess(tmp_path / "first", config, env=env, name="first")
    daemons.append(first)
    url = first.start()
    register(url, "crash.example")

    wait_for(
        lambda: db.work().get("crash.example", {}).get("status") == "PROCESSING",
        15,
        "the row to be claimed",
        poll_s=0.01,
    )
    time.sleep(0.3)  # into the 1 s provider call, most likely
    first.kill()  # SIGKILL with the row PROCESSING
    held = db.work()["crash.example"]
    assert held["status"] == "PROCESSING"
    assert held["category"] is None

    if backend == "postgres":
        # Another instance, never told anything about the dead one.
        finisher = DaemonProcess(tmp_path / "second", config, env=env, name="second")
        daemons.append(finisher)
        url = finisher.start()
    else:
        # SQLite: one instance per file, so the same daemon restarts.
        finisher = first
        url = finisher.start()

    wait_for(
        lambda: db.work()["crash.example"]["status"] == "COMPLETED",
        30,
        "the stale row to be finished",
    )
    body = get_website(url, "crash.example")
    assert body["category"] == "finance"
    assert body["classification"]["status"] == "COMPLETED"
    assert body["classification"]["lastError"] is None

    # The dead holder's call (when it got that far before the kill) and the finisher's:
    # one after the other, the finisher's no sooner than processing_timeout_s after the
    # dead holder's claim.
    calls = sorted(read_record(record), key=lambda c: c["start"])
    assert [c["domain"] for c in calls] in (["crash.example"], ["crash.example"] * 2), calls
    assert calls[-1]["status"] == 200
    assert_no_overlap_per_domain(calls)
    assert calls[-1]["start"] - held["attempted_at"] >= timeout_s - 0.05
    print(f"\nprovider calls for the killed daemon's row: {len(calls)}")
    assert finisher.terminate() == 0


# --- the rules provider of the shipped config --------------------------------------------------


def test_the_shipped_rules_classify_with_no_outside_service(
    tmp_path: Path,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    daemons: list[DaemonProcess],
) -> None:
    shipped = tomllib.loads((REPO_ROOT / "config.toml").read_text())
    classifier = shipped["scrapers"]["classifier"]
    assert classifier["provider"] == "rules"
    db_url = f"sqlite:///{tmp_path / 'rules.db'}"
    config = daemon_config(db_url, moto_server, queue_names, classifier)
    # No API key, no provider URL: nothing outside the process is asked.
    daemon = DaemonProcess(tmp_path / "rules", config, env={}, name="rules")
    daemons.append(daemon)
    url = daemon.start()
    expected = {
        "www.suwon.ac.kr": "education",
        "cs.mit.edu": "education",
        "www.irs.gov": "government",
        "dailynews.example": "news",
        "myshop.example": "shopping",
        "citybank.example": "finance",
        "example.org": "other",
    }
    for domain in expected:
        register(url, domain)

    def all_done() -> bool:
        return all(get_website(url, d)["classification"]["status"] == "COMPLETED" for d in expected)

    wait_for(all_done, 30, "every website classified", poll_s=0.2)
    for domain, category in expected.items():
        body = get_website(url, domain)
        assert body["category"] == category, domain
        assert body["classification"] == {"status": "COMPLETED", "attempts": 1, "lastError": None}
    assert daemon.terminate() == 0
