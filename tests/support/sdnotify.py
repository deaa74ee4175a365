"""systemd's side of NOTIFY_SOCKET for tests of the daemon as a subprocess: an AF_UNIX
datagram socket read in a thread, every datagram kept with the time it came."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from testkit.daemon import listening_url

from tests.support.waits import eventually_sync


@dataclass
class Datagram:
    at: float
    lines: list[str]
    healthz: int | None = None  # /healthz status probed the moment READY=1 arrived


@dataclass
class NotifyListener:
    """systemd's side of NOTIFY_SOCKET: an AF_UNIX datagram socket, read in a thread."""

    path: Path
    stdout_path: Path
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
        text = self.stdout_path.read_text("utf-8", "replace") if self.stdout_path.exists() else ""
        url = listening_url(text)
        if url is None:
            return None
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as resp:  # noqa: S310
                return int(resp.status)
        except OSError:
            return -1

    def with_line(self, line: str) -> list[Datagram]:
        return [d for d in self.received if line in d.lines]

    def wait_for(self, line: str, timeout_s: float = 20) -> Datagram:
        got = eventually_sync(lambda: self.with_line(line), timeout_s, what=line, interval=0.02)
        return got[0]

    def close(self) -> None:
        self._stop.set()
        self.thread.join(2)
        self.sock.close()


@contextlib.contextmanager
def short_tmp_dir() -> Iterator[Path]:
    """A fresh folder under /tmp: AF_UNIX paths are limited to ~107 bytes, and pytest's
    tmp_path can be longer."""
    base = Path("/tmp") / f"obx-{uuid.uuid4().hex[:8]}"
    base.mkdir()
    try:
        yield base
    finally:
        for p in sorted(base.rglob("*"), reverse=True):
            p.unlink() if not p.is_dir() else p.rmdir()
        base.rmdir()
