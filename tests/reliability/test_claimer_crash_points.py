"""Kill -9 at the claimer's two crash points, restart, lose nothing, apply nothing twice.

(The four crash points on a portal job's path are covered by
tests/acceptance/test_crash_points.py.)

- `during_claim`: the row is committed PROCESSING and the process dies before calling
  the provider. The dead holder's claim is respected for `claimer.processing_timeout_s`,
  then the row is reclaimed and classified with exactly one provider call.
- `after_classify_before_complete`: the provider answered, the process dies before the
  outcome is stored. The row is reclaimed after the timeout and classified again (the
  first answer was never stored: at least once towards the provider), and the category
  is written exactly once, from the holder that completed.

In both: the website ends COMPLETED with its category, never a call after that.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from testkit.daemon import DaemonProcess

from tests.reliability.conftest import MakeDaemon
from tests.reliability.harness import Db, Fakes, http
from tests.support.waits import consistently_sync, eventually_sync

pytestmark = pytest.mark.slow

PROCESSING_TIMEOUT_S = 2.0
DOMAIN = "crashpoint.example"


@pytest.fixture
def n_students() -> int:
    return 1


@pytest.fixture
def daemon(make_daemon: MakeDaemon) -> DaemonProcess:
    return make_daemon(
        "claimer",
        claimer={"processing_timeout_s": PROCESSING_TIMEOUT_S, "fixed_delay_s": 0.1},
        daemon={"roles": ["api", "claimer"], "shutdown_timeout_s": 3.0},
    )


def work_row(db: Db) -> dict[str, Any]:
    rows = db.rows(
        "SELECT w.category, w.version, o.status, o.attempt_count, o.attempted_at, o.last_error"
        " FROM websites w JOIN work_outbox o ON o.website_id = w.id WHERE w.domain = ?",
        DOMAIN,
    )
    assert len(rows) == 1, rows
    return rows[0]


def calls_for(fakes: Fakes) -> list[dict[str, Any]]:
    return sorted((c for c in fakes.ai_calls() if c["domain"] == DOMAIN), key=lambda c: c["start"])


def crash_at(point: str, daemon: DaemonProcess, db: Db, fakes: Fakes) -> dict[str, Any]:
    """The provider answers "finance"; the daemon armed at `point` registers the website
    and dies there. The row it leaves: PROCESSING, one attempt, no category."""
    fakes.set_ai(categories_by_domain={DOMAIN: "finance"})
    base = daemon.start(extra_env={"OUTBOXD_CRASH_AT": point})
    resp = http("POST", base, "/v1/websites", {"domain": DOMAIN})
    assert resp.status == 201, resp.text
    assert daemon.wait_exit(timeout_s=20) == -signal.SIGKILL
    assert f"crash point {point} reached" in daemon.all_output()
    held = work_row(db)
    assert held["status"] == "PROCESSING" and held["attempt_count"] == 1, held
    assert held["category"] is None, "the answer of the dead holder must not be stored"
    return held


def finish_after_restart(daemon: DaemonProcess, db: Db) -> tuple[str, dict[str, Any]]:
    base = daemon.start()  # unarmed, same database
    row = eventually_sync(
        lambda: (r := work_row(db))["status"] == "COMPLETED" and r,
        PROCESSING_TIMEOUT_S + 15,
        what="the website classified",
    )
    return base, row


def assert_nothing_more_happens(daemon: DaemonProcess, db: Db, fakes: Fakes, calls: int) -> None:
    """For a further processing timeout: still COMPLETED, written once, no new call."""

    def unchanged() -> bool:
        row = work_row(db)
        assert (row["status"], row["version"]) == ("COMPLETED", 1), row
        assert len(calls_for(fakes)) == calls
        return True

    consistently_sync(unchanged, PROCESSING_TIMEOUT_S + 0.5, interval=0.25)
    classified = [
        e for e in daemon.events() if e["event"] == "website_classified" and e["domain"] == DOMAIN
    ]
    assert len(classified) == 1, classified


@pytest.mark.timeout(90)
@pytest.mark.real_clock  # nothing more happens for a processing timeout
def test_crash_during_claim(daemon: DaemonProcess, db: Db, fakes: Fakes) -> None:
    held = crash_at("during_claim", daemon, db, fakes)
    assert calls_for(fakes) == []  # it died before calling the provider

    base, row = finish_after_restart(daemon, db)

    assert row["category"] == "finance" and row["version"] == 1, row
    assert row["last_error"] is None
    calls = calls_for(fakes)
    assert [c["status"] for c in calls] == [200], calls  # exactly one call, ever
    # The dead holder's claim was respected for the whole processing timeout.
    assert calls[0]["start"] >= held["attempted_at"] + PROCESSING_TIMEOUT_S - 0.05
    body = http("GET", base, f"/v1/websites/{DOMAIN}").json()
    assert body["category"] == "finance"
    assert body["classification"]["status"] == "COMPLETED"
    assert body["classification"]["lastError"] is None
    # docs/contract.md#the-fixed-delay-claimer counts calls that reached the provider (1 here);
    # the implementation also
    # counts the dead holder's claim, since nobody can know whether its call went out.
    assert body["classification"]["attempts"] in (1, 2)
    assert_nothing_more_happens(daemon, db, fakes, calls=1)
    assert daemon.terminate() == 0


@pytest.mark.timeout(90)
@pytest.mark.real_clock  # nothing more happens for a processing timeout
def test_crash_after_classify_before_complete(daemon: DaemonProcess, db: Db, fakes: Fakes) -> None:
    held = crash_at("after_classify_before_complete", daemon, db, fakes)
    first = calls_for(fakes)
    assert [c["status"] for c in first] == [200], first

    # The provider would now answer differently: what is stored must come from the
    # holder that completes, and only from it.
    fakes.set_ai(categories_by_domain={DOMAIN: "news"})
    base, row = finish_after_restart(daemon, db)

    assert row["category"] == "news" and row["version"] == 1, row
    calls = calls_for(fakes)
    assert [c["status"] for c in calls] == [200, 200], calls
    assert calls[1]["start"] >= calls[0]["end"]  # never two calls at once
    assert calls[1]["start"] >= held["attempted_at"] + PROCESSING_TIMEOUT_S - 0.05
    body = http("GET", base, f"/v1/websites/{DOMAIN}").json()
    assert body["category"] == "news"
    assert body["classification"] == {"status": "COMPLETED", "attempts": 2, "lastError": None}
    assert_nothing_more_happens(daemon, db, fakes, calls=2)
    assert daemon.terminate() == 0
