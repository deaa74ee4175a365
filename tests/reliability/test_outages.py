"""The daemon (a subprocess, every role) through a database outage, and started without one.

docs/operations.md "When the database or SQS is down":
- the database gone for 10 s under a busy config (a schedule every second, the claimer
  with websites to classify, the consumer, the relay): every loop backs off, each logs
  the outage once (a handful of warning lines in all, not one per try), the process
  uses a small fraction of a core meanwhile, and afterwards new work goes through
  without a restart;
- `serve` started while the database cannot be reached: it waits (no exit, no READY,
  `storage_waiting` at most every 10 s, the start timeout extended), then migrates,
  becomes ready and serves a job; SIGTERM during the wait exits 0.

Postgres goes down behind a TCP proxy that closes its listener and every connection (the
shared server is never touched); SQLite is "down" while another connection holds its write
lock. The figures printed here are the ones docs/operations.md quotes.
"""

from __future__ import annotations

import itertools
import os
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from testkit.daemon import DaemonProcess
from testkit.moto import free_port

from outboxd.storage.db import sqlite_path
from tests.conftest import postgres_only, sqlite_only
from tests.reliability.conftest import MakeDaemon
from tests.reliability.harness import Db, http, log_events, student_number
from tests.support.loop_thread import LoopThread
from tests.support.sdnotify import Datagram, NotifyListener
from tests.support.tcp_proxy import TcpProxy, via_proxy
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow

OUTAGE_S = 10.0
# Warning and error lines one part of the daemon may write during the outage: the start
# of it, and room for what a job in flight says when its outcome cannot be written.
LINES_PER_COMPONENT = 4
CPU_SHARE_MAX = 1 / 3  # of one core, over the outage


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process (all its threads) has used, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    return (utime + stime) / os.sysconf("SC_CLK_TCK")


def post_job(base: str, n: int, key: str) -> str:
    resp = http(
        "POST",
        base,
        "/v1/portal-link-jobs",
        {"portal": "suwon", "username": student_number(n), "password": f"pw-{n}"},
        {"Idempotency-Key": key},
    )
    assert resp.status == 202, resp.text
    return str(resp.json()["jobId"])


def job_status(base: str, job_id: str) -> str:
    return str(http("GET", base, f"/v1/jobs/{job_id}").json()["status"])


def succeeded_tasks(db: Db) -> int:
    return int(db.scalar("SELECT COUNT(*) AS n FROM task_runs WHERE status = 'SUCCEEDED'") or 0)


def tasks_since(db: Db, at: float) -> int:
    return int(db.scalar("SELECT COUNT(*) AS n FROM task_runs WHERE enqueued_at > ?", at) or 0)


def busy_config() -> dict[str, Any]:
    return {
        "scheduler": {"jobs": [{"name": "every-second", "every_s": 1, "task": "noop"}]},
        "claimer": {"fixed_delay_s": 0.1},
        "relay": {"interval_s": 0.2},
    }


class Outage:
    """Takes the daemon's database away and gives it back."""

    def __init__(self, db_url: str, workdir: Path) -> None:
        self.db_url = db_url
        self.workdir = workdir
        self.lt: LoopThread | None = None
        self.proxy: TcpProxy | None = None
        self.lock: sqlite3.Connection | None = None
        self.daemon_url = db_url
        if db_url.startswith("postgres"):
            upstream = urlsplit(db_url)
            self.lt = LoopThread()
            self.proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432)
            self.daemon_url = via_proxy(db_url, self.lt.run(self.proxy.start()))

    def cut(self) -> None:
        if self.proxy is not None and self.lt is not None:
            self.lt.run(self.proxy.stop())
            return
        path = sqlite_path(self.db_url, self.workdir)
        self.lock = sqlite3.connect(path, isolation_level=None, timeout=30)
        self.lock.execute("BEGIN EXCLUSIVE")

    def restore(self) -> None:
        if self.proxy is not None and self.lt is not None:
            self.lt.run(self.proxy.start())
        elif self.lock is not None:
            self.lock.execute("ROLLBACK")
            self.lock.close()
            self.lock = None

    def close(self) -> None:
        self.restore()
        if self.proxy is not None and self.lt is not None:
            self.lt.run(self.proxy.stop())
            self.lt.close()


def loud_lines(daemon: DaemonProcess, start: float, end: float) -> list[dict[str, Any]]:
    return [
        e
        for e in log_events([daemon])
        if e.get("level") in ("warning", "error", "critical")
        and isinstance(e.get("ts"), float)
        and start <= e["ts"] <= end
    ]


@pytest.mark.timeout(240)
@pytest.mark.real_clock  # the outage lasts OUTAGE_S: its log lines and CPU are counted
def test_a_database_outage_is_quiet_cheap_and_recovered_from(
    make_daemon: MakeDaemon, db_url: str, tmp_path: Path
) -> None:
    outage = Outage(db_url, tmp_path / "d")
    db = Db(db_url)
    daemon = make_daemon(db_url=outage.daemon_url, **busy_config())
    try:
        base = daemon.start()
        # Busy: websites waiting for the claimer, jobs for the consumer, a task a second.
        for i in range(150):
            resp = http("POST", base, "/v1/websites", {"domain": f"busy-{i}.example"})
            assert resp.status in (200, 201, 202), resp.text
        before = [post_job(base, i, f"before-{i}") for i in range(3)]
        eventually_sync(lambda: succeeded_tasks(db) >= 2, 60, what="scheduled tasks to run")

        cpu_before = cpu_seconds(daemon.pid)
        cut_at = time.time()
        outage.cut()
        refused: list[tuple[int, str | None, str | None]] = []
        end = time.monotonic() + OUTAGE_S
        while (left := end - time.monotonic()) > 0:
            if left > 3.0:
                # A client meanwhile: 503 C09 with Retry-After, one line for all of them.
                resp = http(
                    "POST",
                    base,
                    "/v1/portal-link-jobs",
                    {"portal": "suwon", "username": student_number(3), "password": "pw-3"},
                    {"Idempotency-Key": "during"},
                )
                status = (resp.status, resp.json().get("code"), resp.headers.get("Retry-After"))
                refused.append(status)
            time.sleep(min(1.0, max(0.0, end - time.monotonic())))  # the outage lasts
        cpu_used = cpu_seconds(daemon.pid) - cpu_before
        restore_at = time.time()
        outage.restore()
        assert daemon.running(), daemon.all_output()[-3000:]
        assert refused and set(refused) == {(503, "C09", "1")}, refused

        # Afterwards, without a restart: a new job succeeds, the schedule fires again.
        after = post_job(base, 3, "during")  # the request refused during the outage
        eventually_sync(
            lambda: all(job_status(base, j) == "SUCCEEDED" for j in [*before, after]),
            90,
            what="the jobs to succeed",
        )
        eventually_sync(
            lambda: tasks_since(db, restore_at) > 0, 30, what="a task run enqueued after the outage"
        )

        def ended() -> bool:
            said = Counter(e["event"] for e in daemon.events())
            return said["storage_recovered"] >= said["storage_unavailable"]

        # Each loop notices at its next try (within its capped backoff) and says so.
        eventually_sync(ended, 30, what="every outage line to have its recovery")
        events = list(log_events([daemon]))
        assert daemon.terminate() == 0, daemon.all_output()[-3000:]
    finally:
        daemon.kill()
        db.close()
        outage.close()

    loud = loud_lines(daemon, cut_at, restore_at)
    by_component = Counter(str(e.get("component") or e["event"]) for e in loud)
    share = cpu_used / OUTAGE_S
    print(
        f"\n{OUTAGE_S:g} s database outage: {len(loud)} warning/error lines "
        f"{dict(by_component)}; CPU {cpu_used:.2f} s = {share:.1%} of a core"
    )
    for e in loud:
        what = e.get("component") or e.get("logger")
        print("  ", e.get("level"), e["event"], what, str(e.get("error") or e.get("message")))
    assert by_component, "the outage must be logged"
    assert max(by_component.values()) <= LINES_PER_COMPONENT, by_component
    assert share < CPU_SHARE_MAX, f"{share:.1%} of a core"
    # Each loop said the outage started, and that it ended.
    down = {e.get("component") for e in loud if e["event"] == "storage_unavailable"}
    assert {"relay", "claimer", "scheduler", "api"} <= down, by_component
    recovered = {e.get("component") for e in events if e["event"] == "storage_recovered"}
    assert down <= recovered, (down, recovered)


def _extends(d: Datagram) -> bool:
    return any(x.startswith("EXTEND_TIMEOUT_USEC=") for x in d.lines)


@pytest.mark.timeout(240)
@pytest.mark.real_clock  # the daemon waits ten seconds between its lines
@postgres_only
def test_serve_waits_for_a_database_that_is_not_up_yet(
    make_daemon: MakeDaemon, db_url: str, tmp_path: Path, short_dir: Path
) -> None:
    outage = Outage(db_url, tmp_path / "d")
    outage.cut()  # before the daemon ever connects
    daemon = make_daemon(db_url=outage.daemon_url, **busy_config())
    listener = NotifyListener(short_dir / "notify.sock", daemon.stdout_path)
    try:
        daemon.spawn(extra_env={"NOTIFY_SOCKET": str(listener.path)})

        def extended_twice() -> bool:  # EXTEND_TIMEOUT_USEC every 10 s while it waits
            return len([d for d in listener.received if _extends(d)]) >= 2

        eventually_sync(extended_twice, 30, what="two timeout extensions", interval=0.2)
        assert daemon.running(), daemon.all_output()[-3000:]
        assert not listener.with_line("READY=1"), listener.received
        waiting = [e for e in log_events([daemon]) if e["event"] == "storage_waiting"]
        extended = [d for d in listener.received if _extends(d)]
        statuses = [line for d in listener.received for line in d.lines if "database" in line]

        up_at = time.monotonic()
        outage.restore()
        ready = listener.wait_for("READY=1", timeout_s=60)
        base = daemon.wait_listening(10)
        job = post_job(base, 1, "after-start")
        eventually_sync(lambda: job_status(base, job) == "SUCCEEDED", 60, what="the job to succeed")
        assert daemon.terminate() == 0, daemon.all_output()[-3000:]
    finally:
        daemon.kill()
        listener.close()
        outage.close()

    took = ready.at - up_at
    print(f"\nstorage_waiting lines: {len(waiting)}; READY {took:.1f} s after the database")
    assert 1 <= len(waiting) <= 2, waiting
    times = [e["ts"] for e in waiting]
    assert all(b - a >= 9.5 for a, b in itertools.pairwise(times)), times
    assert "Connection" in str(waiting[0]["error"]) or "refused" in str(waiting[0]["error"])
    assert len(extended) >= 2, listener.received  # every 10 s while it waits
    assert statuses and all("waiting for the database" in s for s in statuses), statuses
    assert ready.at > up_at
    events = [e["event"] for e in log_events([daemon])]
    assert events.index("storage_ready") < events.index("daemon_ready")


@pytest.mark.timeout(120)
@sqlite_only  # the database is never reached
def test_sigterm_while_waiting_for_the_database_exits_0(
    make_daemon: MakeDaemon, tmp_path: Path
) -> None:
    daemon = make_daemon(db_url=f"postgresql://outboxd@127.0.0.1:{free_port()}/none")
    try:
        daemon.spawn()
        eventually_sync(
            lambda: any(e["event"] == "storage_waiting" for e in daemon.events()),
            30,
            what="storage_waiting",
        )
        started = time.monotonic()
        assert daemon.proc is not None
        daemon.proc.send_signal(signal.SIGTERM)
        code = daemon.wait_exit(20)
        took = time.monotonic() - started
    finally:
        daemon.kill()
    print(f"\nSIGTERM while waiting: exit {code} after {took:.2f} s")
    assert code == 0, daemon.all_output()[-3000:]
    events = [e["event"] for e in daemon.events()]
    assert "daemon_ready" not in events and events[-1] == "daemon_stopped"
