"""sd_notify over a real AF_UNIX datagram socket standing in for systemd's NOTIFY_SOCKET."""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from outboxd.daemon.sdnotify import SystemdNotifier

# sun_path holds 108 bytes; a deep pytest tmp_path can exceed it.
_MAX_SUN_PATH = 100


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A bound datagram socket and the NOTIFY_SOCKET value that reaches it."""
    path = tmp_path / "notify.sock"
    short_dir: tempfile.TemporaryDirectory[str] | None = None
    if len(os.fsencode(path)) > _MAX_SUN_PATH:
        short_dir = tempfile.TemporaryDirectory(prefix="sdn")
        path = Path(short_dir.name) / "n.sock"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(path))
    sock.settimeout(5)
    try:
        yield sock, str(path)
    finally:
        sock.close()
        if short_dir is not None:
            short_dir.cleanup()


def _recv(sock: socket.socket) -> bytes:
    return sock.recv(65536)


def _assert_nothing_queued(sock: socket.socket) -> None:
    sock.setblocking(False)
    with pytest.raises(BlockingIOError):
        sock.recv(65536)


def test_disabled_without_notify_socket() -> None:
    """Without NOTIFY_SOCKET the notifier is off, has no watchdog, and every call is a no-op."""
    notifier = SystemdNotifier({"WATCHDOG_USEC": "30000000"})
    assert notifier.enabled is False
    assert notifier.watchdog_interval_s is None
    notifier.ready("up")
    notifier.stopping()
    notifier.watchdog()


@pytest.mark.parametrize("value", ["", "relative/path.sock", "vsock:2:1234", "@"])
def test_unusable_notify_socket_disables(value: str) -> None:
    """A NOTIFY_SOCKET that is neither an absolute path nor an abstract name disables it."""
    assert SystemdNotifier({"NOTIFY_SOCKET": value}).enabled is False


def test_reads_process_environment_by_default(
    monkeypatch: pytest.MonkeyPatch, receiver: tuple[socket.socket, str]
) -> None:
    """With no mapping given, NOTIFY_SOCKET is read from os.environ."""
    sock, address = receiver
    monkeypatch.setenv("NOTIFY_SOCKET", address)
    notifier = SystemdNotifier()
    assert notifier.enabled is True
    notifier.watchdog()
    assert _recv(sock) == b"WATCHDOG=1"


def test_ready_sends_exact_datagram(receiver: tuple[socket.socket, str]) -> None:
    """ready() sends READY=1 alone, or READY=1 and STATUS in one datagram."""
    sock, address = receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})
    notifier.ready()
    notifier.ready("serving: api relay consumer")
    assert _recv(sock) == b"READY=1"
    assert _recv(sock) == b"READY=1\nSTATUS=serving: api relay consumer"


def test_status_newlines_cannot_inject_assignments(receiver: tuple[socket.socket, str]) -> None:
    """A newline inside the status text is flattened so it cannot add a second assignment."""
    sock, address = receiver
    SystemdNotifier({"NOTIFY_SOCKET": address}).ready("a\nWATCHDOG=1")
    assert _recv(sock) == b"READY=1\nSTATUS=a WATCHDOG=1"


def test_stopping_watchdog_and_raw_lines(receiver: tuple[socket.socket, str]) -> None:
    """stopping(), watchdog() and notify(*lines) each send exactly one datagram."""
    sock, address = receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address})
    notifier.stopping()
    notifier.watchdog()
    notifier.notify("STATUS=draining", "EXTEND_TIMEOUT_USEC=5000000")
    notifier.notify()
    assert _recv(sock) == b"STOPPING=1"
    assert _recv(sock) == b"WATCHDOG=1"
    assert _recv(sock) == b"STATUS=draining\nEXTEND_TIMEOUT_USEC=5000000"
    _assert_nothing_queued(sock)


@pytest.mark.skipif(sys.platform != "linux", reason="abstract AF_UNIX sockets are Linux-only")
def test_abstract_socket() -> None:
    """A NOTIFY_SOCKET starting with "@" addresses the Linux abstract namespace."""
    name = f"outboxd-test-{uuid.uuid4().hex}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        notifier = SystemdNotifier({"NOTIFY_SOCKET": "@" + name})
        assert notifier.enabled is True
        notifier.ready("ok")
        assert _recv(sock) == b"READY=1\nSTATUS=ok"


def test_send_failure_never_raises_and_warns_once(tmp_path: Path) -> None:
    """A missing socket makes notify() log one sd_notify_failed warning per outage, not raise."""
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(tmp_path / "gone.sock")})
    with capture_logs() as logs:
        notifier.ready()
        notifier.watchdog()
        notifier.stopping()
    failures = [e for e in logs if e["event"] == "sd_notify_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "warning"
    assert "FileNotFoundError" in failures[0]["error"]
    assert failures[0]["notify_socket"] == str(tmp_path / "gone.sock")


def test_warns_again_after_recovery(tmp_path: Path) -> None:
    """After a successful send, a new failure is logged again."""
    path = tmp_path / "n.sock"
    if len(os.fsencode(path)) > _MAX_SUN_PATH:
        pytest.skip("tmp_path too long for an AF_UNIX address")
    notifier = SystemdNotifier({"NOTIFY_SOCKET": str(path)})
    with capture_logs() as logs:
        notifier.watchdog()  # fails: nothing bound yet
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(str(path))
            notifier.watchdog()  # succeeds
        path.unlink()
        notifier.watchdog()  # fails again
    assert [e["event"] for e in logs] == ["sd_notify_failed", "sd_notify_failed"]


def test_watchdog_interval_is_half_of_watchdog_usec() -> None:
    """watchdog_interval_s is WATCHDOG_USEC / 2, in seconds, as systemd recommends."""
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", "WATCHDOG_USEC": "30000000"}
    assert SystemdNotifier(env).watchdog_interval_s == 15.0


def test_watchdog_for_our_pid_is_enabled() -> None:
    """WATCHDOG_PID naming this process keeps the watchdog on."""
    env = {
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "WATCHDOG_USEC": "1000000",
        "WATCHDOG_PID": str(os.getpid()),
    }
    assert SystemdNotifier(env).watchdog_interval_s == 0.5


@pytest.mark.parametrize(
    "extra",
    [
        {},
        {"WATCHDOG_USEC": "0"},
        {"WATCHDOG_USEC": "-5"},
        {"WATCHDOG_USEC": "soon"},
        {"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "1"},
    ],
)
def test_watchdog_disabled(extra: dict[str, str]) -> None:
    """A missing, non-positive or bad WATCHDOG_USEC, or another WATCHDOG_PID, means no watchdog."""
    env = {"NOTIFY_SOCKET": "/run/systemd/notify", **extra}
    if extra.get("WATCHDOG_PID") == str(os.getpid()):
        pytest.skip("test runs as PID 1")
    assert SystemdNotifier(env).watchdog_interval_s is None


async def test_run_watchdog_pings_until_stopped(receiver: tuple[socket.socket, str]) -> None:
    """run_watchdog sends WATCHDOG=1 at once and then every interval, and returns when stopped."""
    sock, address = receiver
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "40000"})
    assert notifier.watchdog_interval_s == 0.02
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(notifier.run_watchdog(stop))
        for _ in range(3):
            assert await asyncio.wait_for(loop.sock_recv(sock, 65536), 5) == b"WATCHDOG=1"
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_run_watchdog_stops_promptly_mid_interval(
    receiver: tuple[socket.socket, str],
) -> None:
    """Setting stop ends run_watchdog without waiting out a long interval."""
    sock, address = receiver
    sock.setblocking(False)
    loop = asyncio.get_running_loop()
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "600000000"})
    stop = asyncio.Event()
    async with asyncio.TaskGroup() as tg:
        task = tg.create_task(notifier.run_watchdog(stop))
        assert await asyncio.wait_for(loop.sock_recv(sock, 65536), 5) == b"WATCHDOG=1"
        stop.set()
        await asyncio.wait_for(task, 5)


async def test_run_watchdog_returns_at_once_when_disabled() -> None:
    """Without a watchdog, run_watchdog returns immediately even though stop is never set."""
    notifier = SystemdNotifier({"NOTIFY_SOCKET": "/run/systemd/notify"})
    await asyncio.wait_for(notifier.run_watchdog(asyncio.Event()), 5)


async def test_run_watchdog_returns_when_already_stopped(
    receiver: tuple[socket.socket, str],
) -> None:
    """A stop event that is already set means no ping is sent at all."""
    sock, address = receiver
    notifier = SystemdNotifier({"NOTIFY_SOCKET": address, "WATCHDOG_USEC": "1000000"})
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(notifier.run_watchdog(stop), 5)
    _assert_nothing_queued(sock)
