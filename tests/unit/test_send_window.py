"""The relay's send window (workers/send_window.py): how many SendMessageBatch calls may be
out at once, narrowing when calls come back slow or fail and widening while they come
back in time. The clock is the test's own; the waiting is real asyncio."""

from __future__ import annotations

import asyncio

import pytest

from outboxd.workers.send_window import SendWindow


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def window(
    ceiling: int = 8, slow_s: float = 0.5, initial: int | None = None
) -> tuple[SendWindow, Clock, list[int]]:
    """A window already at its ceiling, unless `initial` says where it starts."""
    clock = Clock()
    changes: list[int] = []
    w = SendWindow(
        ceiling,
        slow_s,
        clock=clock,
        on_change=lambda limit, _latency, _narrowed: changes.append(limit),
        initial=ceiling if initial is None else initial,
    )
    return w, clock, changes


async def test_slow_start_grows_by_one_per_answer_in_time_until_the_first_halving() -> None:
    w, clock, changes = window(ceiling=10, initial=2)
    assert w.limit == 2
    for _ in range(4):
        s = await w.acquire()
        clock.now += 0.01
        w.release(s, failed=False)
    assert w.limit == 6
    s = await w.acquire()
    clock.now += 1.0
    w.release(s, failed=False)
    assert w.limit == 3
    for _ in range(2):  # now one step per `limit` answers in time
        s = await w.acquire()
        clock.now += 0.01
        w.release(s, failed=False)
    assert (w.limit, changes) == (3, [3, 4, 5, 6, 3])
    s = await w.acquire()
    w.release(s, failed=False)
    assert w.limit == 4


async def test_no_more_calls_out_than_the_limit_and_each_waiter_gets_a_slot() -> None:
    w, _, _ = window(ceiling=3)
    peak = 0
    done = 0

    async def call() -> None:
        nonlocal peak, done
        started = await w.acquire()
        peak = max(peak, w.out)
        await asyncio.sleep(0)
        w.release(started, failed=False)
        done += 1

    await asyncio.wait_for(asyncio.gather(*(call() for _ in range(20))), 5)
    assert (peak, done, w.out, w.limit) == (3, 20, 0, 3)


async def test_slow_answers_halve_the_limit_once_per_latency() -> None:
    w, clock, changes = window(ceiling=8, slow_s=0.5)
    starts = [await w.acquire() for _ in range(8)]
    clock.now += 0.6  # every call out took longer than slow_s
    for s in starts:
        w.release(s, failed=False)
    # All eight were out before the first came back: one halving, not three.
    assert (w.limit, changes) == (4, [4])

    s = await w.acquire()  # started after the cut: its slowness counts again
    clock.now += 0.6
    w.release(s, failed=False)
    assert (w.limit, changes) == (2, [4, 2])


async def test_a_failed_call_narrows_even_when_quick_and_a_cancelled_one_does_not() -> None:
    w, clock, _ = window(ceiling=8)
    s = await w.acquire()
    w.release(s, failed=None)  # cancelled: says nothing about SQS
    assert w.limit == 8
    s = await w.acquire()
    clock.now += 0.01
    w.release(s, failed=True)  # a timeout, a transport error, throttling
    assert w.limit == 4


async def test_the_limit_never_goes_below_one_and_grows_back_one_at_a_time() -> None:
    w, clock, changes = window(ceiling=4, slow_s=0.5)
    for _ in range(5):
        s = await w.acquire()
        clock.now += 1.0
        w.release(s, failed=False)
    assert w.limit == 1
    grown = []
    for _ in range(1 + 2 + 3 + 5):  # `limit` answers in time per step, then at the ceiling
        s = await w.acquire()
        clock.now += 0.01
        w.release(s, failed=False)
        grown.append(w.limit)
    assert grown == [2, 2, 3, 3, 3, 4, 4, 4, 4, 4, 4]
    assert changes == [2, 1, 2, 3, 4]


async def test_urgent_waiters_get_the_next_slot_before_the_loops() -> None:
    w, _, _ = window(ceiling=1)
    first = await w.acquire()
    order: list[str] = []

    async def wait(tag: str, urgent: bool) -> None:
        started = await w.acquire(urgent)
        order.append(tag)
        w.release(started, failed=False)

    tasks = [asyncio.ensure_future(wait("loop-1", False))]
    await asyncio.sleep(0)
    tasks.append(asyncio.ensure_future(wait("request", True)))
    tasks.append(asyncio.ensure_future(wait("loop-2", False)))
    await asyncio.sleep(0)
    w.release(first, failed=False)
    await asyncio.wait_for(asyncio.gather(*tasks), 5)
    assert order == ["request", "loop-1", "loop-2"]


@pytest.mark.parametrize("granted_first", [False, True])
async def test_a_cancelled_waiter_leaves_no_slot_taken(granted_first: bool) -> None:
    w, _, _ = window(ceiling=1)
    first = await w.acquire()
    waiter = asyncio.ensure_future(w.acquire())
    await asyncio.sleep(0)
    if granted_first:
        w.release(first, failed=False)  # the slot is handed over ...
        assert w.out == 1
    waiter.cancel()  # ... and the waiter is cancelled before it runs
    with pytest.raises(asyncio.CancelledError):
        await waiter
    if not granted_first:
        w.release(first, failed=False)
    assert w.out == 0
    s = await asyncio.wait_for(w.acquire(), 1)
    assert w.out == 1
    w.release(s, failed=False)
