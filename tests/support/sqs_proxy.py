"""An SQS endpoint of the test's own in front of moto (or alone): a real aiohttp server on
loopback, and SqsQueues pointed at it. The tests that make SQS misbehave (fail a chosen
call, answer slowly) write only the handler: a module that builds a `Proxy` in its own
`proxy` fixture gets SqsQueues through it from `proxied_queues`
(tests/integration/conftest.py)."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import replace
from typing import Any, Protocol

import aiohttp
from aiohttp import web

from outboxd.config import SqsSettings
from outboxd.queue.sqs import MAX_MESSAGE_BYTES, SqsQueues

HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class Proxy(Protocol):
    """An SQS endpoint of a test's own: the handler it serves, and its base URL once served."""

    url: str

    async def handle(self, request: web.Request) -> web.StreamResponse: ...


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


class RefusingGate:
    """An HTTP hop in front of an SQS server that can refuse every message sent through it.

    While `refusing`, a SendMessageBatch is answered with every entry Failed (a sender
    fault, as SQS names a message it will not take) and a SendMessage with a 400; every
    other call, and every call while not refusing, goes on to `upstream` unchanged.
    """

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.refusing = False
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        target = request.headers.get("X-Amz-Target", "")
        if self.refusing and target.endswith(".SendMessageBatch"):
            entries = json.loads(body).get("Entries") or []
            failed = [
                {
                    "Id": e["Id"],
                    "SenderFault": True,
                    "Code": "InvalidParameterValue",
                    "Message": "refused by the test",
                }
                for e in entries
            ]
            payload = {"Successful": [], "Failed": failed}
            return web.json_response(payload, content_type="application/x-amz-json-1.0")
        if self.refusing and target.endswith(".SendMessage"):
            fault = {"__type": "com.amazonaws.sqs#InvalidParameterValue", "message": "refused"}
            return web.json_response(fault, status=400, content_type="application/x-amz-json-1.0")
        status, payload, headers = await forward(self.upstream, request, body)
        return web.Response(status=status, body=payload, headers=headers)

    async def start(self) -> str:
        app = web.Application(client_max_size=4 * MAX_MESSAGE_BYTES)
        app.router.add_route("*", "/{tail:.*}", self._handle)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{self._runner.addresses[0][1]}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None


class CountingProxy:
    """An SQS endpoint in front of `upstream` that counts every call by action
    (`X-Amz-Target`) and passes it on; a test that wants some calls answered otherwise
    overrides `answer` (None: passed on)."""

    def __init__(self, upstream: str) -> None:
        self.upstream = upstream
        self.url = ""
        self.calls: Counter[str] = Counter()
        # (action, entries in the request, messages in the answer) of every call, in order.
        self.log: list[tuple[str, int, int]] = []

    async def answer(self, action: str, body: dict[str, Any]) -> web.StreamResponse | None:
        return None

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        action = request.headers.get("X-Amz-Target", "").rpartition(".")[2]
        body = json.loads(raw or b"{}")
        self.calls[action] += 1
        entries = len(body.get("Entries") or [])
        own = await self.answer(action, body)
        if own is not None:
            self.log.append((action, entries, 0))
            return own
        status, payload, headers = await forward(self.upstream, request, raw)
        receive = action == "ReceiveMessage" and status == 200
        got = len(json.loads(payload).get("Messages") or []) if receive else 0
        self.log.append((action, entries, got))
        return web.Response(status=status, body=payload, headers=headers)

    def received(self) -> list[int]:
        """The number of messages each answered ReceiveMessage handed out, in order."""
        return [got for action, _, got in self.log if action == "ReceiveMessage"]


def sqs_json(payload: dict[str, Any], status: int = 200) -> web.Response:
    """An answer in SQS's JSON protocol."""
    return web.json_response(payload, status=status, content_type="application/x-amz-json-1.0")
