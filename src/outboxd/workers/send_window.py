"""How many SendMessageBatch calls the relay keeps at SQS at once: a window that follows
the endpoint's answers (docs/architecture.md, "The send window").

A fixed number of calls in flight is right for a fast SQS and wrong for a slow one. An
endpoint that answers one call at a time (moto under load, a throttled or congested
SQS) makes every call wait for all the others: with twenty out, each call waits for the
other nineteen, passes `relay.publish_timeout_s`, and its rows are published again while
the first copy is still being stored, which slows the endpoint further
(docs/decisions/0007-send-window.md). The window narrows as soon as calls come back slow,
so the calls out are answered within the timeout and the endpoint sends as much as it
can; it widens again, one call at a time, while they come back fast.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable


class SendWindow:
    """At most `limit` calls out at once, `limit` between 1 and `ceiling`.

    - A call that failed as a whole (a timeout, a transport error, throttling) or took
      longer than `slow_s` halves the limit, once per call latency: calls that were
      already out when it was last halved do not halve it again.
    - It starts at `initial` and, until the first halving, grows by one with each call
      back in time (doubling per call latency, as TCP's slow start does): the first
      burst does not put `ceiling` calls at an endpoint that answers one at a time.
    - After that, once `limit` calls in a row came back in time, it grows by one.
    - A waiting call marked `urgent` (a request's coalesced dispatch) gets the next free
      slot before the relay loop's calls; within each kind, first come first served.

    `on_change(limit, latency_s, narrowed)` is called whenever the limit changes;
    `narrowed` says it was halved rather than grown.
    """

    def __init__(
        self,
        ceiling: int,
        slow_s: float,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[int, float, bool], None] | None = None,
        initial: int = 2,
    ) -> None:
        self.ceiling = max(1, ceiling)
        self.limit = max(1, min(initial, self.ceiling))
        self._starting = True  # slow start, until the first halving
        self.out = 0
        self._slow_s = slow_s
        self._clock = clock
        self._on_change = on_change
        self._in_time = 0  # calls back in time since the limit last changed
        self._cut_at = float("-inf")
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._queued: deque[asyncio.Future[None]] = deque()

    async def acquire(self, urgent: bool = False) -> float:
        """Wait for a free slot; returns when the call starts, for `release`."""
        if self.out < self.limit and not self._waiting():
            self.out += 1
            return self._clock()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        (self._urgent if urgent else self._queued).append(fut)
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                # The slot was handed over as the waiter was cancelled: pass it on.
                self.out -= 1
            self._wake()
            raise
        return self._clock()

    def release(self, started: float, failed: bool | None) -> None:
        """A call is back. `failed`: it failed as a whole (True), SQS answered it (False),
        or it was cancelled, which says nothing about SQS (None)."""
        self.out -= 1
        now = self._clock()
        latency = now - started
        if failed or (failed is not None and latency > self._slow_s):
            if started >= self._cut_at:
                self._cut_at = now
                self._in_time = 0
                self._starting = False
                if self.limit > 1:
                    self.limit = max(1, self.limit // 2)
                    self._changed(latency, narrowed=True)
        elif failed is not None:
            self._in_time += 1
            if self.limit < self.ceiling and (self._starting or self._in_time >= self.limit):
                self._in_time = 0
                self.limit += 1
                self._changed(latency, narrowed=False)
        self._wake()

    def _changed(self, latency: float, narrowed: bool) -> None:
        if self._on_change is not None:
            self._on_change(self.limit, latency, narrowed)

    def _waiting(self) -> bool:
        """Whether a live waiter is queued (waiters that were cancelled are dropped)."""
        for q in (self._urgent, self._queued):
            while q and q[0].done():
                q.popleft()
        return bool(self._urgent or self._queued)

    def _wake(self) -> None:
        """Hand the free slots to the waiters, urgent ones first."""
        while self.out < self.limit and self._waiting():
            fut = (self._urgent or self._queued).popleft()
            self.out += 1
            fut.set_result(None)
