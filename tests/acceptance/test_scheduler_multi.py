"""Three daemons, one Postgres, the same `every_s = 1` schedule (docs/contract.md#scheduler):
each fire time becomes exactly one task run, published once, and run once to SUCCEEDED."""

from __future__ import annotations

import contextlib
import re
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer, free_port

from outboxd.security import generate_key
from tests.support import postgres as pg
from tests.support.db import sql_sync
from tests.support.waits import consistently_sync, eventually_sync

pytestmark = [pytest.mark.postgres, pytest.mark.slow]

RUN_S = 10.0
DEDUP_RE = re.compile(r"^beat-(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)Z$")


def config(
    dsn: str, moto: MotoServer, queues: dict[str, str], keys: Path, **roles: Any
) -> dict[str, Any]:
    dead_end = f"http://127.0.0.1:{free_port()}"
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": dsn, "pool_size": 4},
        "sqs": {
            "endpoint_url": moto.endpoint_url,
            **queues,
            "wait_time_s": 1,
            "visibility_timeout_s": 6,
        },
        "relay": {"interval_s": 0.2},
        "security": {"keys_file": str(keys)},
        "daemon": {"shutdown_timeout_s": 5, **roles},
        "scheduler": {"jobs": [{"name": "beat", "every_s": 1, "task": "noop"}]},
        "scrapers": {"suwon": {"portal_base_url": dead_end, "info_base_url": dead_end}},
        "logging": {"level": "info"},
    }


def task_rows(dsn: str) -> list[tuple[Any, ...]]:
    return sql_sync(dsn, "SELECT id, dedup_id, status FROM task_runs ORDER BY dedup_id")


@pytest.mark.real_clock  # three schedulers really running for a while
def test_three_daemons_enqueue_each_fire_time_once(
    pg_database: str, moto_server: MotoServer, queue_names: dict[str, str], tmp_path: Path
) -> None:
    pg.truncate(pg_database)
    keys = tmp_path / "keys"
    keys.write_text(generate_key() + "\n")
    daemons = [
        DaemonProcess(
            tmp_path / f"d{i}", config(pg_database, moto_server, queue_names, keys), name=f"d{i}"
        )
        for i in range(3)
    ]
    drainer: DaemonProcess | None = None
    try:
        with ThreadPoolExecutor(3) as pool:
            list(pool.map(lambda d: d.start(), daemons))
        all_up = time.time()
        consistently_sync(lambda: all(d.running() for d in daemons), RUN_S)  # all three run
        all_down_from = time.time()
        with ThreadPoolExecutor(3) as pool:
            codes = list(pool.map(lambda d: d.terminate(), daemons))
        assert codes == [0, 0, 0], [d.all_output()[-2000:] for d in daemons]

        rows = task_rows(pg_database)
        dedup_ids = [r[1] for r in rows]
        assert len(dedup_ids) == len(set(dedup_ids)), "a fire time was enqueued twice"
        fire_times = []
        for d in dedup_ids:
            m = DEDUP_RE.match(d)
            assert m, d
            fire_times.append(datetime.fromisoformat(m[1] + "+00:00").timestamp())
        # Every whole second while all three ran has its run (the scheduler may only skip a
        # fire time when every instance was late past the next one; allow one such slip).
        window = [t for t in range(int(all_up) + 1, int(all_down_from)) if t - all_up >= 1]
        missing = sorted(set(window) - set(fire_times))
        assert len(missing) <= 1, (missing, fire_times)
        assert len(rows) >= RUN_S - 2

        # Each run has exactly one relay row, with the same dedup id.
        relay = sql_sync(
            pg_database,
            "SELECT dedup_id, COUNT(*) FROM relay_outbox WHERE kind = 'task' GROUP BY dedup_id",
        )
        assert {d: n for d, n in relay} == {d: 1 for d in dedup_ids}

        # The instances really raced: together they reported every fire time, and the
        # enqueues that found the run already there are reported as not created.
        fired = [e for d in daemons for e in d.events() if e["event"] == "scheduler_fired"]
        created = Counter(e["dedup_id"] for e in fired if e["created"])
        assert set(created) == set(dedup_ids)
        assert all(n == 1 for n in created.values()), created
        assert any(not e["created"] for e in fired), "the three schedulers never contended"
        assert all(e["event"] != "scheduler_enqueue_failed" for d in daemons for e in d.events())

        # Drain what was enqueued but not yet run, with no scheduler left running.
        drainer = DaemonProcess(
            tmp_path / "drain",
            config(
                pg_database,
                moto_server,
                queue_names,
                keys,
                roles=["api", "relay", "consumer"],
            ),
            name="drain",
        )
        drainer.start()
        # A message a stopping daemon received as it stopped comes back after the
        # visibility timeout (6 s here): at least once, never lost.
        with contextlib.suppress(AssertionError):  # the assertions below say what is not
            eventually_sync(
                lambda: {r[2] for r in task_rows(pg_database)} == {"SUCCEEDED"}, 30, interval=0.3
            )
        assert drainer.terminate() == 0
        final = task_rows(pg_database)
        assert [r[1] for r in final] == dedup_ids, "no run appeared after the schedulers stopped"
        assert {r[2] for r in final} == {"SUCCEEDED"}, Counter(r[2] for r in final)

        # ... and each ran once: one task_succeeded across all four processes.
        ran = Counter(
            e["task_id"]
            for d in [*daemons, drainer]
            for e in d.events()
            if e["event"] == "task_succeeded"
        )
        assert set(ran) == {r[0] for r in final}
        assert all(n == 1 for n in ran.values()), ran
    finally:
        for d in daemons:
            d.kill()
        if drainer is not None:
            drainer.kill()
