"""sd_notify from the real daemon process (docs/contract.md#process-and-logs):
READY=1 once every role is up, WATCHDOG=1 at half of WATCHDOG_USEC, STOPPING=1 on SIGTERM,
exit 0."""

from __future__ import annotations

import itertools
import os
import socket
import time
import uuid
from pathlib import Path
from typing import Any

from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from tests.acceptance.conftest import offline_config
from tests.support.sdnotify import Datagram, NotifyListener
from tests.support.waits import eventually_sync


def daemon_config(moto: MotoServer) -> dict[str, Any]:
    """Every role (the default), and a scheduler job."""
    return offline_config(
        moto,
        "outboxd.db",
        scheduler={"jobs": [{"name": "tick", "every_s": 3600, "task": "noop"}]},
    )


def test_ready_watchdog_and_stopping(
    moto_server: MotoServer, tmp_path: Path, short_dir: Path
) -> None:
    daemon = DaemonProcess(tmp_path, daemon_config(moto_server))
    listener = NotifyListener(short_dir / "notify.sock", daemon.stdout_path)
    usec = 400_000  # WATCHDOG=1 every 0.2 s
    try:
        daemon.start(extra_env={"NOTIFY_SOCKET": str(listener.path), "WATCHDOG_USEC": str(usec)})
        ready = listener.wait_for("READY=1")
        # READY came after the API answered.
        assert ready.healthz == 200, ready
        status = [line for line in ready.lines if line.startswith("STATUS=")]
        assert len(status) == 1
        for role in ("api", "relay", "consumer", "claimer", "scheduler"):
            assert role in status[0]

        def pings_for_a_while() -> list[Datagram] | None:  # seven: about 1.5 s of them
            pings = listener.with_line("WATCHDOG=1")
            return pings if len(pings) >= 7 else None

        pings = eventually_sync(pings_for_a_while, 10)
        assert len(pings) >= 4, [d.lines for d in listener.received]
        gaps = [b.at - a.at for a, b in itertools.pairwise(pings)]
        assert max(gaps) < 0.2 * 4, gaps  # about every 0.2 s, never stalled
        assert not listener.with_line("STOPPING=1")

        code = daemon.terminate(timeout_s=30)
        assert code == 0, daemon.all_output()[-3000:]
        stopping = listener.wait_for("STOPPING=1", timeout_s=5)
        assert stopping.at > ready.at
        # READY=1 exactly once.
        assert len(listener.with_line("READY=1")) == 1
    finally:
        daemon.kill()
        listener.close()

    events = [e["event"] for e in daemon.events()]
    ready_at = events.index("daemon_ready")
    for started in (
        "api_listening",
        "relay_started",
        "consumer_started",
        "claimer_started",
        "scheduler_started",
    ):
        assert started in events, started
        assert events.index(started) < ready_at, (started, events[: ready_at + 1])
    assert events.index("shutdown_requested") > ready_at
    assert events[-1] == "daemon_stopped"


def test_no_watchdog_for_another_pid_and_abstract_socket(
    moto_server: MotoServer, tmp_path: Path
) -> None:
    """WATCHDOG_PID naming another process: no pings; an "@name" socket works too."""
    name = f"obx-test-{uuid.uuid4().hex[:8]}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind("\0" + name)
    sock.settimeout(0.2)
    daemon = DaemonProcess(tmp_path, daemon_config(moto_server))
    try:
        daemon.start(
            extra_env={
                "NOTIFY_SOCKET": "@" + name,
                "WATCHDOG_USEC": "200000",
                "WATCHDOG_PID": str(os.getpid()),  # the test runner, not the daemon
            }
        )
        got: list[str] = []
        deadline = time.monotonic() + 1.5
        while time.monotonic() < deadline:
            try:
                got.extend(sock.recv(4096).decode().split("\n"))
            except TimeoutError:
                continue
        assert "READY=1" in got
        assert "WATCHDOG=1" not in got
        assert daemon.terminate(timeout_s=30) == 0
        sock.settimeout(3)
        assert "STOPPING=1" in sock.recv(4096).decode().split("\n")
    finally:
        daemon.kill()
        sock.close()
