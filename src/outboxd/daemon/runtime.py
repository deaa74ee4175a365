"""What the console shows that no table holds: this process's claimer, scheduler and throughput.

The HTTP side reads it through `outboxd.http.deps.RuntimeView`; only the wiring knows the
worker classes behind it.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass

from outboxd.metrics import Metrics
from outboxd.workers.claimer import Claimer
from outboxd.workers.scheduler import Scheduler

_SUCCEEDED_OUTCOMES = ("succeeded",)
_FAILED_OUTCOMES = ("failed", "dead")
BUCKET_S = 60
WINDOW_BUCKETS = 60


class Throughput:
    """Portal jobs accepted and finished per minute over the last hour; of the finished,
    how many ended FAILED or DEAD (the console paints them apart from the SUCCEEDED).

    Sampled from this process's own counters (jobs accepted by its API; jobs its
    consumer finished), kept in memory: a restart starts the chart empty, and no table
    is written.
    """

    def __init__(
        self, metrics: Metrics, clock: Callable[[], float] = time.time, every_s: float = 5.0
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._every_s = every_s
        self._buckets: dict[int, list[int]] = {}
        self._last = self._totals()

    def _totals(self) -> tuple[int, int, int]:
        """(accepted, succeeded, failed or dead) since start."""
        reg = self._metrics.registry

        def handled(outcomes: tuple[str, ...]) -> int:
            return int(
                sum(
                    reg.get_sample_value(
                        "outboxd_handler_duration_seconds_count", {"kind": "jobs", "outcome": o}
                    )
                    or 0.0
                    for o in outcomes
                )
            )

        intake = int(reg.get_sample_value("outboxd_jobs_accepted_total") or 0.0)
        return intake, handled(_SUCCEEDED_OUTCOMES), handled(_FAILED_OUTCOMES)

    def sample(self) -> None:
        totals = self._totals()
        minute = int(self._clock() // BUCKET_S)
        bucket = self._buckets.setdefault(minute, [0, 0, 0])
        for i, (now, before) in enumerate(zip(totals, self._last, strict=True)):
            bucket[i] += now - before
        self._last = totals
        for old in [m for m in self._buckets if m <= minute - WINDOW_BUCKETS]:
            del self._buckets[old]

    def series(self) -> list[tuple[float, int, int, int]]:
        """(minute start, accepted, finished, of them failed or dead) for each of the last 60
        minutes, oldest first."""
        self.sample()
        now_minute = int(self._clock() // BUCKET_S)
        out = []
        for m in range(now_minute - WINDOW_BUCKETS + 1, now_minute + 1):
            accepted, succeeded, failed = self._buckets.get(m, [0, 0, 0])
            out.append((float(m * BUCKET_S), accepted, succeeded + failed, failed))
        return out

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every_s)


@dataclass
class ConsoleRuntime:
    """What the overview shows that no table holds: this process's claimer and scheduler."""

    throughput: Throughput
    claimer: Claimer | None = None
    scheduler: Scheduler | None = None

    def claimer_pace(self) -> tuple[float | None, float | None, float | None] | None:
        """(last tick, next tick, paused until) or None when this process runs no claimer."""
        if self.claimer is None:
            return None
        return self.claimer.timing()

    def schedules(self) -> list[tuple[str, str, float]]:
        if self.scheduler is None:
            return []
        return [(name, task, at.timestamp()) for name, task, at in self.scheduler.next_fires()]

    def throughput_series(self) -> list[tuple[float, int, int, int]]:
        return self.throughput.series()
