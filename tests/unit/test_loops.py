"""The loop helpers: an interruptible wait and the one retry-delay formula."""

from __future__ import annotations

import asyncio

import pytest

from outboxd.workers.loops import backoff, sleep_or_stop


async def test_sleep_or_stop_returns_when_stop_is_set() -> None:
    """A stop set during a one-hour wait ends the wait (the outer bound is a safety net)."""
    stop = asyncio.Event()
    waiter = asyncio.create_task(sleep_or_stop(stop, 3600))
    await asyncio.sleep(0)
    assert not waiter.done()
    stop.set()
    await asyncio.wait_for(waiter, 30)
    assert waiter.done() and waiter.exception() is None


async def test_sleep_or_stop_returns_after_the_time_without_stop() -> None:
    """Without a stop, the wait ends on its own and leaves the event unset."""
    stop = asyncio.Event()
    await asyncio.wait_for(sleep_or_stop(stop, 0.01), 30)
    assert not stop.is_set()


async def test_sleep_or_stop_with_stop_already_set_does_not_wait() -> None:
    """An event set before the call returns at once, even for a zero or huge duration."""
    stop = asyncio.Event()
    stop.set()
    await asyncio.wait_for(sleep_or_stop(stop, 3600), 30)
    await sleep_or_stop(stop, 0)


@pytest.mark.parametrize(
    ("attempt", "expected"),
    [(0, 1.0), (1, 1.0), (2, 2.0), (3, 4.0), (5, 16.0), (6, 30.0), (7, 30.0), (10_000, 30.0)],
)
def test_backoff_doubles_from_base_up_to_cap(attempt: int, expected: float) -> None:
    """base, 2 x base, 4 x base, ... capped; attempt 0 counts as the first; no overflow."""
    assert backoff(attempt, 1.0, 30.0, jitter=False) == expected


def test_backoff_matches_the_consumer_visibility_delays() -> None:
    """The consumer's redelivery delays for backoff_base_s = 5: 5, 10, 20, 40 s."""
    delays = [int(backoff(n, 5.0, 43_000, jitter=False)) for n in range(1, 5)]
    assert delays == [5, 10, 20, 40]


def test_backoff_jitter_stays_between_half_and_all_of_the_step() -> None:
    """With jitter every delay is in [step/2, step], and the draws are not all equal."""
    draws = [backoff(4, 1.0, 300.0, jitter=True) for _ in range(200)]
    assert all(4.0 <= d <= 8.0 for d in draws)
    assert len(set(draws)) > 1
    capped = [backoff(50, 1.0, 300.0, jitter=True) for _ in range(50)]
    assert all(150.0 <= d <= 300.0 for d in capped)
