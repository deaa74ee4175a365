"""The relay through an SQS outage (moto behind a TCP proxy that is cut), on both backends.

docs/contract.md#queue-sqs: a failure of the whole request (connection refused or reset,
a timeout, a 5xx) backs the relay off and spends none of a row's `relay.max_attempts`,
however long it lasts; only SQS refusing the message itself counts. So an outage many
times longer than max_attempts x backoff leaves every row waiting (RETRYABLE_FAILED, its
job QUEUED, its attempts unspent), and when SQS returns they go out; an entry SQS
refuses still ends DEAD after max_attempts. One `sqs_unavailable` line for the outage,
one `sqs_recovered` after it, no line per row. A request's publish that finds SQS back
ends the loop's pause.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
import pytest_asyncio
from structlog.testing import capture_logs
from testkit.moto import MotoServer

from outboxd.config import RelaySettings, Settings
from outboxd.metrics import Metrics
from outboxd.queue.sqs import BatchResult, OutgoingMessage, QueueKind, SqsQueues
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from outboxd.workers.relay import Relay
from tests.conftest import SettingsFactory
from tests.support.clock import Clock
from tests.support.ops import insert_portal_job
from tests.support.relay import drain, relay_settings
from tests.support.tcp_proxy import TcpProxy
from tests.support.waits import consistently, eventually

REFUSAL = "InvalidMessageContents: refused by the test"
MAX_ATTEMPTS = 3


class RefusingPublisher:
    """SqsQueues, except that SQS "refuses" the entries in `refuse` (a `Failed` entry with
    SenderFault, as SQS answers for a message it will not take). It answers only when SQS
    answered: during an outage the request as a whole fails, as it would."""

    def __init__(self, inner: SqsQueues, refuse: set[str]) -> None:
        self.inner = inner
        self.refuse = refuse
        self.calls = 0
        # Entries of sends that got no answer (cut, timed out, cancelled): SQS may still
        # have taken them, so a second copy of those is at-least-once, not a defect.
        self.unanswered: Counter[str] = Counter()

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        self.calls += 1
        passing = [m for m in messages if m.entry_id not in self.refuse]
        refused = [m.entry_id for m in messages if m.entry_id in self.refuse]
        if passing:
            try:
                result = await self.inner.send_batch(kind, passing)
            except BaseException:
                self.unanswered.update(m.entry_id for m in passing)
                raise
            self.unanswered.update(result.outage)
        else:
            await self.inner.ping()  # a request that reaches SQS, or fails as a whole
            result = BatchResult(successful={}, failed={})
        return BatchResult(
            successful=dict(result.successful),
            failed={**result.failed, **dict.fromkeys(refused, REFUSAL)},
            sender_fault={**result.sender_fault, **dict.fromkeys(refused, True)},
            outage=result.outage,
        )


@dataclass
class Rig:
    proxy: TcpProxy
    queues: SqsQueues


@pytest_asyncio.fixture
async def rig(
    make_settings: SettingsFactory, moto_server: MotoServer, queue_names: dict[str, str]
) -> AsyncIterator[Rig]:
    """Queues reached through a proxy in front of the session's moto (which never stops)."""
    upstream = urlsplit(moto_server.endpoint_url)
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 80)
    port = await proxy.start()
    endpoint = f"http://127.0.0.1:{port}"
    settings: Settings = make_settings(
        sqs={"endpoint_url": endpoint, **queue_names, "wait_time_s": 0}
    )
    queues = SqsQueues(settings.sqs, endpoint)
    await queues.start()
    try:
        yield Rig(proxy, queues)
    finally:
        await queues.close()
        await proxy.stop()


def outage_settings(**overrides: Any) -> RelaySettings:
    """Quick: a pass every 0.05 s, backoff 0.1 to 0.2 s, a second to answer."""
    return relay_settings(
        **{
            "interval_s": 0.05,
            "max_attempts": MAX_ATTEMPTS,
            "backoff_base_s": 0.1,
            "backoff_max_s": 0.2,
            "publish_timeout_s": 1.0,
            **overrides,
        }
    )


async def drained_outbox_ids(queues: SqsQueues) -> list[str]:
    """The outbox ids of every message now in the jobs queue (deleted as read)."""
    return [json.loads(body)["outboxId"] for _, body in await drain(queues)]


async def test_an_outage_spends_no_attempt_and_a_refusal_still_ends_dead(
    store: SqlStore, keys: KeyRing, rig: Rig
) -> None:
    clock = Clock()
    made = [await insert_portal_job(store, clock.now, keys, "pw-sqs-down") for _ in range(6)]
    refused_job, refused_row = made[0]
    publisher = RefusingPublisher(rig.queues, {refused_row})
    relay = Relay(store, publisher, outage_settings(), Metrics(), clock=clock)

    await rig.proxy.stop()
    with capture_logs() as during:
        # Three times max_attempts passes, each after every row's backoff: before, each of
        # these would have counted, and every row would be DEAD after the third.
        for _ in range(3 * MAX_ATTEMPTS):
            assert await relay.relay_once() == len(made)
            clock.now += 10.0
    for job_id, outbox_id in made:
        row = await store.get_relay_row(outbox_id)
        job = await store.get_job(job_id)
        assert row is not None and job is not None
        assert (row.status, row.attempt_count) == ("RETRYABLE_FAILED", 0), row
        assert row.last_error is not None and "SQS" in row.last_error, row.last_error
        assert job.status == "QUEUED"
    down = [e for e in during if e["event"] == "sqs_unavailable"]
    assert len(down) == 1 and down[0]["component"] == "relay", during
    # No outbox_publish_failed or outbox_dead per row: the outage line, and the one line
    # of the send window narrowing as calls time out.
    loud = [e["event"] for e in during if e["log_level"] in ("warning", "error")]
    assert loud.count("sqs_unavailable") == 1, loud
    assert loud.count("sqs_send_window_narrowed") <= 1, loud
    assert set(loud) <= {"sqs_unavailable", "sqs_send_window_narrowed"}, loud

    await rig.proxy.start()
    with capture_logs() as after:
        assert await relay.relay_once() == len(made)
    assert [e["component"] for e in after if e["event"] == "sqs_recovered"] == ["relay"]
    sent = await drained_outbox_ids(rig.queues)
    assert sorted(sent) == sorted(o for _, o in made[1:])
    for job_id, outbox_id in made[1:]:
        row = await store.get_relay_row(outbox_id)
        job = await store.get_job(job_id)
        assert row is not None and row.status == "SENT" and row.attempt_count == 1
        assert job is not None and job.status == "RUNNING"

    # The refused message counts: its first attempt above, then max_attempts in all.
    row = await store.get_relay_row(refused_row)
    assert row is not None and (row.status, row.attempt_count) == ("RETRYABLE_FAILED", 1)
    for _ in range(MAX_ATTEMPTS - 1):
        clock.now += 10.0
        assert await relay.relay_once() == 1
    row = await store.get_relay_row(refused_row)
    job = await store.get_job(refused_job)
    assert row is not None and (row.status, row.attempt_count) == ("DEAD", MAX_ATTEMPTS)
    assert row.last_error == REFUSAL
    assert job is not None and job.status == "DEAD" and job.error_code == "RETRIES_EXHAUSTED"


@pytest.mark.real_clock  # how often the loop tries during seconds of outage
async def test_the_loop_backs_off_through_an_outage_and_delivers_when_sqs_returns(
    store: SqlStore, keys: KeyRing, rig: Rig
) -> None:
    """The relay loop itself: while SQS is cut it tries ever less often (not every
    interval), and once it is back every row goes out without a restart."""
    made = [await insert_portal_job(store, time.time(), keys, "pw-loop") for _ in range(5)]
    publisher = RefusingPublisher(rig.queues, set())
    relay = Relay(store, publisher, outage_settings(max_attempts=1), Metrics())
    stop = asyncio.Event()
    await rig.proxy.stop()
    with capture_logs() as logs:
        loop = asyncio.create_task(relay.run(stop))
        try:
            # The outage: 80 intervals of 0.05 s, through which the loop keeps running.
            await consistently(lambda: not loop.done(), 4.0)
            calls_during = publisher.calls
            await rig.proxy.start()

            async def all_sent() -> bool:
                rows = [await store.get_relay_row(o) for _, o in made]
                return all(r is not None and r.status == "SENT" for r in rows)

            with contextlib.suppress(AssertionError):  # the assertions below say what is not
                await eventually(all_sent, 60, interval=0.2)
        finally:
            stop.set()
            await asyncio.wait_for(loop, 30)
    # relay.max_attempts = 1, and still nothing is DEAD: no outage attempt counted.
    rows = [await store.get_relay_row(o) for _, o in made]
    assert all(r is not None and r.status == "SENT" for r in rows), rows
    # Every row went out; a second copy only of one whose send got no answer.
    delivered = Counter(await drained_outbox_ids(rig.queues))
    assert set(delivered) == {o for _, o in made}
    assert all(n == 1 or publisher.unanswered[o] for o, n in delivered.items()), delivered
    # Backing off: a handful of tries in those 4 s (each one SendMessageBatch), not 80.
    print(f"\nSendMessageBatch tries during a 4 s SQS outage: {calls_during}")
    assert 1 <= calls_during <= 12, calls_during
    events = [e["event"] for e in logs]
    assert events.count("sqs_unavailable") == 1, events
    assert events.count("sqs_recovered") == 1, events
    assert "outbox_dead" not in events and "outbox_publish_failed" not in events


@pytest.mark.real_clock  # the loop's pause is real time; the backlog must not wait it out
async def test_a_requests_publish_ends_the_loops_sqs_pause(
    store: SqlStore, keys: KeyRing, rig: Rig
) -> None:
    """SQS cut: the loop pauses (here its 10 s interval, growing to SQS_PAUSE_CAP_S while
    the outage lasts). SQS back and a request's publish answered: the backlog goes out at
    once, not when the pause runs out."""
    # The row's own short backoff after the outage (a millisecond here) is over by then.
    settings = outage_settings(interval_s=10.0, backoff_base_s=0.001, backoff_max_s=0.001)
    relay = Relay(store, rig.queues, settings, Metrics())
    _, backlog = await insert_portal_job(store, time.time(), keys, "pw-pause")
    stop = asyncio.Event()
    await rig.proxy.stop()
    loop = asyncio.create_task(relay.run(stop))

    async def status_is(outbox_id: str, expected: str) -> bool:
        row = await store.get_relay_row(outbox_id)
        assert row is not None
        return row.status == expected

    try:
        # The loop met the outage (no attempt spent) and paused: it enters the pause as soon
        # as that outcome is committed, before this read can return it.
        await eventually(lambda: status_is(backlog, "RETRYABLE_FAILED"), 5, what="the outage")
        await rig.proxy.start()
        _, fresh = await insert_portal_job(store, time.time(), keys, "pw-pause")
        assert await relay.publish_now(fresh) is True
        await eventually(lambda: status_is(backlog, "SENT"), 5, what="the backlog SENT")
    finally:
        stop.set()
        await asyncio.wait_for(loop, 30)
    row = await store.get_relay_row(backlog)
    assert row is not None and row.attempt_count == 1  # the outage's try given back
    assert sorted(await drained_outbox_ids(rig.queues)) == sorted([backlog, fresh])
