"""One breaker per outside system (`portal`, `ai`, `sqs`) for the whole cluster.

Its state lives in the database (storage/breaker_ports.py), so every instance agrees:
- `up`: work runs as configured;
- `down`: `breakers.<name>.open_after` runs in a row, from any instance, ended in an
  outage failure (refused, reset, timeout, 5xx; for the AI a 429 too). Nothing calls the
  system but one probe at a time for the cluster, every `probe_s`: a real piece of
  waiting work. The probe's answer closes the breaker; an outage keeps it open;
- `maintenance`: inside a configured window (cron, duration, time zone): no call at all;
- `paused`: an operator's pause, with a reason, until resumed or until its end.

Work that meets a dependency that is not `up` waits and spends nothing: a portal job is
held (no lease, its attempt given back, its message deleted, a relay row that is
published when the dependency is back), a work-outbox row is not claimed. The runs
before the breaker opened count as they always did. A job whose own runs fail while
other work gets through cannot hold the breaker open: any answer resets the count, and a
failed probe goes to the back of the waiting line
(docs/decisions/0033-dependency-breakers.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final, Literal
from zoneinfo import ZoneInfo

import structlog

from outboxd.config import BreakerSettings, MaintenanceWindow, Settings
from outboxd.cron import CronSchedule, parse_timezone
from outboxd.metrics import DEPENDENCIES, DEPENDENCY_STATES, DependencyState, Metrics
from outboxd.storage.breaker_ports import BreakerStore, DependencyRow

log = structlog.get_logger(__name__)

PROBE: Final = "probe"


@dataclass(frozen=True)
class Waiting:
    """Why work waits: its dependency's state, and until when (None: unknown)."""

    dependency: str
    state: str
    until: float | None

    def wait_for(self) -> dict[str, Any]:
        return {"dependency": self.dependency, "state": self.state}


@dataclass(frozen=True)
class DependencyView:
    """A dependency as the operator sees it (GET /v1/admin/dependencies, `outboxd deps`)."""

    name: str
    state: DependencyState
    since: float | None
    until: float | None
    reason: str | None
    paused_by: str | None
    failures_in_a_row: int
    last_error: str | None
    last_probe_at: float | None
    waiting: int


@dataclass(frozen=True)
class _Window:
    schedule: CronSchedule
    tz: ZoneInfo
    duration_s: float


def windows_of(entries: Sequence[MaintenanceWindow]) -> tuple[_Window, ...]:
    return tuple(
        _Window(CronSchedule.parse(w.cron), parse_timezone(w.timezone), w.duration_s)
        for w in entries
    )


def window_at(windows: Sequence[_Window], now: float) -> tuple[float, float] | None:
    """The maintenance window `now` is in, as (start, end); None outside every window.
    A window's first fire after `now - duration` is inside it exactly when it is not
    after `now`."""
    for w in windows:
        start = w.schedule.next_after(datetime.fromtimestamp(now - w.duration_s, UTC), w.tz)
        begun = start.timestamp()
        if begun <= now:
            return begun, begun + w.duration_s
    return None


class Breaker:
    """One dependency's breaker as this instance sees it: the stored row (looked at by the
    breaker loop every half second, and afresh before any work is held back) and the
    configured maintenance windows."""

    def __init__(
        self,
        name: str,
        settings: BreakerSettings,
        windows: Sequence[MaintenanceWindow],
        store: BreakerStore,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.name = name
        self.settings = settings
        self.row = DependencyRow(name)
        self._windows = windows_of(windows)
        self._store = store
        self._metrics = metrics
        self._clock = clock

    def state(self, now: float | None = None) -> tuple[DependencyState, float | None, float | None]:
        """(state, since, until) at `now`: a pause first, then a window, then the breaker."""
        at = self._clock() if now is None else now
        r = self.row
        if r.paused(at):
            return "paused", r.paused_at, r.paused_until
        window = window_at(self._windows, at)
        if window is not None:
            return "maintenance", window[0], window[1]
        if r.down_since is not None:
            return "down", r.down_since, None
        return "up", None, None

    def chosen_off(self) -> bool:
        """Paused by an operator or inside a maintenance window: no call at all, not even
        the dependency's own retries."""
        return self.state()[0] in ("paused", "maintenance")

    def waiting(self, now: float | None = None) -> Waiting | None:
        """Why work for this dependency waits now (None: it is `up`)."""
        state, _since, until = self.state(now)
        return None if state == "up" else Waiting(self.name, state, until)

    def seen(self, row: DependencyRow) -> None:
        self.row = row
        if self._metrics is not None:
            current = self.state()[0]
            for state in DEPENDENCY_STATES:
                self._metrics.dependency_state.labels(self.name, state).set(
                    1 if state == current else 0
                )

    async def look(self) -> None:
        """The stored row, afresh."""
        for row in await self._store.dependency_rows():
            if row.name == self.name:
                self.seen(row)

    async def admit(self, work: str | None = None) -> Waiting | Literal["probe"] | None:
        """Whether `work` (a job id) may call the dependency now: None (it is up), PROBE
        (it is down and `work` is the cluster's probe), or why it waits. The stored row is
        read afresh before holding anything back, so a probe or a resume another instance
        wrote a moment ago counts."""
        if self.waiting() is None:
            return None
        await self.look()
        waits = self.waiting()
        if waits is None:
            return None
        if waits.state == "down" and work is not None and self.row.probe_job == work:
            return PROBE
        return waits

    async def take_probe(self, holder: str | None, hold_s: float) -> str | None:
        """The cluster's one probe while down, if it is due and nobody holds it: `holder`
        (the AI's claimer) or, with None, the oldest waiting job, released to run
        (storage/breaker_ports.py `take_probe`)."""
        return await self._store.take_probe(
            self.name, holder, self._clock(), self.settings.probe_s, hold_s
        )

    async def outage(self, error: str, probe: str | None = None) -> Waiting | None:
        """Count a run that ended in an outage failure; why it waits now (None: the
        dependency is still up, and the run counts as any failure). `probe`: the run was
        the cluster's probe (its place is freed)."""
        now = self._clock()
        if self._metrics is not None:
            self._metrics.dependency_outages.labels(self.name).inc()
        counted = await self._store.count_outage(
            self.name, error, self.settings.open_after, now, probe
        )
        self.seen(counted.row)
        if counted.opened:
            log.warning(
                "dependency_down",
                dependency=self.name,
                error=error,
                failures_in_a_row=counted.row.failures_in_a_row,
                probe_s=self.settings.probe_s,
            )
        waits = self.waiting(now)
        if waits is None and probe is not None:
            # The probe failed, yet the row says up: another run got through meanwhile, so
            # this failure is the job's own and counts.
            return None
        return waits

    async def through(self) -> None:
        """A run got an answer: the count starts again, and an open breaker closes (its
        waiting work released at once). Nothing is written while there is nothing to reset."""
        r = self.row
        if r.failures_in_a_row == 0 and r.down_since is None:
            return
        now = self._clock()
        closed = await self._store.count_through(self.name, now)
        self.seen(
            replace(r, failures_in_a_row=0, down_since=None, probe_job=None, probe_until=None)
        )
        if closed is not None and closed.down_since is not None:
            log.info(
                "dependency_up",
                dependency=self.name,
                down_s=round(now - closed.down_since, 1),
                released=closed.released,
            )


class Breakers:
    """The three breakers of one daemon, and what the operator does with them."""

    def __init__(
        self,
        settings: Settings,
        store: BreakerStore,
        metrics: Metrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        windows: Mapping[str, Sequence[MaintenanceWindow]] = {
            "portal": settings.scrapers.suwon.maintenance,
            "ai": settings.scrapers.classifier.maintenance,
        }
        self.store = store
        self.clock = clock
        self.by_name: dict[str, Breaker] = {
            name: Breaker(
                name,
                getattr(settings.breakers, name),
                windows.get(name, ()),
                store,
                metrics,
                clock,
            )
            for name in DEPENDENCIES
        }
        self.portal = self.by_name["portal"]
        self.ai = self.by_name["ai"]
        self.sqs = self.by_name["sqs"]

    def get(self, name: str) -> Breaker | None:
        return self.by_name.get(name)

    async def look(self) -> list[DependencyRow]:
        rows = await self.store.dependency_rows()
        for row in rows:
            breaker = self.get(row.name)
            if breaker is not None:
                breaker.seen(row)
        return rows

    async def views(self) -> list[DependencyView]:
        await self.look()
        return [await self.view(name, looked=True) for name in DEPENDENCIES]

    async def view(self, name: str, looked: bool = False) -> DependencyView:
        if not looked:
            await self.look()
        b = self.by_name[name]
        now = self.clock()
        state, since, until = b.state(now)
        r = b.row
        # A work-outbox row or a relay row waits for the AI or SQS only while it is away;
        # a held portal job waits until it is released, whatever the state.
        waiting = 0
        if name == "portal" or state != "up":
            waiting = await self.store.waiting_jobs(name)
        return DependencyView(
            name=name,
            state=state,
            since=since,
            until=until,
            reason=r.pause_reason if state == "paused" else None,
            paused_by=r.paused_by if state == "paused" else None,
            failures_in_a_row=r.failures_in_a_row,
            last_error=r.last_error,
            last_probe_at=r.last_probe_at,
            waiting=waiting,
        )

    async def pause(
        self, name: str, reason: str, until: float | None, actor: str
    ) -> DependencyView:
        now = self.clock()
        row = await self.store.pause_dependency(name, reason, until, actor, now)
        self.by_name[name].seen(row)
        log.info("dependency_paused", dependency=name, actor=actor, reason=reason, until=until)
        return await self.view(name)

    async def resume(self, name: str, actor: str) -> DependencyView:
        now = self.clock()
        row = await self.store.resume_dependency(name, now)
        if row is not None:
            self.by_name[name].seen(row)
            log.info("dependency_resumed", dependency=name, actor=actor)
        await self.release_if_up(name)
        return await self.view(name)

    async def release_if_up(self, name: str) -> int:
        """The work held for `name` goes out, when it is up."""
        if self.by_name[name].waiting() is not None:
            return 0
        return await self.store.release_waiting(name, self.clock())

    async def end_pause(self, name: str, row: DependencyRow, now: float) -> None:
        """A pause whose end came: lifted once for the cluster (the instance whose write
        lifts it says so)."""
        ended = await self.store.resume_dependency(name, now, ended_before=now)
        if ended is not None:
            self.by_name[name].seen(ended)
            log.info(
                "dependency_resumed", dependency=name, actor="schedule", reason=row.pause_reason
            )
