"""What the operator does with the outside systems' breakers, on both backends: the admin
routes (list, pause with a reason and an end, resume; bad input changes nothing), the CLI
(`outboxd deps`, `pause`, `resume`), the log lines (one per change, never one per waiting
job) and the metrics; and the breaker's rules on the store: a failure of one job among
answers never opens it, and one probe at a time for the cluster."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from outboxd.config import BreakerSettings
from outboxd.metrics import Metrics
from outboxd.services.breakers import Breaker, Breakers
from outboxd.storage.store import SqlStore
from tests.support.api import assert_problem
from tests.support.ops import run_cli, write_config

Client = TestClient[Any, Any]


async def test_pause_and_resume_through_the_api(api: Client, store: SqlStore) -> None:
    listed = await api.get("/v1/admin/dependencies")
    assert listed.status == 200, await listed.text()
    items = (await listed.json())["items"]
    assert [(i["name"], i["state"]) for i in items] == [
        ("portal", "up"),
        ("ai", "up"),
        ("sqs", "up"),
    ]
    with capture_logs() as logs:
        resp = await api.post(
            "/v1/admin/dependencies/portal/pause",
            json={"reason": "portal asked for a quiet night", "forS": 3600},
        )
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["state"] == "paused" and body["reason"] == "portal asked for a quiet night"
    assert body["pausedBy"] and body["until"] and body["since"]
    line = next(e for e in logs if e["event"] == "dependency_paused")
    assert line["dependency"] == "portal" and line["reason"] == "portal asked for a quiet night"
    assert line["actor"]
    # Another instance (a fresh view of the same database) sees the pause.
    other = Breakers(_settings(), store)
    assert (await other.view("portal")).state == "paused"
    with capture_logs() as logs:
        resp = await api.post("/v1/admin/dependencies/portal/resume")
    assert resp.status == 200 and (await resp.json())["state"] == "up"
    assert [e["event"] for e in logs if e["event"].startswith("dependency_")] == [
        "dependency_resumed"
    ]
    assert (await other.view("portal")).state == "up"


async def test_a_bad_pause_is_refused_and_changes_nothing(api: Client, store: SqlStore) -> None:
    bad: list[tuple[str, dict[str, Any]]] = [
        ("portal", {}),
        ("portal", {"reason": ""}),
        ("portal", {"reason": "   "}),
        ("portal", {"reason": "x" * 501}),
        ("portal", {"reason": "ok", "forS": 0}),
        ("portal", {"reason": "ok", "forS": "10"}),
        ("portal", {"reason": "ok", "forS": 10, "until": "2999-01-01T00:00:00Z"}),
        ("portal", {"reason": "ok", "until": "tomorrow"}),
        ("portal", {"reason": "ok", "extra": 1}),
        ("portal", {"reason": "a\u202eb"}),
    ]
    for name, payload in bad:
        await assert_problem(
            await api.post(f"/v1/admin/dependencies/{name}/pause", json=payload), 400, "C01"
        )
    await assert_problem(
        await api.post("/v1/admin/dependencies/mail/pause", json={"reason": "x"}), 404, "C04"
    )
    await assert_problem(await api.post("/v1/admin/dependencies/mail/resume"), 404, "C04")
    rows = await store.dependency_rows()
    assert all(r.pause_reason is None for r in rows)


async def test_the_cli_pauses_lists_and_resumes(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, {"storage": {"url": db_url, "auto_migrate": False}})
    paused = run_cli("pause", "ai", "--reason", "provider migration", "--for", "30m",
                     "--config", str(config))  # fmt: skip
    assert paused.returncode == 0, paused.stderr
    assert "paused" in paused.stdout and "provider migration" in paused.stdout
    line = next(json.loads(x) for x in paused.stderr.splitlines() if "dependency_paused" in x)
    assert line["actor"].startswith("cli:") and line["dependency"] == "ai"
    listed = run_cli("deps", "--json", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    ai = next(d for d in json.loads(listed.stdout) if d["name"] == "ai")
    assert ai["state"] == "paused" and ai["reason"] == "provider migration"
    row = next(r for r in await store.dependency_rows() if r.name == "ai")
    assert row.paused_until is not None and 1700 < row.paused_until - time.time() <= 1800
    refused = run_cli("pause", "ai", "--reason", "x", "--until", "2001-01-01T00:00:00Z",
                      "--config", str(config))  # fmt: skip
    assert refused.returncode == 2 and "future" in refused.stderr
    resumed = run_cli("resume", "ai", "--config", str(config))
    assert resumed.returncode == 0, resumed.stderr
    assert (await Breakers(_settings(), store).view("ai")).state == "up"


async def test_a_jobs_own_failures_among_answers_never_open_the_breaker(store: SqlStore) -> None:
    """Runs of one poisoned job fail with a 5xx between other jobs' answers: the count
    starts again at each answer, so the breaker stays up however long it goes on."""
    breaker = Breaker("portal", BreakerSettings(open_after=3, probe_s=30), (), store)
    for _ in range(10):
        assert await breaker.outage("portal answered HTTP 500") is None
        assert await breaker.outage("portal answered HTTP 500") is None
        await breaker.through()
    row = next(r for r in await store.dependency_rows() if r.name == "portal")
    assert row.down_since is None and row.failures_in_a_row == 0


async def test_one_probe_at_a_time_for_the_cluster(store: SqlStore) -> None:
    """Three instances asking for the AI's probe at once while it is down: one gets it; no
    one again before probe_s has passed; a failed probe frees the place for the next."""
    settings = BreakerSettings(open_after=1, probe_s=0.5)
    breakers = [Breaker("ai", settings, (), store) for _ in range(3)]
    assert await breakers[0].outage("provider error HTTP 503") is not None  # opens it
    # The first probe comes a probe interval after the breaker opened, not at once.
    assert await breakers[1].take_probe("i1", 60) is None
    await asyncio.sleep(0.6)  # the probe interval itself is what is tested here
    got = await asyncio.gather(*(b.take_probe(f"i{n}", 60) for n, b in enumerate(breakers)))
    assert sum(g is not None for g in got) == 1, got
    again = await asyncio.gather(*(b.take_probe(f"i{n}", 60) for n, b in enumerate(breakers)))
    assert again == [None, None, None]
    winner = next(g for g in got if g is not None)
    await breakers[0].outage("provider error HTTP 503", probe=winner)
    # The failed probe freed its place, yet the next waits its probe interval.
    assert await breakers[1].take_probe("i1", 60) is None
    await asyncio.sleep(0.6)  # the probe interval itself is what is tested here
    got = await asyncio.gather(*(b.take_probe(f"i{n}", 60) for n, b in enumerate(breakers)))
    assert sum(g is not None for g in got) == 1, got


async def test_the_metrics_and_the_log_lines_of_an_outage(store: SqlStore) -> None:
    metrics = Metrics()
    breaker = Breaker("portal", BreakerSettings(open_after=2, probe_s=30), (), store, metrics)
    with capture_logs() as logs:
        for _ in range(6):
            await breaker.outage("portal answered HTTP 503")
        await breaker.through()
    events = [e["event"] for e in logs]
    assert events == ["dependency_down", "dependency_up"], events
    down = next(e for e in logs if e["event"] == "dependency_down")
    assert down["dependency"] == "portal" and "503" in down["error"]
    up = next(e for e in logs if e["event"] == "dependency_up")
    assert up["dependency"] == "portal" and up["down_s"] >= 0
    text = _scrape(metrics)
    assert 'outboxd_dependency_outage_failures_total{dependency="portal"} 6.0' in text
    assert 'outboxd_dependency_state{dependency="portal",state="up"} 1.0' in text
    assert 'outboxd_dependency_state{dependency="portal",state="down"} 0.0' in text


def _scrape(metrics: Metrics) -> str:
    from prometheus_client import generate_latest

    return generate_latest(metrics.registry).decode()


def _settings() -> Any:
    from outboxd.config_file import settings_from_mapping

    return settings_from_mapping({})
