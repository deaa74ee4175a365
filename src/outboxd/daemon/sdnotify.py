"""The sd_notify protocol (READY, STOPPING, WATCHDOG, STATUS, EXTEND_TIMEOUT_USEC) without
libsystemd.

The protocol is one datagram of newline-separated ``KEY=value`` lines sent to the
AF_UNIX socket named by ``NOTIFY_SOCKET``; that is small enough to implement here
rather than add a dependency. Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Mapping

import structlog

from outboxd.workers.loops import sleep_or_stop

__all__ = ["SystemdNotifier"]


class SystemdNotifier:
    """Sends service state to systemd; never raises, so a broken socket cannot stop the daemon."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self._address = _socket_address(env.get("NOTIFY_SOCKET", ""))
        self._watchdog_interval_s = _watchdog_interval_s(env) if self._address is not None else None
        # Set after a failed send and cleared by a successful one, so an outage logs one
        # warning instead of one per watchdog tick.
        self._failing = False

    @property
    def enabled(self) -> bool:
        """Whether a usable NOTIFY_SOCKET was given."""
        return self._address is not None

    @property
    def watchdog_interval_s(self) -> float | None:
        """Half of WATCHDOG_USEC in seconds (systemd's advice), or None if no watchdog is ours."""
        return self._watchdog_interval_s

    def notify(self, *lines: str) -> None:
        """Send `lines` (e.g. "READY=1", "STATUS=...") to systemd as one datagram."""
        if self._address is None or not lines:
            return
        payload = "\n".join(lines).encode("utf-8")
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
                # Non-blocking: a stalled PID 1 must not freeze the event loop; a full
                # receive queue then surfaces as an error (logged) instead of a hang.
                sock.setblocking(False)
                sock.sendto(payload, self._address)
        except OSError as exc:
            if not self._failing:
                self._failing = True
                structlog.get_logger(__name__).warning(
                    "sd_notify_failed",
                    error=f"{type(exc).__name__}: {exc}",
                    notify_socket=_display(self._address),
                )
            return
        self._failing = False

    def ready(self, status: str | None = None) -> None:
        """Tell systemd start-up is complete (Type=notify), optionally with a status line."""
        if status is None:
            self.notify("READY=1")
        else:
            self.notify("READY=1", _status_line(status))

    def status(self, text: str) -> None:
        """A one-line status for `systemctl status` (STATUS=)."""
        self.notify(_status_line(text))

    def extend_start(self, seconds: float, status: str | None = None) -> None:
        """Ask for `seconds` more before systemd's start timeout (EXTEND_TIMEOUT_USEC): sent
        while the daemon waits for its database or migrates, so neither is cut short."""
        line = f"EXTEND_TIMEOUT_USEC={max(1, int(seconds * 1_000_000))}"
        if status is None:
            self.notify(line)
        else:
            self.notify(line, _status_line(status))

    def stopping(self) -> None:
        """Tell systemd shutdown has begun, so it waits up to TimeoutStopSec for the exit."""
        self.notify("STOPPING=1")

    def watchdog(self) -> None:
        """Reset systemd's watchdog timer."""
        self.notify("WATCHDOG=1")

    async def run_watchdog(self, stop: asyncio.Event) -> None:
        """Send WATCHDOG=1 every `watchdog_interval_s` until `stop` is set; no-op without one."""
        interval = self._watchdog_interval_s
        if interval is None:
            return
        while not stop.is_set():
            # Sent from the event loop itself, so a wedged loop stops the pings and
            # systemd restarts the daemon: that is the point of the watchdog.
            self.watchdog()
            await sleep_or_stop(stop, interval)


def _socket_address(value: str) -> str | None:
    if value.startswith("@") and len(value) > 1:
        # Linux abstract namespace: the leading "@" stands for a NUL byte.
        return "\0" + value[1:]
    if value.startswith("/"):
        return value
    # Unset, empty, or a kind we do not speak (e.g. "vsock:..."): behave as outside systemd.
    return None


def _watchdog_interval_s(env: Mapping[str, str]) -> float | None:
    pid = env.get("WATCHDOG_PID")
    # systemd names the process the watchdog is meant for; a child that inherited the
    # environment must not keep its parent alive by pinging on its behalf.
    if pid and pid.strip() != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    if usec <= 0:
        return None
    return usec / 2 / 1_000_000


def _status_line(status: str) -> str:
    # A newline would start a new assignment inside the datagram (e.g. a forged READY=1).
    return "STATUS=" + " ".join(status.splitlines())


def _display(address: str) -> str:
    return "@" + address[1:] if address.startswith("\0") else address
