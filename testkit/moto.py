"""moto's SQS server as a child process on loopback (sync, loop-free): tests and bench."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from testkit.process import terminate


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class MotoServer:
    def __init__(self, log_path: Path, lenient_purge: bool = False) -> None:
        self.port = free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        # The benchmarks purge between points; moto otherwise allows one purge a minute.
        strict = {"MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR": "false"}
        self.env = {**os.environ, **strict} if lenient_purge else None

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout_s: float = 30.0) -> str:
        with self.log_path.open("ab") as sink:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=sink,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                env=self.env,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"moto exited early; see {self.log_path}")
            try:
                url = f"{self.endpoint_url}/moto-api/"  # always http://127.0.0.1
                with urllib.request.urlopen(url, timeout=1):  # noqa: S310
                    return self.endpoint_url
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("moto did not answer in time")

    def restart(self, timeout_s: float = 30.0) -> str:
        """Start a stopped server again on its old port (empty: moto keeps no state)."""
        deadline = time.monotonic() + timeout_s
        while True:  # the old listening socket can linger for a moment
            with socket.socket() as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                try:
                    s.bind(("127.0.0.1", self.port))
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
        return self.start()

    def stop(self) -> None:
        if self.proc is not None:
            terminate(self.proc)
        self.proc = None

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid
