"""The two things every long-running loop needs: an interruptible wait and a retry delay."""

from __future__ import annotations

import asyncio
import contextlib
import random


async def sleep_or_stop(stop: asyncio.Event, seconds: float) -> None:
    """Wait `seconds`, or less when `stop` is set meanwhile: a shutdown never waits out a sleep."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


def backoff(attempt: int, base: float, cap: float, *, jitter: bool) -> float:
    """`base` for the first attempt, doubling with each one after it, never above `cap`.

    With `jitter` the delay is a uniform draw between half and all of that step, so work that
    failed together (rows of one SQS outage) does not come back in the same instant. Callers
    say at the call site why they use it or leave it out.
    """
    # The exponent is clamped so a large attempt count cannot overflow a float.
    step = min(cap, base * 2.0 ** min(max(0, attempt - 1), 64))
    return step * (0.5 + random.random() / 2) if jitter else step
