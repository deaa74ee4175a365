"""The chaos harness's wait for quiescence (chaos.wait_for_rest) tells a backlog that is
still draining from work that stopped (decision 0029).

A run on a busy machine leaves a backlog at the end of its load that takes the consumer
longer to drain than on an idle one; a fixed wait counted its last jobs, still being run,
as lost. The wait now lasts while rows keep coming to rest, and ends `quiesce_timeout_s`
after the last one did: a job held forever is still reported, and no later than before.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.reliability.chaos import ChaosParams, Item, wait_for_rest

POLL_S = 0.02


def params(quiet_s: float, cap_s: float) -> ChaosParams:
    return ChaosParams(
        backend="sqlite",
        db_url="sqlite:///unused.db",
        sqs_endpoint="http://127.0.0.1:1",
        queue_names={},
        workdir=Path("."),
        quiesce_timeout_s=quiet_s,
        quiesce_cap_s=cap_s,
    )


def accepted_jobs(n: int) -> list[Item]:
    return [Item("job", i, f"key-{i}", state="accepted", ref=f"job-{i}") for i in range(n)]


def draining(items: list[Item], stop_after: int | None = None) -> Callable[[], dict[str, Any]]:
    """Snapshots of a backlog in which one more job succeeds at each look (the consumer
    working through it), until `stop_after` have: the others stay RUNNING from then on."""
    looks = 0

    def snapshot() -> dict[str, Any]:
        nonlocal looks
        looks += 1
        done = looks if stop_after is None else min(looks, stop_after)
        jobs = [{"id": i.ref, "status": "SUCCEEDED" if i.n < done else "RUNNING"} for i in items]
        relay = [{"id": f"r-{i.n}", "status": "SENT"} for i in items]
        return {"jobs": jobs, "sites": [], "relay": relay}

    return snapshot


def running(snap: dict[str, Any]) -> list[str]:
    return [j["id"] for j in snap["jobs"] if j["status"] != "SUCCEEDED"]


def test_a_backlog_still_draining_past_the_quiet_time_is_waited_for() -> None:
    items = accepted_jobs(25)
    # Each look finds one more job done; the whole drain takes far longer than the quiet
    # time, which a fixed wait of that length would have counted as 20-odd lost jobs.
    snap = wait_for_rest(draining(items), items, params(quiet_s=0.1, cap_s=60), POLL_S)
    assert running(snap) == []


def test_a_job_that_stops_moving_is_given_up_on_the_quiet_time_after_the_last_change() -> None:
    items = accepted_jobs(8)
    started = time.monotonic()
    snap = wait_for_rest(
        draining(items, stop_after=5), items, params(quiet_s=0.2, cap_s=60), POLL_S
    )
    assert running(snap) == ["job-5", "job-6", "job-7"]
    # Ended by the quiet time, not by the cap: a held job is reported as soon as before.
    assert time.monotonic() - started < 30
