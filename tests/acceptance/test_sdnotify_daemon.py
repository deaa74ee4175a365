"""sd_notify from the real daemon process (docs/contract.md#process-and-logs):
READY=1 once every role is up, WATCHDOG=1 at half of WATCHDOG_USEC, STOPPING=1 on SIGTERM,
exit 0."""

from __future__ import annotations

import itertools
import os
import re
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.conftest import offline_config
from tests.support.daemon import DaemonProcess
from tests.support.moto import MotoServer

_LISTEN_RE = re.compile(r"listening on (http://[0-9.]+:\d+)")


@dataclass
class Datagram:
    at: float
    lines: list[str]
    healthz: int | None = None  # /healthz status probed the moment READY=1 arrived


@dataclass
class NotifyListener:
    """systemd's side of NOTIFY_SOCKET: an AF_UNIX datagram socket, read in a thread."""

    path: Path
    stderr_path: Path
    received: list[Datagram] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)

    def __post_init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.settimeout(0.1)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return
            dgram = Datagram(time.monotonic(), data.decode().split("\n"))
            if "READY=1" in dgram.lines:
                dgram.healthz = self._probe_healthz()
            self.received.append(dgram)

    def _probe_healthz(self) -> int | None:
        text = self.stderr_path.read_text("utf-8", "replace") if self.stderr_path.exists() else ""
        found = _LISTEN_RE.findall(text)
        if not found:
            return None
        try:
            with urllib.request.urlopen(f"{found[-1]}/healthz", timeout=2) as resp:  # noqa: S310
                return int(resp.status)
        except OSError:
            return -1

    def with_line(self, line: str) -> list[Datagram]:
        return [d for d in self.received if line in d.lines]

    def wait_for(self, line: str, timeout_s: float = 20) -> Datagram:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.with_line(line)
            if got:
                return got[0]
            time.sleep(0.02)
        raise AssertionError(f"no {line} within {timeout_s} s; got {self.received}")

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


def daemon_config(moto: MotoServer) -> dict[str, Any]:
    """Every role (the default), and a scheduler job."""
    return offline_config(
        moto,
        "outboxd.db",
        scheduler={"jobs": [{"name": "tick", "every_s": 3600, "task": "noop"}]},
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """AF_UNIX paths are limited to ~107 bytes; pytest's tmp_path can be longer."""
    base = Path("/tmp") / f"obx-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    yield base
    for p in sorted(base.rglob("*"), reverse=True):
        p.unlink() if not p.is_dir() else p.rmdir()
    base.rmdir()


def test_ready_watchdog_and_stopping(
    moto_server: MotoServer, tmp_path: Path, short_dir: Path
) -> None:
    daemon = DaemonProcess(tmp_path, daemon_config(moto_server))
    listener = NotifyListener(short_dir / "notify.sock", daemon.stderr_path)
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

        time.sleep(1.5)
        pings = listener.with_line("WATCHDOG=1")
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
