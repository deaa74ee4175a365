"""One pace across instances, end to end (docs/pacing.md): `outboxd serve` subprocesses on one
database, the fake AI as its own process recording every call's wall-clock arrival, the
strict fake portal recording requests and sessions.

- 3 daemons on Postgres, 2 on one SQLite file, `claimer.pace_scope = "cluster"`: no two AI
  calls closer than `fixed_delay_s`, each website classified once, several daemons taking part;
- a 429 with `Retry-After: 2` answered to one daemon: no daemon calls for about 2 s;
- one daemon SIGKILLed mid-run: the others finish, no gap longer than one slot plus
  `processing_timeout_s`;
- the portal in cluster scope: 3 daemons, 4 jobs for 4 accounts, all SUCCEED, requests
  `min_interval_s` apart and, with `max_concurrency = 1`, never two sessions at once;

The pace is measured where it is decided: each daemon logs the wall-clock moment it called
(`website_classified.called_at`) or sent (`portal_request.sent_at`), right after its pacer
let it go; one host, one clock. The fakes' arrival stamps are not used for gaps: a fake on
a busy machine notes one arrival late and the next on time, and a properly spaced pair
looks close. Gaps may fall short of the interval by `CLOCK_TOLERANCE_S` only, the error of
each daemon's estimate of the database clock its slots are read on (`DbClock`); a pace
kept too slowly is no defect and is not asserted.
- `pace_scope = "galaxy"` stops the daemon at start with a line naming the key.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import DaemonProcess, FakeProcess
from testkit.fakes.portal import SAMPLE_PASSWORD, sample_student

from tests.acceptance.claimer_rig import ClaimerRig, openai_classifier
from tests.acceptance.conftest import ConfigFactory, DaemonFactory, PortalThread, http_request
from tests.reliability.harness import register_website
from tests.support.ops import run_cli
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow

DELAY_S = 0.4
# Two daemons' estimates of the database clock (half a round trip at worst, each).
CLOCK_TOLERANCE_S = 0.005


def instances(backend: str) -> int:
    """Three daemons on Postgres, two processes on one SQLite file."""
    return 3 if backend == "postgres" else 2


def cluster_config(rig: ClaimerRig, ai: FakeProcess, **claimer: Any) -> dict[str, Any]:
    classifier = {**openai_classifier(ai), "timeout_s": 1.0}
    return rig.config(
        classifier,
        **{
            "fixed_delay_s": DELAY_S,
            "processing_timeout_s": 2.0,
            "pace_scope": "cluster",
            **claimer,
        },
    )


def start_daemons(rig: ClaimerRig, config: dict[str, Any]) -> list[DaemonProcess]:
    """The daemons that do the work, started."""
    made = [rig.daemon(f"d{i}", config) for i in range(instances(rig.backend))]
    for d in made:
        d.start()
    return made


def registered_before_start(rig: ClaimerRig, config: dict[str, Any], domains: list[str]) -> None:
    """The backlog, registered by an API-only daemon, so the run starts with all of it."""
    api = rig.daemon("api", {**config, "daemon": {"roles": ["api"]}})
    try:
        url = api.start()
        for d in domains:
            register_website(url, d)
    finally:
        assert api.terminate() == 0


def all_classified(rig: ClaimerRig, domains: list[str]) -> bool:
    work = rig.work()
    return all(work.get(d, {}).get("category") is not None for d in domains)


# --- one pace for all daemons ------------------------------------------------------------------


def test_daemons_in_cluster_scope_keep_one_pace_toward_the_provider(rig: ClaimerRig) -> None:
    ai = rig.start_ai()
    config = cluster_config(rig, ai)
    n_sites = 15
    domains = [f"pace-{i}.example" for i in range(n_sites)]
    # The work comes once every daemon is up: registered before, it could all go to the
    # first one started while a busy machine still starts the others, and one daemon
    # keeping a pace would show nothing about one pace across daemons.
    daemons = start_daemons(rig, config)
    urls = [d.base_url for d in daemons if d.base_url is not None]
    for i, domain in enumerate(domains):
        register_website(urls[i % len(urls)], domain)

    eventually_sync(lambda: all_classified(rig, domains), 90, what="every website classified")
    calls = rig.calls()
    assert sorted(c["domain"] for c in calls) == sorted(domains), "one call per website"
    assert all(c["status"] == 200 for c in calls)
    called = sorted(
        e["called_at"]
        for d in daemons
        for e in d.events()
        if e.get("event") == "website_classified"
    )
    assert len(called) == n_sites, "each call logged by the daemon that made it"
    gaps = [b - a for a, b in itertools.pairwise(called)]
    assert min(gaps) >= DELAY_S - CLOCK_TOLERANCE_S, f"two calls {min(gaps):.3f}s apart: {gaps}"
    print(
        f"\ncluster pace ({rig.backend}, {instances(rig.backend)} daemons): "
        f"gaps {min(gaps):.3f}..{max(gaps):.3f}s for {DELAY_S}s asked"
    )
    work = rig.work()
    assert all(work[d]["attempt_count"] == 1 and work[d]["status"] == "COMPLETED" for d in domains)
    # Several daemons took part: the slot goes to whoever is ready.
    busy = [d for d in daemons if any(e.get("event") == "website_classified" for e in d.events())]
    assert len(busy) >= 2, [d.config_path.stem for d in busy]
    for d in daemons:
        assert d.terminate() == 0


def test_a_429_to_one_daemon_pauses_every_daemon(rig: ClaimerRig) -> None:
    ai = rig.start_ai("--rate-limit-call", "3=2")
    config = cluster_config(rig, ai)
    domains = [f"limited-{i}.example" for i in range(7)]
    registered_before_start(rig, config, domains)
    daemons = start_daemons(rig, config)

    eventually_sync(lambda: all_classified(rig, domains), 90, what="every website classified")
    calls = sorted(rig.calls(), key=lambda c: c["start"])
    limited = [i for i, c in enumerate(calls) if c["status"] == 429]
    assert len(limited) == 1, calls
    i = limited[0]
    quiet = calls[i + 1]["start"] - calls[i]["end"]
    print(f"\nafter the 429 ({rig.backend}): next call {quiet:.2f}s later")
    assert quiet >= 2.0 * 0.9, f"a daemon called {quiet:.2f}s after the 429"
    assert quiet <= 2.0 + DELAY_S + 2.0, quiet  # and the pace went on after the pause
    assert sorted(c["domain"] for c in calls if c["status"] == 200) == sorted(domains)
    assert all(r["attempt_count"] == 1 for r in rig.work().values())  # the 429 spent nothing
    for d in daemons:
        assert d.terminate() == 0


def test_a_killed_daemon_leaves_at_most_one_slot_plus_the_processing_timeout(
    rig: ClaimerRig,
) -> None:
    ai = rig.start_ai("--delay-s", "0.1")
    timeout_s = 2.0
    config = cluster_config(rig, ai, processing_timeout_s=timeout_s)
    domains = [f"kill-{i}.example" for i in range(12)]
    registered_before_start(rig, config, domains)
    daemons = start_daemons(rig, config)

    eventually_sync(lambda: len(rig.calls()) >= 4, 60, what="the run under way")
    victim = daemons[0]
    victim.kill()  # SIGKILL: whatever row and slot it held, it holds no more

    eventually_sync(lambda: all_classified(rig, domains), 90, what="the others to finish the work")
    calls = sorted(rig.calls(), key=lambda c: c["start"])
    starts = [c["start"] for c in calls]
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    print(f"\nkilled one daemon ({rig.backend}): longest gap {max(gaps):.2f}s")
    # Generous for a loaded machine, and still far below two timeouts.
    assert max(gaps) <= (DELAY_S + timeout_s) * 1.15 + 0.3, gaps
    assert {c["domain"] for c in calls} == set(domains)
    per_domain = {d: sum(1 for c in calls if c["domain"] == d) for d in domains}
    # At most the killed daemon's one row is called again by its finisher.
    assert sum(n - 1 for n in per_domain.values()) <= 1, per_domain
    assert all(r["status"] == "COMPLETED" for r in rig.work().values())
    for d in daemons[1:]:
        assert d.terminate() == 0


# --- the portal -------------------------------------------------------------------------------


def test_the_portal_sees_one_client_across_three_daemons(
    backend: str,
    db_url: str,
    portal_thread: PortalThread,
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
) -> None:
    accounts = [f"2020{1000 + i}" for i in range(4)]
    sample = sample_student()
    for sno in accounts:
        # One semester each: fewer requests, so a wide interval still makes a short test.
        one_term = dataclasses.replace(sample, sno=sno, semesters=sample.semesters[:1], totals=None)
        portal_thread.add_student(one_term)
    interval_s = 0.4
    config = pipeline_config(
        scrapers={
            "suwon": {
                "pace_scope": "cluster",
                "min_interval_s": interval_s,
                "max_concurrency": 1,
                "timeout_s": 3.0,
            }
        },
        consumer={"max_concurrency": 2, "heartbeat_s": 0.5, "backoff_base_s": 0},
        # Each request's portal_request line, with the moment it was sent, is a debug line.
        logging={"level": "debug"},
    )
    daemons = [spawn_daemon(config, name=f"p{i}") for i in range(3)]
    urls = [d.start() for d in daemons]
    jobs = []
    for i, sno in enumerate(accounts):
        resp = http_request(
            "POST",
            f"{urls[i % 3]}/v1/portal-link-jobs",
            {"portal": "suwon", "username": sno, "password": SAMPLE_PASSWORD},
            headers={"Idempotency-Key": f"pace-{sno}"},
        )
        assert resp.status == 202, resp.text
        jobs.append(resp.json()["jobId"])

    def finished() -> list[dict[str, Any]] | None:
        bodies = [http_request("GET", f"{urls[0]}/v1/jobs/{j}").json() for j in jobs]
        return (
            bodies if all(b["status"] in ("SUCCEEDED", "FAILED", "DEAD") for b in bodies) else None
        )

    # Seldom: the fake portal shares this process, and busy polling here would slow it.
    bodies = eventually_sync(finished, 120, what="all four jobs to finish", interval=1.0)
    assert [b["status"] for b in bodies] == ["SUCCEEDED"] * 4, bodies
    requests = portal_thread.run(lambda: list(portal_thread.portal.requests))
    sent = sorted(
        e["sent_at"] for d in daemons for e in d.events() if e.get("event") == "portal_request"
    )
    assert len(sent) == len(requests), "every request the portal saw, logged by its sender"
    gaps = [b - a for a, b in itertools.pairwise(sent)]
    close = [g for g in gaps if g < interval_s - CLOCK_TOLERANCE_S]
    assert not close, f"portal requests closer than {interval_s}s: {close}"
    sessions = portal_thread.run(
        lambda: {k: list(v) for k, v in portal_thread.portal.sessions.items()}
    )
    spans = sorted(sessions[sno] for sno in accounts)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, f"two portal sessions at once: {spans}"
    print(
        f"\nportal ({backend}): {len(requests)} requests, min gap {min(gaps):.3f}s, "
        f"sessions one at a time over {spans[-1][1] - spans[0][0]:.1f}s"
    )


# --- configuration --------------------------------------------------------------------------


@pytest.mark.parametrize("key", ["claimer.pace_scope", "scrapers.suwon.pace_scope"])
def test_an_unknown_pace_scope_stops_the_daemon_at_start(tmp_path: Path, key: str) -> None:
    section, name = key.rsplit(".", 1)
    path = tmp_path / "galaxy.toml"
    path.write_text(
        f'[storage]\nurl = "sqlite:///{tmp_path / "g.db"}"\n[{section}]\n{name} = "galaxy"\n'
    )
    for command in ("serve", "status"):
        done = run_cli(command, "--config", str(path))
        assert done.returncode == 2, (command, done.stderr)
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1 and key in err and "galaxy" in err, err
    assert not (tmp_path / "g.db").exists()
