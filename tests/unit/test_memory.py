"""The garbage collector after start (outboxd.daemon.memory): start-up's objects frozen out
of every collection, the young generation collected less often, later objects as usual."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest

from outboxd.daemon.memory import YOUNG_THRESHOLD, settle_after_start


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


class Cycle:
    def __init__(self) -> None:
        self.me = self


@pytest.mark.usefixtures("restored")
def test_start_ups_objects_are_frozen_and_later_garbage_is_still_collected() -> None:
    older = gc.get_threshold()[1:]
    settle_after_start()

    assert gc.get_freeze_count() > 1000  # the modules, classes and wiring made so far
    assert gc.get_threshold() == (YOUNG_THRESHOLD, *older)
    # A cycle made after start is garbage the collector still finds.
    cycle = weakref.ref(Cycle())
    assert cycle() is not None  # only the collector can free it
    gc.collect()
    assert cycle() is None
