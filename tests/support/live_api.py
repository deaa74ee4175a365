"""The daemon's real HTTP listener (ApiServer: guarded site, deadlines, connection cap)
on a loop thread, spoken to with blocking raw sockets.

Unlike aiohttp's TestServer this is the listener `outboxd serve` runs, so parser
errors, read deadlines and the connection cap behave as in production.
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from outboxd.config import Settings
from outboxd.daemon.components import ApiServer, build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.observability import configure_logging
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore, open_store
from tests.support.db import raw_counts
from tests.support.loop_thread import LoopThread
from tests.support.responses import Response
from tests.support.waits import eventually_sync

RawResponse = Response  # headers by lower-case name


def parse_response(data: bytes) -> RawResponse:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers: dict[str, str] = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return RawResponse(status, headers, body)


class LiveApi:
    def __init__(self, db_url: str, settings: Settings, tmp_path: Path) -> None:
        self.logs = io.StringIO()
        configure_logging("info", "json", stream=self.logs)
        self.lt = LoopThread()
        self.db_url = db_url
        self.store: SqlStore = self.lt.run(open_store(db_url, tmp_path, 5, 2.0))
        self.lt.run(self.store.db.migrate())
        self.metrics = Metrics()
        deps = build_api_deps(
            settings, self.store, KeyRing([os.urandom(32)]), self.metrics, None, None
        )
        assert deps.waits is not None
        # The requests held now (read from the test's thread: a plain int).
        self.waits = waits = deps.waits
        self._waits_task: asyncio.Task[None] | None = None

        async def start() -> tuple[ApiServer, asyncio.Event, asyncio.Task[None]]:
            server = ApiServer(
                create_app(deps),
                "127.0.0.1",
                0,
                5.0,
                settings.server,
            )
            stop = asyncio.Event()
            task = asyncio.create_task(server.run(stop))
            # As the daemon runs them: held requests are answered at once on stop.
            self._waits_task = asyncio.create_task(waits.run(stop))
            await asyncio.wait_for(server.bound.wait(), 30)
            return server, stop, task

        self.server, self._stop, self._task = self.lt.run(start())
        assert self.server.address is not None
        self.port = self.server.address[1]

    def connect(self, timeout_s: float = 20.0) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
        return sock

    def send(self, raw: bytes, timeout_s: float = 20.0) -> RawResponse:
        """One request on its own connection; the whole answer (the server closes)."""
        with self.connect(timeout_s) as sock:
            sock.sendall(raw)
            return parse_response(read_until_closed(sock, timeout_s))

    def get(self, path: str, headers: bytes = b"") -> RawResponse:
        return self.send(
            f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n".encode()
            + headers
            + b"Connection: close\r\n\r\n"
        )

    def counts(self) -> dict[str, int]:
        return self.lt.run(raw_counts(self.db_url))

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.logs.getvalue().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"event": "unparsable", "level": "error", "line": line})
        return out

    def wait_for_event(self, name: str, timeout_s: float = 20.0) -> dict[str, Any]:
        def logged() -> dict[str, Any] | None:
            return next((e for e in self.events() if e.get("event") == name), None)

        try:
            return eventually_sync(logged, timeout_s, what=f"{name} in the log")
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {self.logs.getvalue()[-2000:]}") from None

    def close(self) -> None:
        try:

            async def stop() -> None:
                self._stop.set()
                await asyncio.wait_for(self._task, 30)
                if self._waits_task is not None:
                    await self._waits_task
                await self.store.close()

            self.lt.run(stop())
        finally:
            self.lt.close()
            configure_logging("info", "json")


def read_until_closed(sock: socket.socket, timeout_s: float) -> bytes:
    """Everything the server sends until it closes (or `timeout_s` passes: TimeoutError)."""
    deadline = time.monotonic() + timeout_s
    data = b""
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"still open after {timeout_s}s; got {data[:200]!r}")
        sock.settimeout(left)
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
