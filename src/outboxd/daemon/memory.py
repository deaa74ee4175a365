"""The garbage collector, set once for a long-running server after it has started.

Every request allocates short-lived containers; with CPython's defaults the young
generation is collected every few requests, and each collection of the oldest one walks
every object the process holds, the tens of thousands its modules and wiring made at
start included: a pause of tens of milliseconds in the one thread that answers requests.
Those start-up objects live as long as the process, so they are moved out of the
collector's reach (`gc.freeze`), and the young generation is collected less often
(docs/decisions/0026-garbage-collector-after-start.md).
"""

from __future__ import annotations

import gc

# Container allocations (net of those freed) between collections of the young generation;
# CPython's default is 700.
YOUNG_THRESHOLD = 20_000


def settle_after_start() -> None:
    """Collect what start-up left behind, freeze every object still alive, and collect the
    young generation every YOUNG_THRESHOLD allocations (the older generations' ratios are
    CPython's). Objects made later are collected as usual."""
    gc.collect()
    gc.freeze()
    _, older, oldest = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, older, oldest)
