"""The consumer's handler slots per queue, and a receive cut short by the stop Event."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

from outboxd.queue.sqs import QueueError, ReceivedMessage


class HandlerSlots:
    """Handler slots of one queue: a receive asks for the free ones (and the few more the
    consumer's pace allows to wait, workers/prefetch.py)."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._busy = 0
        self._cond = asyncio.Condition()

    async def reserve(self) -> int:
        async with self._cond:
            await self._cond.wait_for(lambda: self._busy < self._capacity)
            free = min(10, self._capacity - self._busy)
            self._busy += free
            return free

    async def reserve_one(self) -> None:
        """One slot, once one is free (for a message received ahead)."""
        async with self._cond:
            await self._cond.wait_for(lambda: self._busy < self._capacity)
            self._busy += 1

    async def release(self, n: int) -> None:
        if n <= 0:
            return
        async with self._cond:
            self._busy -= n
            self._cond.notify_all()


async def until_stopped(
    coro: Awaitable[list[ReceivedMessage]], stop: asyncio.Event
) -> list[ReceivedMessage] | None:
    """The result of `coro`, or None (coro cancelled) once `stop` is set first."""
    task = asyncio.ensure_future(coro)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, QueueError):
        await task
    return None
