"""The one way tests wait for something to happen: a deadline-bounded poll.

`eventually` (async) and `eventually_sync` (blocking code: daemons as subprocesses,
threads) call `check` until it returns something truthy, and return that. Past `timeout`
they fail the test with what `check` last returned, so a wait that never ends is an
assertion, not a hang. Where the test can wait on a real signal (an asyncio.Event, a
future, a task), it waits on that instead; where the code under test takes a clock, the
test passes tests/support/clock.py's.

Real time passing on purpose (a client that must be slow, an outage that must last) is not
a wait: such a test says so with `@pytest.mark.real_clock`. So does one that asserts that
something does not happen for a while (`consistently`): only those may call it.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# Short: every poll after the condition is met is time lost. A blocking check mostly
# asks a daemon subprocess or a database, so it is asked a little less often.
INTERVAL_S = 0.02
SYNC_INTERVAL_S = 0.1


# Set per test (tests/conftest.py): whether it carries @pytest.mark.real_clock.
real_clock_allowed = False


class _Deadline:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def passed(self) -> bool:
        return time.monotonic() >= self.at

    def pause(self, interval: float) -> float:
        """`interval`, or less if the deadline comes sooner."""
        return min(interval, max(0.0, self.at - time.monotonic()))

    def timed_out(self, what: str | None, check: object, last: object) -> AssertionError:
        name = what or getattr(check, "__name__", repr(check))
        return AssertionError(
            f"timed out after {self.seconds}s waiting for {name} (last: {last!r})"
        )

    def no_longer(self) -> str:
        return f"no longer so after {self.seconds - (self.at - time.monotonic()):.2f}s"


async def _value(check: Callable[[], Any]) -> Any:
    got = check()
    return await got if inspect.isawaitable(got) else got


async def eventually(
    check: Callable[[], T | Awaitable[T | None] | None],
    timeout: float = 10.0,
    *,
    what: str | None = None,
    interval: float = INTERVAL_S,
) -> T:
    """`check()` (a plain or a coroutine function) until it is truthy: that value."""
    deadline = _Deadline(timeout)
    while not (value := await _value(check)):
        if deadline.passed():
            raise deadline.timed_out(what, check, value)
        await asyncio.sleep(interval)
    return value  # type: ignore[no-any-return]


def eventually_sync(
    check: Callable[[], T | None],
    timeout: float = 10.0,
    *,
    what: str | None = None,
    interval: float = SYNC_INTERVAL_S,
) -> T:
    """`check()` until it is truthy: that value (blocking)."""
    deadline = _Deadline(timeout)
    while not (value := check()):
        if deadline.passed():
            raise deadline.timed_out(what, check, value)
        time.sleep(interval)
    return value


def eventually_sync_while_moving(
    check: Callable[[], T | None],
    moved: Callable[[], int],
    still_for: float,
    timeout: float,
    *,
    what: str | None = None,
    interval: float = SYNC_INTERVAL_S,
) -> T:
    """`eventually_sync` for work that drains at its own pace: `check()` until it is truthy,
    failing once `moved()` (a count that grows while the work advances: items done) has not
    grown for `still_for` seconds, or after `timeout` in all. Work that stopped is reported
    `still_for` after it stopped, however long the whole wait may be; work that is still
    advancing is not cut off at a time a slower machine needs more than."""
    deadline = _Deadline(timeout)
    still = _Deadline(still_for)
    most = moved()
    while not (value := check()):
        now_moved = moved()
        if now_moved > most:
            most, still = now_moved, _Deadline(still_for)
        if still.passed():
            raise still.timed_out(what, check, f"{value!r}, nothing moved for {still_for}s")
        if deadline.passed():
            raise deadline.timed_out(what, check, value)
        time.sleep(interval)
    return value


def _real_clock(what: str) -> None:
    if not real_clock_allowed:
        raise AssertionError(f"{what} lets real time pass: mark the test @pytest.mark.real_clock")


async def consistently(
    check: Callable[[], object], for_s: float, *, interval: float = INTERVAL_S
) -> None:
    """`check()` (a plain or a coroutine function) stays truthy for `for_s` seconds of real
    time, failing the moment it is not: that something does not happen meanwhile. Only in
    real_clock tests."""
    _real_clock("consistently")
    deadline = _Deadline(for_s)
    while True:
        assert await _value(check), deadline.no_longer()
        if deadline.passed():
            return
        await asyncio.sleep(deadline.pause(interval))


def consistently_sync(
    check: Callable[[], object], for_s: float, *, interval: float = SYNC_INTERVAL_S
) -> None:
    """`consistently`, blocking."""
    _real_clock("consistently_sync")
    deadline = _Deadline(for_s)
    while True:
        assert check(), deadline.no_longer()
        if deadline.passed():
            return
        time.sleep(deadline.pause(interval))


class Calls:
    """Calls of one of `target`'s coroutine methods, each counted once it has returned: a
    signal that the code under test got that far (a held request read its job, a
    publish looked at its row), to wait for with `reach`."""

    def __init__(self, target: Any, name: str) -> None:
        self.name = name
        self.count = 0
        inner = getattr(target, name)

        async def counted(*args: Any, **kw: Any) -> Any:
            try:
                return await inner(*args, **kw)
            finally:
                self.count += 1

        setattr(target, name, counted)

    async def reach(self, n: int) -> None:
        await eventually(lambda: self.count >= n, what=f"{n} calls of {self.name}")
