"""The breakers' loop, in every daemon whose roles call an outside system: every half
second it reads the dependencies' rows (so a pause reaches this instance within a
second), lifts a pause whose end came, releases the work held for a dependency that is
up again (at once on the change, and every probe interval in case a release was
missed), and, while the portal is down, offers the cluster's one probe when it is due.
"""

from __future__ import annotations

import asyncio
import contextlib

import structlog

from outboxd.errors import StorageError
from outboxd.metrics import Metrics
from outboxd.services.breakers import Breakers
from outboxd.workers.loops import sleep_or_stop

log = structlog.get_logger(__name__)

LOOK_S = 0.5
# The waiting gauge is counted every this many looks.
_COUNT_EVERY = 10


class BreakerLoop:
    def __init__(
        self,
        breakers: Breakers,
        metrics: Metrics | None,
        probe_hold_s: float,
        choose_probes: bool = True,
    ) -> None:
        self.breakers = breakers
        self._metrics = metrics
        # How long a chosen probe holds the cluster's one place (its outcome frees it sooner).
        self._probe_hold_s = probe_hold_s
        self._choose_probes = choose_probes
        self._was_up: dict[str, bool] = {}
        self._next_sweep: dict[str, float] = {}
        self._looks = 0

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            # The database's outages are logged by the loops that need it; this one waits.
            with contextlib.suppress(StorageError):
                await self.once()
            await sleep_or_stop(stop, LOOK_S)

    async def once(self) -> None:
        b = self.breakers
        now = b.clock()
        rows = await b.look()
        for row in rows:
            breaker = b.get(row.name)
            if breaker is None:
                continue
            if row.pause_reason is not None and not row.paused(now):
                await b.end_pause(row.name, row, now)
            up = breaker.waiting(now) is None
            was_up = self._was_up.get(row.name, False)
            self._was_up[row.name] = up
            if up and (not was_up or now >= self._next_sweep.get(row.name, 0.0)):
                self._next_sweep[row.name] = now + breaker.settings.probe_s
                released = await b.release_if_up(row.name)
                if released:
                    log.info("dependency_work_released", dependency=row.name, released=released)
            state = breaker.state(now)[0]
            if state == "down" and row.name == "portal" and self._choose_probes:
                probe = await breaker.take_probe(None, self._probe_hold_s)
                if probe is not None:
                    log.debug("dependency_probe", dependency=row.name, job_id=probe)
        self._looks += 1
        if self._metrics is not None and self._looks % _COUNT_EVERY == 1:
            for view in await b.views():
                self._metrics.dependency_waiting.labels(view.name).set(view.waiting)
