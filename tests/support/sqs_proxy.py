"""An SQS endpoint of the test's own in front of moto (or alone): a real aiohttp server on
loopback, and SqsQueues pointed at it. The tests that make SQS misbehave (fail a chosen
call, answer slowly) write only the handler."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any

import aiohttp
from aiohttp import web

from outboxd.config import SqsSettings
from outboxd.queue.sqs import MAX_MESSAGE_BYTES, SqsQueues

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@asynccontextmanager
async def serve(handler: Handler, path: str = "/{tail:.*}") -> AsyncIterator[str]:
    """`handler` for every method on `path`, on a free loopback port; yields the base URL."""
    app = web.Application(client_max_size=4 * MAX_MESSAGE_BYTES)
    app.router.add_route("*", path, handler)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def forward(
    upstream: str, request: web.Request, body: bytes
) -> tuple[int, bytes, dict[str, str]]:
    """`request` (whose body was read as `body`) sent on to `upstream`: its status, body
    and headers, hop-by-hop headers left out both ways."""
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            request.method, upstream + request.path_qs, data=body, headers=headers
        ) as resp,
    ):
        payload = await resp.read()
        out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP_HEADERS}
        return resp.status, payload, out


def queue_settings(endpoint_url: str, **overrides: Any) -> SqsSettings:
    """SqsSettings for fresh queues of a test's own at `endpoint_url`."""
    prefix = uuid.uuid4().hex[:12]
    base = SqsSettings(
        endpoint_url=endpoint_url,
        jobs_queue=f"t{prefix}-jobs",
        tasks_queue=f"t{prefix}-tasks.fifo",
        create_queues=True,
        max_receive_count=2,
        visibility_timeout_s=30,
        wait_time_s=0,  # short polls keep the suite fast; long polls are tested explicitly
    )
    return replace(base, **overrides)


@asynccontextmanager
async def queues_at(url: str) -> AsyncIterator[SqsQueues]:
    """SqsQueues on fresh queues (created through `url`), closed afterwards."""
    q = SqsQueues(queue_settings(url), url)
    await q.start()
    try:
        yield q
    finally:
        await q.close()
