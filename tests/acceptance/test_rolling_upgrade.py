"""A rolling upgrade from the previous release to this tree on Postgres, under steady load
(docs/upgrades.md): what an operator of several instances does, with real daemons.

The previous release (tests/support/previous_release.py, built from git history) starts
on a fresh database and migrates it to its schema; portal jobs arrive a few a second. This
release starts on the same database with `storage.auto_migrate` and migrates it under the
old instance, which keeps serving; the load goes to both; the old one is stopped (SIGTERM,
after its last request was answered) and the load goes on against the new one. Then:
no request got a 5xx from either, every accepted job SUCCEEDED, nothing is stuck (no unsent
outbox row, no RUNNING job), and each instance's `outboxd_build_info` named its own release
and schema (the old one also lacks a route this release added: it really ran the old code).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from testkit.daemon import DaemonProcess
from testkit.fakes.portal import Student, sample_student
from testkit.moto import MotoServer

from outboxd import __version__
from outboxd.storage.db import known_schema_version, load_migrations
from tests.acceptance.conftest import DaemonFactory, PortalThread
from tests.conftest import postgres_only
from tests.support.db import raw_rows
from tests.support.previous_release import (
    PREVIOUS_SCHEMA,
    PREVIOUS_VERSION,
    install_previous_release,
    known_schema,
)
from tests.support.waits import eventually

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

STUDENTS = [replace(sample_student(), sno=f"2098{i:04d}") for i in range(4)]
PACE_S = 0.25  # one job submitted every PACE_S: four a second
PHASE_JOBS = 6  # accepted jobs per phase (old alone, both, new alone)


@pytest.fixture
def students_portal() -> Iterator[PortalThread]:
    """The fake portal, knowing the students the load submits jobs for."""
    p = PortalThread(list(STUDENTS))
    try:
        yield p
    finally:
        p.close()


@dataclass
class Load:
    """Portal jobs submitted every PACE_S to the instances in `targets`, in turn: each
    answer (or failure to connect) recorded with the instance that gave it."""

    targets: list[tuple[str, str]] = field(default_factory=list)  # (name, base URL)
    answers: list[tuple[str, int, dict[str, Any]]] = field(default_factory=list)
    failures: list[tuple[str, str]] = field(default_factory=list)
    in_flight: dict[str, int] = field(default_factory=dict)

    def accepted(self, name: str | None = None) -> list[str]:
        return [
            body["jobId"]
            for who, status, body in self.answers
            if status == 202 and (name is None or who == name)
        ]

    async def run(self, stop: asyncio.Event) -> None:
        turn = itertools.count()
        timeout = aiohttp.ClientTimeout(total=20)
        async with aiohttp.ClientSession(timeout=timeout) as http, asyncio.TaskGroup() as tg:
            while not stop.is_set():
                if self.targets:
                    name, base = self.targets[next(turn) % len(self.targets)]
                    tg.create_task(self._one(http, name, base, STUDENTS[len(self.answers) % 4]))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), PACE_S)

    async def _one(
        self, http: aiohttp.ClientSession, name: str, base: str, student: Student
    ) -> None:
        self.in_flight[name] = self.in_flight.get(name, 0) + 1
        try:
            async with http.post(
                f"{base}/v1/portal-link-jobs",
                json={"portal": "suwon", "username": student.sno, "password": student.password},
                headers={"Idempotency-Key": f"upgrade-{uuid.uuid4().hex}"},
            ) as resp:
                body = await resp.json(content_type=None)
                self.answers.append((name, resp.status, body))
        except (aiohttp.ClientError, TimeoutError) as exc:
            self.failures.append((name, f"{type(exc).__name__}: {exc}"))
        finally:
            self.in_flight[name] -= 1


async def _get(http: aiohttp.ClientSession, url: str) -> tuple[int, str]:
    async with http.get(url) as resp:
        return resp.status, await resp.text()


async def _build_info(http: aiohttp.ClientSession, base: str) -> list[dict[str, str]]:
    status, text = await _get(http, f"{base}/metrics")
    assert status == 200, text
    return [
        dict(s.labels)
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "outboxd_build_info"
    ]


def _config(
    dsn: str, moto: MotoServer, queues: dict[str, str], portal: PortalThread, keys: Path
) -> dict[str, Any]:
    """One config both releases read (keys the previous release knows, nothing newer)."""
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": dsn, "auto_migrate": True},
        "sqs": {
            "endpoint_url": moto.endpoint_url,
            **queues,
            "wait_time_s": 1,
            "visibility_timeout_s": 5,
            "max_receive_count": 5,
        },
        "relay": {"interval_s": 0.2, "publish_timeout_s": 2.0, "backoff_base_s": 0.2},
        "consumer": {"heartbeat_s": 1.0, "backoff_base_s": 0},
        "scrapers": {"suwon": {**portal.urls, "timeout_s": 5.0, "min_interval_s": 0.0}},
        "security": {"keys_file": str(keys)},
        "logging": {"level": "info", "format": "json"},
        "daemon": {"shutdown_timeout_s": 10.0},
    }


@postgres_only
async def test_a_rolling_upgrade_under_load_loses_nothing_and_answers_no_5xx(
    backend: str,
    fresh_db_url: str,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    students_portal: PortalThread,
    secret_keys_file: Path,
    spawn_daemon: DaemonFactory,
    tmp_path: Path,
) -> None:
    site = await asyncio.to_thread(install_previous_release, tmp_path / "previous")
    assert known_schema(site) == PREVIOUS_SCHEMA
    config = _config(fresh_db_url, moto_server, queue_names, students_portal, secret_keys_file)
    old: DaemonProcess = spawn_daemon(config, name="old")
    old.extra_env["PYTHONPATH"] = str(site)
    new: DaemonProcess = spawn_daemon(config, name="new")
    load = Load()
    stop_load = asyncio.Event()

    async def accepted_from(name: str, n: int, what: str) -> None:
        async def enough() -> bool:
            return len(load.accepted(name)) >= n or bool(load.failures)

        await eventually(enough, 30, what=what, interval=0.05)
        assert load.failures == [], load.failures

    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=20)) as http:
        old_base = await asyncio.to_thread(old.start)
        load.targets = [("old", old_base)]
        driver = asyncio.create_task(load.run(stop_load))
        try:
            await accepted_from("old", PHASE_JOBS, "jobs accepted by the previous release")
            old_info = await _build_info(http, old_base)
            # The old code, not this one: a route this release added is not there.
            assert (await _get(http, f"{old_base}/v1/admin/dependencies"))[0] == 404

            # This release on the same database: it migrates while the old one serves.
            new_base = await asyncio.to_thread(new.start)

            async def ready() -> bool:
                return (await _get(http, f"{new_base}/readyz"))[0] == 200

            await eventually(ready, 60, what="the new release ready", interval=0.1)
            load.targets = [("old", old_base), ("new", new_base)]
            await accepted_from("new", PHASE_JOBS, "jobs accepted by the new release")
            await accepted_from("old", 2 * PHASE_JOBS, "the old release serving on")

            # Stop the old one: no request goes to it any more, the last ones answered.
            load.targets = [("new", new_base)]

            async def old_idle() -> bool:
                return load.in_flight.get("old", 0) == 0

            await eventually(old_idle, 30, what="the old release's last answers", interval=0.05)
            assert await asyncio.to_thread(old.terminate) == 0, old.all_output()[-3000:]
            after = len(load.accepted("new")) + PHASE_JOBS
            await accepted_from("new", after, "jobs accepted after the old one left")
        finally:
            stop_load.set()
            await driver
        new_info = await _build_info(http, new_base)
        assert (await _get(http, f"{new_base}/v1/admin/dependencies"))[0] == 200

    statuses = sorted({status for _, status, _ in load.answers})
    assert load.failures == [], load.failures
    assert all(status < 500 for _, status, _ in load.answers), [
        (who, status, body) for who, status, body in load.answers if status >= 500
    ]
    assert statuses == [202], load.answers
    ids = load.accepted()
    assert len(set(ids)) == len(ids) >= 4 * PHASE_JOBS

    async def all_succeeded() -> list[dict[str, Any]] | None:
        rows = await raw_rows(fresh_db_url, "SELECT id, status FROM jobs")
        return rows if all(r["status"] == "SUCCEEDED" for r in rows) else None

    rows: list[dict[str, Any]] = await eventually(
        all_succeeded, 60, what="every accepted job SUCCEEDED", interval=0.2
    )
    assert sorted(r["id"] for r in rows) == sorted(ids)
    stuck = await raw_rows(
        fresh_db_url,
        "SELECT id, status FROM relay_outbox"
        " WHERE status IN ('PENDING', 'RETRYABLE_FAILED', 'DEAD')",
    )
    assert stuck == []
    assert await raw_rows(fresh_db_url, "SELECT id FROM jobs WHERE status = 'RUNNING'") == []
    assert await asyncio.to_thread(new.terminate) == 0, new.all_output()[-3000:]

    # Each instance said which release it is and which schema it knows.
    # (0.1.0's build_info has no `schema` label yet: the releases after it all do.)
    (old_labels,) = old_info
    assert old_labels["version"] == PREVIOUS_VERSION
    assert old_labels.get("schema", str(known_schema(site))) == str(known_schema(site))
    known = known_schema_version("postgres")
    assert new_info == [{"version": __version__, "schema": str(known)}]
    assert known > known_schema(site)
    applied = [e for e in new.events() if e.get("event") == "migrations_applied"]
    this_release = [name for v, name, _ in load_migrations("postgres") if v > PREVIOUS_SCHEMA]
    assert [e["migrations"] for e in applied] == [this_release]
    for daemon in (old, new):
        bad = {"daemon_failed", "component_crashed"} & {e.get("event") for e in daemon.events()}
        assert not bad, daemon.all_output()[-3000:]
