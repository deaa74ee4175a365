"""What every long-running loop needs: an interruptible wait, a retry delay, and one way
to fail (back off, and log an outage once rather than once per attempt)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import structlog

from outboxd.errors import StorageUnavailable
from outboxd.observability import OutageLog
from outboxd.queue.failures import QueueError

log = structlog.get_logger(__name__)

# How long a loop waits after its first failed try while the database or SQS is down,
# doubling with each failure after it, and at most: a 10 s outage costs a loop about five
# tries, and it is back at work within DB_RETRY_CAP_S of the dependency returning.
DB_RETRY_BASE_S = 0.5
DB_RETRY_CAP_S = 5.0


async def sleep_or_stop(
    stop: asyncio.Event, seconds: float, wake: asyncio.Event | None = None
) -> None:
    """Wait `seconds`, or less when `stop` (or `wake`) is set meanwhile: a shutdown never
    waits out a sleep."""
    waits = {asyncio.ensure_future(e.wait()) for e in (stop, wake) if e is not None}
    try:
        await asyncio.wait(waits, timeout=seconds, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()


def backoff(attempt: int, base: float, cap: float, *, jitter: bool) -> float:
    """`base` for the first attempt, doubling with each one after it, never above `cap`.

    With `jitter` the delay is a uniform draw between half and all of that step, so work that
    failed together (rows of one SQS outage) does not come back in the same instant. Callers
    say at the call site why they use it or leave it out.
    """
    # The exponent is clamped so a large attempt count cannot overflow a float.
    step = min(cap, base * 2.0 ** min(max(0, attempt - 1), 64))
    return step * (0.5 + random.random() / 2) if jitter else step


def outage_of(exc: BaseException) -> str | None:
    """The dependency an error says is down: "storage" (the database cannot be reached),
    "sqs" (a failure of the whole SQS request), or None for any other error."""
    if isinstance(exc, StorageUnavailable):
        return "storage"
    if isinstance(exc, QueueError) and exc.outage:
        return "sqs"
    return None


@dataclass(eq=False, repr=False)
class LoopFailures:
    """How a loop fails: the one helper every loop uses.

    After a failed iteration the loop waits a capped exponential backoff (`failed` returns
    it, `pause` sleeps it), so no failure makes it spin. An outage of the database or SQS
    is logged by an `OutageLog` per dependency: one line when it starts, at most one a
    minute while it lasts, one when `ok` reports the first success after it. Any other
    error is the loop's own `event` (a bug or a refusal, not an outage), each time it
    happens; the backoff bounds how often that is.
    """

    component: str
    event: str
    _: KW_ONLY
    level: str = "warning"
    base_s: float = DB_RETRY_BASE_S
    cap_s: float = DB_RETRY_CAP_S
    every_s: float = 60.0
    clock: Callable[[], float] | None = None
    wall: Callable[[], float] | None = None
    outages: dict[str, OutageLog] = field(init=False)
    streak: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        clocks: dict[str, Any] = {"every_s": self.every_s}
        if self.clock is not None:
            clocks["clock"] = self.clock
        if self.wall is not None:
            clocks["wall"] = self.wall
        self.outages = {dep: OutageLog(dep, self.component, **clocks) for dep in ("storage", "sqs")}

    @property
    def down(self) -> bool:
        """Whether an outage this loop saw has not ended yet."""
        return any(o.down for o in self.outages.values())

    def failed(self, exc: BaseException, **fields: Any) -> float:
        """Record a failed iteration; how long to wait before the next one."""
        self.streak += 1
        dependency = outage_of(exc)
        if dependency is not None:
            self.outages[dependency].failed(exc, **fields)
        else:
            getattr(log, self.level)(self.event, component=self.component, error=exc, **fields)
        return backoff(self.streak, self.base_s, self.cap_s, jitter=False)

    def ok(self) -> None:
        """Record a successful iteration: the backoff starts over, an outage ends."""
        self.streak = 0
        for outage in self.outages.values():
            outage.recovered()

    async def pause(self, stop: asyncio.Event, exc: BaseException, **fields: Any) -> None:
        """`failed`, then wait its delay (or less, if `stop` is set meanwhile)."""
        await sleep_or_stop(stop, self.failed(exc, **fields))
