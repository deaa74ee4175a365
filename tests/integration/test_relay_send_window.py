"""The relay against an SQS that answers one call at a time, slowly, on both backends.

SQS is the session's moto behind a small HTTP proxy of our own that holds every
SendMessageBatch for `hold_s` and lets only one through at a time (moto under load, or a
throttled endpoint, behaves this way). The relay's fixed shape would put twenty calls at
it at once: the last of them waits twenty times hold_s, passes `relay.publish_timeout_s`, and its
rows are published again. The send window (workers/send_window.py) narrows instead, so
every call is answered in time and every row goes out once, the loop's rows and the
requests' alike. A call the relay gave up on at its publish timeout may still have reached
SQS, and at-least-once delivery lets its rows go out again (a busy machine's moto can be
that slow); any other row published twice is a defect. So the test notes the calls that
timed out (`TimedOut`) and allows a second copy of exactly their rows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from testkit.moto import MotoServer

from outboxd.metrics import Metrics
from outboxd.queue.sqs import BatchResult, OutgoingMessage, QueueKind, SqsQueues
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from outboxd.workers.relay import Relay, relay_shape
from tests.support.ops import insert_portal_job
from tests.support.relay import all_rows, drain, relay_settings
from tests.support.sqs_proxy import forward
from tests.support.waits import eventually


@dataclass
class SerialSlowProxy:
    """Forwards everything to moto; SendMessageBatch calls go one at a time, each held
    `hold_s` first. `received` counts every entry id that reached the proxy (a call the
    client gave up on still arrives, as at SQS); `peak` is the most calls it held at once."""

    upstream: str
    hold_s: float = 0.08
    received: Counter[str] = field(default_factory=Counter)
    waiting: int = 0
    peak: int = 0
    url: str = ""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("X-Amz-Target", "").endswith(".SendMessageBatch"):
            self.received.update(e["Id"] for e in json.loads(body)["Entries"])
            self.waiting += 1
            self.peak = max(self.peak, self.waiting)
            try:
                async with self.lock:
                    await asyncio.sleep(self.hold_s)
                    return await self.forward(request, body)
            finally:
                self.waiting -= 1
        return await self.forward(request, body)

    async def forward(self, request: web.Request, body: bytes) -> web.Response:
        status, payload, headers = await forward(self.upstream, request, body)
        return web.Response(status=status, body=payload, headers=headers)


@dataclass
class TimedOut:
    """The relay's SQS client, noting the entries of every SendMessageBatch the relay gave
    up on: its publish timeout cancels the call, so a cancelled call is one that timed out."""

    queues: SqsQueues
    entries: Counter[str] = field(default_factory=Counter)

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        try:
            return await self.queues.send_batch(kind, messages)
        except asyncio.CancelledError:
            self.entries.update(m.entry_id for m in messages)
            raise


@pytest.fixture
def proxy(moto_server: MotoServer) -> SerialSlowProxy:
    """In front of the session's moto; `proxied_queues` serves it."""
    return SerialSlowProxy(upstream=moto_server.endpoint_url.rstrip("/"))


@pytest.mark.real_clock  # an SQS that answers slowly, one call at a time
async def test_a_slow_serial_sqs_gets_every_row_once_from_the_loop_and_the_requests(
    store: SqlStore, keys: KeyRing, proxy: SerialSlowProxy, proxied_queues: SqsQueues
) -> None:
    now = time.time()
    loop_rows = [await insert_portal_job(store, now - 1, keys, "pw-window") for _ in range(200)]
    asked = [await insert_portal_job(store, now, keys, "pw-window") for _ in range(20)]
    shape = relay_shape(store.db.backend)
    metrics = Metrics()
    timed_out = TimedOut(proxied_queues)
    # 1 s to answer; twenty calls held 80 ms each, one after the other, take 1.6 s. The
    # window narrows once a call takes more than 0.25 s (three or four calls queued at the
    # proxy), which leaves moto itself 80 ms a call of slack on a loaded machine before
    # even the six calls `peak` allows would pass the timeout (with 40 ms and 0.5 s, a
    # busy CI machine's moto once made ten rows go out twice).
    relay = Relay(
        store,
        timed_out,
        relay_settings(publish_timeout_s=1.0, backoff_base_s=0.1, backoff_max_s=0.2),
        metrics,
        lanes=shape.lanes,
        batches_per_round=shape.batches_per_round,
    )
    assert shape.lanes * shape.batches_per_round >= 20

    def sent_twice() -> bool:
        """A row out more than once with no timed-out call of it: the defect looked for."""
        return any(n >= 2 and o not in timed_out.entries for o, n in proxy.received.items())

    async def settled() -> bool:
        """Passes back to back while they publish; then every row SENT, or a row went
        out twice (the assertions below then say which). Rows backing off: again."""
        while not sent_twice() and await relay.relay_pass():
            pass
        return sent_twice() or all(r.status == "SENT" for r in await all_rows(store))

    async def run_loop() -> None:
        with contextlib.suppress(AssertionError):  # the assertions below say what is not
            await eventually(settled, 30)

    answers = await asyncio.gather(run_loop(), *(relay.publish_now(o) for _, o in asked))

    assert answers[1:] == [True] * len(asked)
    rows = {r.id: r for r in await all_rows(store)}
    every = [o for _, o in loop_rows + asked]
    assert all(rows[o].status == "SENT" and rows[o].last_error is None for o in every)
    # A row may reach SQS once more for each call of it that timed out, and no more.
    over = {
        o: (n, timed_out.entries[o])
        for o, n in proxy.received.items()
        if n > 1 + timed_out.entries[o]
    }
    assert over == {}, f"rows published more often than their publishes timed out: {over}"
    assert sorted(proxy.received) == sorted(every)
    failed = metrics.registry.get_sample_value(
        "outboxd_relay_publishes_total", {"result": "failed"}
    )
    # The only failures are the timed-out calls' rows (an outage: no attempt spent).
    assert (failed or 0.0) == sum(timed_out.entries.values())
    # The window kept the calls at the proxy few: each was answered in time.
    assert proxy.peak <= 6, proxy.peak
    received = await drain(proxied_queues)
    assert sorted(json.loads(b)["outboxId"] for _, b in received) == sorted(every)


@pytest.mark.real_clock  # a lease that really runs short
async def test_a_row_whose_lease_would_run_out_during_its_call_waits_for_its_next_claim(
    store: SqlStore, keys: KeyRing, proxy: SerialSlowProxy, proxied_queues: SqsQueues
) -> None:
    """A row that reaches its call with less lease left than the call and the recording of
    its outcome may take (it waited that long for the send window) is not sent by that
    holder, which could otherwise send it beside the next holder with no timeout behind
    the second copy; it goes out once, on its next claim."""
    _, oid = await insert_portal_job(store, time.time() - 1, keys, "pw-lease")
    relay = Relay(store, proxied_queues, relay_settings(publish_timeout_s=1.0), Metrics())
    # Claimed by a holder with 1.5 s of lease left: less than a 1 s call plus its recording.
    held = await store.claim_relay_row(oid, time.time(), 1.5)
    assert held is not None
    assert await relay.dispatch(oid, held) is None
    assert proxy.received == Counter()
    [row] = [r for r in await all_rows(store) if r.id == oid]
    assert row.status != "SENT"

    async def sent() -> bool:
        await relay.relay_pass()
        return all(r.status == "SENT" for r in await all_rows(store))

    await eventually(sent, 10, what="the row sent on its next claim")
    assert proxy.received == Counter({oid: 1})
