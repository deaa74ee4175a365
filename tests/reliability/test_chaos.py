"""Chaos under load (short profile): SIGKILL/restart cycles while jobs and websites pour
in; afterwards nothing accepted is lost and no effect happened twice.

The harness is `tests/reliability/chaos.py` (also the long profile:
`python -m tests.reliability.chaos --backend postgres --cycles 100 --seed N --daemons 2`).
The seed is random unless OUTBOXD_CHAOS_SEED is set; it is printed with the table, so a
failing run can be replayed.
"""

from __future__ import annotations

import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from testkit.moto import MotoServer

from tests.reliability.chaos import ChaosParams, ChaosReport, run_chaos
from tests.reliability.harness import Fakes

# Kills on a random schedule in seconds, under a load whose clients pause between retries.
pytestmark = [pytest.mark.slow, pytest.mark.real_clock]

CYCLES = int(os.environ.get("OUTBOXD_CHAOS_CYCLES", "10"))


@pytest.fixture
def n_students() -> int:
    return 1500


RunChaos = Callable[..., ChaosReport]


@pytest.fixture
def run(
    backend: str,
    db_url: str,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    fakes: Fakes,
    tmp_path: Path,
) -> RunChaos:
    """Runs the chaos loop on the test's world (ChaosParams by keyword), prints the table
    and checks what holds for every profile: the kills happened, nothing lost or doubled."""

    def go(cycles: int, min_jobs: int, min_sites: int, **params: Any) -> ChaosReport:
        seed = os.environ.get("OUTBOXD_CHAOS_SEED") or random.SystemRandom().randrange(1 << 30)
        report = run_chaos(
            ChaosParams(
                backend=backend,
                db_url=db_url,
                sqs_endpoint=moto_server.endpoint_url,
                queue_names=queue_names,
                workdir=tmp_path,
                cycles=cycles,
                seed=int(seed),
                **params,
            ),
            fakes,
        )
        print("\n" + report.table())
        assert report.kills >= cycles
        assert report.jobs.accepted >= min_jobs, report.table()
        assert report.sites.accepted >= min_sites, report.table()
        assert report.jobs.lost == 0 and report.sites.lost == 0, report.table()
        assert report.jobs.duplicated == 0 and report.sites.duplicated == 0, report.table()
        assert report.ok, report.table()
        return report

    return go


@pytest.mark.timeout(360)
@pytest.mark.parametrize(
    ("backend", "daemons"),
    [
        ("sqlite", 1),
        pytest.param("postgres", 1, marks=pytest.mark.postgres),
        pytest.param("postgres", 2, marks=pytest.mark.postgres),
    ],
    ids=["sqlite-1", "postgres-1", "postgres-2"],
)
def test_kill_and_restart_under_load_loses_nothing_and_applies_nothing_twice(
    backend: str, daemons: int, run: RunChaos
) -> None:
    run(CYCLES, 20, 10, daemons=daemons)


# Shorter: the pace and the session leases go through the database (docs/pacing.md).
CLUSTER_CYCLES = max(1, min(CYCLES, 6))


@pytest.mark.timeout(360)
@pytest.mark.parametrize(
    ("backend", "daemons"),
    [("sqlite", 1), pytest.param("postgres", 2, marks=pytest.mark.postgres)],
    ids=["sqlite-1", "postgres-2"],
)
def test_chaos_in_cluster_pace_scope_loses_nothing_and_applies_nothing_twice(
    backend: str, daemons: int, run: RunChaos
) -> None:
    run(CLUSTER_CYCLES, 10, 5, daemons=daemons, pace_scope="cluster")
