"""The /metrics gauges read from the database and SQS: refreshed at most every
`metrics.refresh_s`, once for any number of scrapers, within a short timeout, and marked
stale rather than failing the scrape.

A scrape never waits longer than the refresh's timeout and always answers: with the
database down it shows the last values it could read, `outboxd_stats_refresh_success
{source="database"} 0` and the time of the last good refresh, so Prometheus keeps
scraping the process and the readiness alert can fire.

The growth gauges (the tables' size, their dead rows, the oldest open transaction) are part
of the database's refresh: read beside the counts, stale with them.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Protocol

import structlog

from outboxd.metrics import Metrics
from outboxd.queue.sqs import QueueDepth, QueueKind
from outboxd.services.admin import AdminService, Stats
from outboxd.storage.growth_ports import Growth, GrowthStore
from outboxd.storage.ports import TABLE_STATUSES

log = structlog.get_logger(__name__)

# How long one part of a refresh (the counts, the queue depths) may take before the scrape
# is answered with the previous values, marked stale.
REFRESH_TIMEOUT_S: Final = 2.0


class ReadinessCheck(Protocol):
    """What /readyz, the stats and the gauges ask (daemon/readiness.py implements it)."""

    async def check(self) -> dict[str, str]:
        """Component name -> "ok" or a short reason."""
        ...


@dataclass(eq=False, repr=False)
class StatsGauges:
    """Single-flight, cached refresh of the database and SQS gauges of one process."""

    metrics: Metrics
    admin: AdminService
    readiness: ReadinessCheck
    refresh_s: float
    timeout_s: float = REFRESH_TIMEOUT_S
    clock: Callable[[], float] = time.monotonic
    # Where the growth gauges are read from (None: they are left as they are).
    growth: GrowthStore | None = None
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _started: float = field(default=0.0, init=False)
    _failing: set[str] = field(default_factory=set, init=False)

    async def refresh(self) -> None:
        """Bring the gauges up to date unless a refresh started less than `refresh_s` ago;
        a scrape that finds one running waits for that one. Never raises."""
        task = self._task
        if task is None or (task.done() and self.clock() - self._started >= self.refresh_s):
            self._started = self.clock()
            task = self._task = asyncio.create_task(self._refresh_all())
        # Shielded: a scraper that hangs up does not cancel the refresh the others wait on.
        await asyncio.shield(task)

    async def _refresh_all(self) -> None:
        await asyncio.gather(
            self._refresh_readiness(), self._refresh_database(), self._refresh_sqs()
        )

    async def _refresh_readiness(self) -> None:
        # Each probe has its own timeout (daemon/readiness.py) and reports, never raises.
        for check, verdict in (await self.readiness.check()).items():
            self.metrics.ready.labels(check).set(1 if verdict == "ok" else 0)

    async def _read_database(self) -> tuple[Stats, Growth | None]:
        if self.growth is None:
            return await self.admin.database_stats(), None
        stats, growth = await asyncio.gather(self.admin.database_stats(), self.growth.growth())
        return stats, growth

    async def _refresh_database(self) -> None:
        read: tuple[Stats, Growth | None] | None = await self._bounded(
            "database", self._read_database()
        )
        if read is None:
            return
        stats, growth = read
        m = self.metrics
        for table, known in TABLE_STATUSES.items():
            counts = stats.tables.get(table, {})
            # Every status, 0 when empty: a series that appears at N has no increase.
            for status in (*known, *(s for s in counts if s not in known)):
                m.rows.labels(table, status).set(counts.get(status, 0))
        for table, age in stats.oldest_pending_age_s.items():
            m.oldest_pending_age.labels(table).set(age or 0.0)
        m.oldest_running_job_age.set(stats.oldest_running_job_age_s or 0.0)
        m.pace_last_slot.clear()
        m.pace_next_slot.clear()
        m.pace_paused_until.clear()
        m.pace_sessions.clear()
        for p in stats.pace:
            # 0 for "none yet" / "never", as the help texts say (the API shows null).
            m.pace_last_slot.labels(p.name).set(p.last_at or 0.0)
            m.pace_next_slot.labels(p.name).set(p.next_at if p.last_at is not None else 0.0)
            m.pace_paused_until.labels(p.name).set(max(p.paused_until, 0.0))
            m.pace_sessions.labels(p.name).set(p.sessions)
        if growth is not None:
            self._set_growth(growth)
        self._succeeded("database")

    def _set_growth(self, growth: Growth) -> None:
        m = self.metrics
        # Cleared first: a table dropped, or an SQLite file that outgrew its split, leaves no
        # series behind at its last value.
        for gauge, values in (
            (m.table_bytes, growth.table_bytes),
            (m.table_live_rows, growth.live_rows),
            (m.table_dead_rows, growth.dead_rows),
        ):
            gauge.clear()
            for table, value in values.items():
                gauge.labels(table).set(value)
        m.oldest_transaction_age.set(growth.oldest_transaction_age_s or 0.0)

    async def _refresh_sqs(self) -> None:
        if not self.admin.has_queues:
            return
        depths: dict[QueueKind, QueueDepth] | None = await self._bounded(
            "sqs", self.admin.queue_stats()
        )
        if depths is None:
            return
        for queue, depth in depths.items():
            self.metrics.queue_depth.labels(queue, "visible").set(depth.visible)
            self.metrics.queue_depth.labels(queue, "inFlight").set(depth.in_flight)
            self.metrics.queue_depth.labels(queue, "dlq").set(depth.dlq_visible)
        self._succeeded("sqs")

    async def _bounded(self, source: str, read: Awaitable[Any]) -> Any:
        """What `read` returns within the timeout, or None with `source` marked stale."""
        why: Exception | str
        try:
            return await asyncio.wait_for(read, self.timeout_s)
        except TimeoutError:
            why = f"no answer within {self.timeout_s:g} s"
        except Exception as exc:
            why = exc
        self.metrics.stats_refresh_success.labels(source).set(0)
        if source not in self._failing:
            # Once per outage: a scrape every few seconds would repeat it for its length.
            self._failing.add(source)
            log.warning("metrics_refresh_failed", source=source, error=why)
        return None

    def _succeeded(self, source: str) -> None:
        self.metrics.stats_refresh_success.labels(source).set(1)
        self.metrics.stats_last_success.labels(source).set(time.time())
        if source in self._failing:
            self._failing.discard(source)
            log.info("metrics_refresh_recovered", source=source)
