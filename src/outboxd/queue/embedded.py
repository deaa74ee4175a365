"""An SQS-compatible server (moto) for development and tests, run as a child process.

A child process rather than moto's in-process threaded server because moto does
blocking work under locks per request: in our process it could stall the event loop.
Killing the child is also the honest way to simulate "SQS went down" (open
connections are reset, new ones refused), which the relay and consumer must survive.

moto keeps everything in memory: after `restart()` every queue is gone, so callers
run `SqsQueues.ensure_queues()` again. Queue URLs stay valid because the port is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import IO

import aiohttp

from outboxd.errors import OutboxdError

HOST = "127.0.0.1"
# Importing moto and flask takes 1-3 s on a cold, shared CPU; the deadline only bounds
# a server that will never answer (a broken install), it is not the normal wait.
DEFAULT_START_TIMEOUT_S = 30.0
DEFAULT_STOP_TIMEOUT_S = 5.0
# An auto-chosen port can be taken between our probe and the child's bind: try anew.
_PORT_ATTEMPTS = 3

# Runs in the child before moto. PR_SET_PDEATHSIG makes the kernel SIGTERM the server
# when its parent dies, so a daemon killed with SIGKILL (or a crashed test run) does
# not leave moto processes behind. Linux only; elsewhere the child merely outlives us.
_BOOTSTRAP = """\
import ctypes, os, signal, sys
parent = int(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG
except (OSError, AttributeError):
    pass
if os.getppid() != parent:  # the parent died before prctl took effect
    sys.exit(0)
import logging
# werkzeug logs a line per request: on a busy daemon that is most of this child's log
# and a measurable share of its CPU. Its warnings and errors still go to the log file.
logging.getLogger("werkzeug").setLevel(logging.WARNING)
try:
    # moto routes every request by listing its own package directory (a stat per
    # AWS service, a few hundred): the listing cannot change while the server runs.
    import moto.backends
    _services = tuple(moto.backends.list_of_moto_modules())
    moto.backends.list_of_moto_modules = lambda: _services
except Exception:  # a moto without that function: route as it always did
    pass
from moto.server import main
main(sys.argv[2:])
"""


class EmbeddedSqsError(OutboxdError, RuntimeError):
    """The embedded server could not start (it exited, or never answered in time)."""


class _ExitedEarly(EmbeddedSqsError):
    """The child exited while starting: most likely its port was taken."""


def free_port(host: str = HOST) -> int:
    """A port the kernel considers free right now (racy by nature; see _PORT_ATTEMPTS)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedSqs:
    """moto's server on 127.0.0.1 in a child process: `async with EmbeddedSqs() as sqs: ...`.

    `port=None` picks a free port at the first start and keeps it for later starts.
    Output goes to `log_path` (appended) or is discarded.
    """

    def __init__(
        self,
        port: int | None = None,
        *,
        log_path: str | Path | None = None,
        start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
        stop_timeout_s: float = DEFAULT_STOP_TIMEOUT_S,
    ) -> None:
        self._port = port
        self._log_path = Path(log_path) if log_path is not None else None
        self._start_timeout_s = start_timeout_s
        self._stop_timeout_s = stop_timeout_s
        self._proc: asyncio.subprocess.Process | None = None

    @property
    def port(self) -> int | None:
        return self._port

    @property
    def endpoint_url(self) -> str:
        if self._port is None:
            raise EmbeddedSqsError("embedded SQS has not been started")
        return f"http://{HOST}:{self._port}"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self.running and self._proc is not None else None

    async def start(self) -> str:
        """Start the server (no-op if running); return its endpoint once it answers HTTP."""
        if self.running:
            return self.endpoint_url
        if self._port is not None:
            # A port given by the caller, or kept from an earlier start: queue URLs embed
            # it, so it must not change behind the caller's back.
            await self._spawn_and_wait(self._port)
            return self.endpoint_url
        for attempt in range(_PORT_ATTEMPTS):
            port = free_port()
            try:
                await self._spawn_and_wait(port)
            except _ExitedEarly:
                if attempt == _PORT_ATTEMPTS - 1:
                    raise
                continue
            self._port = port
            return self.endpoint_url
        raise AssertionError("unreachable")

    async def stop(self) -> None:
        """Terminate the server (SIGTERM, then SIGKILL after stop_timeout_s); idempotent."""
        proc, self._proc = self._proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()

    async def restart(self) -> str:
        """Stop, then start on the same port. moto forgets every queue: re-create them."""
        await self.stop()
        return await self.start()

    async def __aenter__(self) -> EmbeddedSqs:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.stop()

    async def _spawn_and_wait(self, port: int) -> None:
        # Output goes to a file or nowhere: a pipe nobody reads fills up and then blocks
        # moto mid-request, which would look exactly like an SQS outage.
        sink: IO[bytes] | int = subprocess.DEVNULL
        if self._log_path is not None:
            self._log_path.parent.mkdir(parents=True, exist_ok=True)
            sink = self._log_path.open("ab")  # closed below: the child holds its own copy
        try:
            self._proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                _BOOTSTRAP,
                str(os.getpid()),
                "-H",
                HOST,
                "-p",
                str(port),
                stdin=subprocess.DEVNULL,
                stdout=sink,
                stderr=sink,
                # Its own session: a Ctrl-C in the developer's terminal reaches only the
                # daemon, which can then release its messages before stopping this child.
                start_new_session=True,
            )
        finally:
            if not isinstance(sink, int):
                sink.close()
        try:
            await self._wait_until_answering(self._proc, port)
        except BaseException:
            await self.stop()
            raise

    async def _wait_until_answering(self, proc: asyncio.subprocess.Process, port: int) -> None:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._start_timeout_s
        url = f"http://{HOST}:{port}/moto-api/"
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2.0)) as http:
            while True:
                if proc.returncode is not None:
                    raise _ExitedEarly(
                        f"embedded SQS exited with code {proc.returncode} while starting "
                        f"(port {port} taken?)"
                    )
                # Any HTTP answer means werkzeug is serving; moto registers its routes
                # before binding, so the SQS API answers too.
                with contextlib.suppress(aiohttp.ClientError, TimeoutError, OSError):
                    async with http.get(url) as resp:
                        await resp.read()
                        return
                if loop.time() >= deadline:
                    raise EmbeddedSqsError(
                        f"embedded SQS did not answer on port {port} "
                        f"within {self._start_timeout_s:g} s"
                    )
                # Poll: a child whose output we do not pipe gives no other readiness signal.
                # Waiting on proc.wait() instead of sleeping notices an early exit at once.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(proc.wait(), 0.1)
