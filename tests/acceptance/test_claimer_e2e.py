"""The claimer end to end: `outboxd serve` subprocesses, a standalone fake AI, a real database.

- two daemons on one Postgres share the work outbox: no website is called twice, and two
  drain a backlog faster than one (the ratio is printed, not asserted);
- a daemon SIGKILLed while its row is PROCESSING: after `processing_timeout_s` another
  instance (Postgres) or the restarted one (SQLite) finishes it;
- the rules provider of the shipped config.toml classifies with no outside service.
"""

from __future__ import annotations

import time
import tomllib
import urllib.parse
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from testkit.moto import MotoServer

from tests.acceptance.claimer_rig import (
    ClaimerRig,
    assert_no_overlap_per_domain,
    connected_to,
    daemon_config,
    get_website,
    openai_classifier,
)
from tests.acceptance.conftest import DaemonFactory
from tests.conftest import postgres_only
from tests.reliability.harness import http, register_website
from tests.support.ops import ROOT
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow


# --- two daemons on one Postgres ------------------------------------------------------------


@postgres_only
def test_two_daemons_share_the_work_and_never_call_for_one_website_twice(
    backend: str, rig: ClaimerRig
) -> None:
    ai = rig.start_ai("--delay-s", "0.3")
    config = rig.config(openai_classifier(ai))
    one = rig.daemon("one", config)
    two = rig.daemon("two", config)
    n = 8

    def drain(prefix: str, apis: list[str]) -> float:
        domains = [f"{prefix}-{i}.example" for i in range(n)]
        started = time.monotonic()
        for i, domain in enumerate(domains):
            register_website(apis[i % len(apis)], domain)

        def done() -> bool:
            work = rig.work()
            return all(work.get(d, {}).get("status") == "COMPLETED" for d in domains)

        eventually_sync(done, 60, what=f"{n} websites classified ({prefix})")
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

    calls = rig.calls()
    domains = [c["domain"] for c in calls]
    assert len(calls) == 2 * n, calls  # nothing failed: exactly one call per website
    assert sorted(domains) == sorted(set(domains))
    assert all(c["status"] == 200 for c in calls)
    assert_no_overlap_per_domain(calls)
    work = rig.work()
    assert len(work) == 2 * n
    assert all(r["category"] == "technology" and r["attempt_count"] == 1 for r in work.values())
    # Each daemon counted its own requests to the provider, every one answered.
    counted = [ai_requests(url) for url in (url_one, url_two)]
    assert sum(c["ok"] for c in counted) == 2 * n, counted
    assert all(v == 0 for c in counted for outcome, v in c.items() if outcome != "ok"), counted
    # Both instances took part once two were running.
    for d in (one, two):
        classified = [e for e in d.events() if e.get("event") == "website_classified"]
        assert any(str(e.get("domain", "")).startswith("together-") for e in classified), (
            d.config_path.stem
        )
    assert one.terminate() == 0
    assert two.terminate() == 0


def ai_requests(base_url: str) -> dict[str, float]:
    """`outboxd_ai_requests_total` by outcome, from a daemon's /metrics."""
    resp = http("GET", base_url, "/metrics")
    assert resp.status == 200, resp.text
    return {
        s.labels["outcome"]: s.value
        for f in text_string_to_metric_families(resp.text)
        for s in f.samples
        if s.name == "outboxd_ai_requests_total"
    }


# --- a daemon killed with a row in PROCESSING ------------------------------------------------


def test_a_row_left_processing_by_a_killed_daemon_is_finished_after_the_timeout(
    rig: ClaimerRig,
) -> None:
    ai = rig.start_ai("--delay-s", "1.0", "--category", "crash.example=finance")
    timeout_s = 2.0
    config = rig.config(openai_classifier(ai), processing_timeout_s=timeout_s)
    first = rig.daemon("first", config)
    url = first.start()
    register_website(url, "crash.example")

    eventually_sync(
        lambda: rig.work().get("crash.example", {}).get("status") == "PROCESSING",
        15,
        what="the row to be claimed",
        interval=0.01,
    )
    # Into the 1 s provider call: the daemon's connection to the fake AI is open.
    ai_port = urllib.parse.urlsplit(ai.info["base_url"]).port
    eventually_sync(lambda: connected_to(ai_port), 15, what="the call to the AI", interval=0.01)
    first.kill()  # SIGKILL with the row PROCESSING
    held = rig.work()["crash.example"]
    assert held["status"] == "PROCESSING"
    assert held["category"] is None

    if rig.backend == "postgres":
        # Another instance, never told anything about the dead one.
        finisher = rig.daemon("second", config)
        url = finisher.start()
    else:
        # SQLite: one instance per file, so the same daemon restarts.
        finisher = first
        url = finisher.start()

    eventually_sync(
        lambda: rig.work()["crash.example"]["status"] == "COMPLETED",
        30,
        what="the stale row to be finished",
    )
    body = get_website(url, "crash.example")
    assert body["category"] == "finance"
    assert body["classification"]["status"] == "COMPLETED"
    assert body["classification"]["lastError"] is None

    # The dead holder's call (when it got that far before the kill) and the finisher's:
    # one after the other, the finisher's no sooner than processing_timeout_s after the
    # dead holder's claim.
    calls = sorted(rig.calls(), key=lambda c: c["start"])
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
    spawn_daemon: DaemonFactory,
) -> None:
    shipped = tomllib.loads((ROOT / "config.toml").read_text())
    classifier = shipped["scrapers"]["classifier"]
    assert classifier["provider"] == "rules"
    db_url = f"sqlite:///{tmp_path / 'rules.db'}"
    config = daemon_config(db_url, moto_server, queue_names, classifier)
    # No API key, no provider URL: nothing outside the process is asked.
    daemon = spawn_daemon(config, name="rules")
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
        register_website(url, domain)

    def all_done() -> bool:
        return all(get_website(url, d)["classification"]["status"] == "COMPLETED" for d in expected)

    eventually_sync(all_done, 30, what="every website classified", interval=0.2)
    for domain, category in expected.items():
        body = get_website(url, domain)
        assert body["category"] == category, domain
        assert body["classification"] == {"status": "COMPLETED", "attempts": 1, "lastError": None}
    assert daemon.terminate() == 0
