"""An SQS endpoint that counts: a loopback reverse proxy in front of an SQS server (moto).

    python -m bench.sqscount --upstream URL --port-file PATH

Every request is passed on to `--upstream` as it came (the Host header too, so the queue
URLs the server hands out name this proxy and every later call comes through it) and its
answer passed back. Counted per action (`X-Amz-Target: AmazonSQS.<Action>`, or the query
protocol's `Action=`): requests, the entries of the batch calls, and the ReceiveMessage
calls answered with no message (a long poll that ran out: counted per time, not per job).

`GET /counts` answers the counters so far as JSON:

    {"requests": {action: n}, "entries": {action: n}, "empty_receives": n,
     "received": n}   # messages handed out by ReceiveMessage

Writes `{"endpoint_url": ..., "pid": ...}` to PATH once listening and serves until
SIGTERM or SIGINT, like the other bench servers (testkit's FakeProcess starts it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import aiohttp
from aiohttp import web

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "keep-alive"}
BATCH_ACTIONS = ("SendMessageBatch", "DeleteMessageBatch", "ChangeMessageVisibilityBatch")


class Counts:
    def __init__(self) -> None:
        self.requests: Counter[str] = Counter()
        self.entries: Counter[str] = Counter()
        self.empty_receives = 0
        self.received = 0

    def as_json(self) -> dict[str, Any]:
        return {
            "requests": dict(self.requests),
            "entries": dict(self.entries),
            "empty_receives": self.empty_receives,
            "received": self.received,
        }


def action_of(target: str, body: bytes) -> str:
    if target:
        return target.rpartition(".")[2]
    try:  # the query protocol (aiobotocore before SQS spoke JSON)
        return parse_qs(body.decode("utf-8", "replace")).get("Action", ["?"])[0]
    except ValueError:
        return "?"


class CountingProxy:
    def __init__(self, upstream: str) -> None:
        self.upstream = upstream.rstrip("/")
        self.counts = Counts()
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        # No read timeout: a long poll answers after up to 20 s.
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        self._session = aiohttp.ClientSession(
            timeout=timeout,
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
            skip_auto_headers=("Accept-Encoding", "User-Agent", "Content-Type"),
        )

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def handle(self, request: web.Request) -> web.StreamResponse:
        assert self._session is not None
        body = await request.read()
        action = action_of(request.headers.get("X-Amz-Target", ""), body)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        async with self._session.request(
            request.method, self.upstream + request.path_qs, data=body, headers=headers
        ) as resp:
            payload = await resp.read()
            out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
            status = resp.status
        self._count(action, body, status, payload)
        return web.Response(status=status, body=payload, headers=out)

    def _count(self, action: str, body: bytes, status: int, payload: bytes) -> None:
        c = self.counts
        c.requests[action] += 1
        if action in BATCH_ACTIONS:
            with contextlib.suppress(ValueError, AttributeError):
                c.entries[action] += len(json.loads(body).get("Entries") or [])
        if action == "ReceiveMessage" and status == 200:
            try:
                got = len(json.loads(payload).get("Messages") or [])
            except (ValueError, AttributeError):
                got = 0
            c.received += got
            c.empty_receives += got == 0


async def main(args: argparse.Namespace) -> None:
    proxy = CountingProxy(args.upstream)
    await proxy.start()

    async def counts(_request: web.Request) -> web.Response:
        return web.json_response(proxy.counts.as_json())

    app = web.Application(client_max_size=4 * 1024 * 1024)
    app.router.add_get("/counts", counts)
    app.router.add_route("*", "/{tail:.*}", proxy.handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    port_file = Path(args.port_file)
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(json.dumps({"endpoint_url": url, "pid": os.getpid()}))
    tmp.replace(port_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        await proxy.close()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--upstream", required=True, help="the SQS server's endpoint URL")
    p.add_argument("--port-file", required=True)
    asyncio.run(main(p.parse_args()))
