"""The suite's one way to wait (tests/support/waits.py) fails when it should."""

from __future__ import annotations

import pytest

from tests.support.waits import (
    consistently,
    consistently_sync,
    eventually,
    eventually_sync,
    eventually_sync_while_moving,
)


async def test_eventually_returns_the_first_truthy_value_and_times_out_with_the_last() -> None:
    seen = iter([0, None, "ready"])
    assert await eventually(lambda: next(seen), 5, interval=0) == "ready"

    async def never() -> list[str]:
        return []

    with pytest.raises(AssertionError, match=r"after 0\.05s waiting for it \(last: \[\]\)"):
        await eventually(never, 0.05, what="it")
    with pytest.raises(AssertionError, match="waiting for <lambda>"):
        eventually_sync(lambda: False, 0.05)


async def test_consistently_is_only_for_real_clock_tests() -> None:
    with pytest.raises(AssertionError, match=r"mark the test @pytest\.mark\.real_clock"):
        await consistently(lambda: True, 0.01)
    with pytest.raises(AssertionError, match=r"mark the test @pytest\.mark\.real_clock"):
        consistently_sync(lambda: True, 0.01)


@pytest.mark.real_clock  # 0.1 s of it
async def test_consistently_fails_the_moment_its_check_does() -> None:
    await consistently(lambda: True, 0.05)
    checks = iter([True, True, False])
    with pytest.raises(AssertionError, match="no longer so"):
        consistently_sync(lambda: next(checks), 5, interval=0)


def test_eventually_while_moving_waits_as_long_as_the_count_grows_and_no_longer() -> None:
    # Ready at the 40th look, the count growing at each: far past the quiet time in all.
    looks = iter(range(1, 41))
    last = 0

    def check() -> int | None:
        nonlocal last
        last = next(looks)
        return last if last == 40 else None

    assert eventually_sync_while_moving(check, lambda: last, 0.05, 30, interval=0.005) == 40
    # Nothing grows: it gives up the quiet time after it started, not at the timeout.
    with pytest.raises(AssertionError, match=r"nothing moved for 0\.05s"):
        eventually_sync_while_moving(lambda: None, lambda: 7, 0.05, 30, interval=0.005)
