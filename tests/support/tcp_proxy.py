"""An asyncio TCP proxy on 127.0.0.1 that can drop a database "off the network" and back.

`stop()` closes the listener and every open connection (both directions), so a
client sees exactly what it sees when the server goes away; `start()` listens on
the same port again. With `ssl` it terminates TLS in front of a plain upstream.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import ssl as _ssl
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit


def via_proxy(dsn: str, port: int) -> str:
    """`dsn` (a Postgres URL) pointed at a proxy on loopback `port` instead."""
    parts = urlsplit(dsn)
    netloc = parts.netloc.rsplit("@", 1)
    creds = netloc[0] + "@" if len(netloc) == 2 else ""
    return urlunsplit(parts._replace(netloc=f"{creds}127.0.0.1:{port}"))


def outside_ephemeral_port() -> int:
    """A free loopback port below the kernel's ephemeral range: one a stopped proxy can
    listen on again, since no outgoing connection is ever given it meanwhile (a port of the
    ephemeral range was, under load: `address already in use` at the restart)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    for _ in range(200):
        port = random.randrange(10_000, max(10_001, low))
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise OSError("no free loopback port below the ephemeral range")


class TcpProxy:
    def __init__(
        self,
        upstream_host: str = "127.0.0.1",
        upstream_port: int = 5432,
        ssl: _ssl.SSLContext | None = None,
    ) -> None:
        self.upstream_host = upstream_host
        self.upstream_port = upstream_port
        self.ssl = ssl
        self.port = 0
        # Connections accepted (with `ssl`: handshakes completed), since construction.
        self.accepted = 0
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._flowing = asyncio.Event()
        self._flowing.set()

    @property
    def running(self) -> bool:
        return self._server is not None

    async def start(self) -> int:
        """Listen (on the same port as before after a stop); the port."""
        if self._server is not None:
            return self.port
        if self.port == 0:
            self.port = outside_ephemeral_port()
        self._server = await asyncio.start_server(
            self._accept, "127.0.0.1", self.port, reuse_address=True, ssl=self.ssl
        )
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self.port

    async def stop(self) -> None:
        """Close the listener and every connection through the proxy."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for w in list(self._writers):
            with contextlib.suppress(Exception):
                w.transport.abort()
        self._writers.clear()
        tasks = list(self._tasks)
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 5)

    def freeze(self) -> None:
        """A network partition: connections stay open and accepted, but no byte goes through."""
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    async def _accept(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(client_w)
        self.accepted += 1
        upstream_w: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()
            upstream_r, upstream_w = await asyncio.open_connection(
                self.upstream_host, self.upstream_port
            )
            self._writers.add(upstream_w)
            await asyncio.gather(self._pipe(client_r, upstream_w), self._pipe(upstream_r, client_w))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (client_w, upstream_w):
                if w is not None:
                    self._writers.discard(w)
                    with contextlib.suppress(Exception):
                        w.transport.abort()
            self._tasks.discard(task)

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                # Bytes read while frozen are held back, as a partitioned network does.
                await self._flowing.wait()
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort()
