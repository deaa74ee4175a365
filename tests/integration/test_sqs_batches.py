"""The batch calls by receipt handle, the coalesced deletes (queue/deletes.py) and the wait of
messages received ahead (workers/prefetch.py), against a real moto on loopback. Nothing
here touches a database: the consumer's side, on both backends, is
tests/integration/test_consumer_requests.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from testkit.moto import MotoServer

from outboxd.queue.deletes import CoalescedDeletes
from outboxd.queue.sqs import OutgoingMessage, QueueDepth, ReceivedMessage, SqsQueues
from outboxd.workers.handler_slots import HandlerSlots
from outboxd.workers.prefetch import hand_out
from tests.support.sqs_proxy import CountingProxy, queues_at, serve
from tests.support.waits import consistently, eventually


@pytest_asyncio.fixture
async def proxy(moto_server: MotoServer) -> AsyncIterator[CountingProxy]:
    counting = CountingProxy(moto_server.endpoint_url)
    async with serve(counting.handle) as counting.url:
        yield counting


@pytest_asyncio.fixture
async def q(proxy: CountingProxy) -> AsyncIterator[SqsQueues]:
    async with queues_at(proxy.url) as queues:
        yield queues


async def received(q: SqsQueues, n: int, visibility_s: int = 30) -> list[ReceivedMessage]:
    """`n` fresh messages on the jobs queue, received (in flight)."""
    for start in range(0, n, 10):
        batch = [OutgoingMessage(f"m{i}", f"body-{i}") for i in range(start, min(n, start + 10))]
        assert not (await q.send_batch("jobs", batch)).failed
    got: list[ReceivedMessage] = []
    while len(got) < n:
        got += await q.receive("jobs", min(10, n - len(got)), 0, visibility_s)
    return got


async def test_batch_calls_report_the_entries_sqs_failed(q: SqsQueues) -> None:
    a, b, c = await received(q, 3)
    failed = await q.change_visibility_batch("jobs", [a.receipt_handle, b.receipt_handle], 0)
    assert failed == {}
    assert await q.depth("jobs") == QueueDepth(visible=2, in_flight=1, dlq_visible=0)

    failed = await q.delete_batch("jobs", [c.receipt_handle, "not-a-receipt-handle"])
    assert list(failed) == ["not-a-receipt-handle"]
    assert failed["not-a-receipt-handle"].startswith("ReceiptHandleIsInvalid")
    assert await q.depth("jobs") == QueueDepth(visible=2, in_flight=0, dlq_visible=0)
    with pytest.raises(ValueError):
        await q.delete_batch("jobs", [f"h{i}" for i in range(11)])


async def test_ten_deletes_leave_at_once_and_the_rest_when_closed(
    q: SqsQueues, proxy: CountingProxy
) -> None:
    msgs = await received(q, 25)
    deletes = CoalescedDeletes(q, "jobs", window_s=3600.0)
    for m in msgs:
        deletes.add(m.receipt_handle)

    async def twenty_deleted() -> bool:
        return (await q.depth("jobs")).in_flight == 5

    await eventually(twenty_deleted, what="two full batches to leave without waiting")
    assert [e for a, e, _ in proxy.log if a == "DeleteMessageBatch"] == [10, 10]
    assert deletes.waiting == 5

    await deletes.close()

    assert [e for a, e, _ in proxy.log if a == "DeleteMessageBatch"] == [10, 10, 5]
    assert await q.depth("jobs") == QueueDepth(visible=0, in_flight=0, dlq_visible=0)
    assert proxy.calls["DeleteMessage"] == 0


async def test_a_lone_delete_leaves_after_its_window(q: SqsQueues, proxy: CountingProxy) -> None:
    [m] = await received(q, 1)
    deletes = CoalescedDeletes(q, "jobs", window_s=0.05)
    deletes.add(m.receipt_handle)

    async def gone() -> bool:
        return (await q.depth("jobs")).in_flight == 0

    await eventually(gone, what="the delete to leave once its window passed")
    assert proxy.calls["DeleteMessageBatch"] == 1
    await deletes.close()
    assert proxy.calls["DeleteMessageBatch"] == 1


@pytest.mark.real_clock  # past the messages' visibility timeout, on SQS's clock
async def test_messages_waiting_for_a_slot_stay_invisible_and_a_stop_gives_them_back(
    q: SqsQueues,
) -> None:
    msgs = await received(q, 3, visibility_s=2)
    slots = HandlerSlots(1)
    await slots.reserve_one()  # the only slot is busy
    started: list[ReceivedMessage] = []
    stop = asyncio.Event()
    waiting = asyncio.create_task(hand_out(q, "jobs", msgs, slots, stop, started.append, 2))

    async def all_in_flight() -> bool:
        return await q.depth("jobs") == QueueDepth(visible=0, in_flight=3, dlq_visible=0)

    # Twice their visibility timeout: renewed while they wait, none comes back.
    await consistently(all_in_flight, 4.0, interval=0.25)
    assert started == []

    await slots.release(1)
    await eventually(lambda: started == msgs[:1], what="the first to get the freed slot")
    stop.set()
    await waiting

    # The two still waiting are visible again at once; the started one is the handler's.
    assert await q.depth("jobs") == QueueDepth(visible=2, in_flight=1, dlq_visible=0)
