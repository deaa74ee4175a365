"""The scheduler: at each fire time it only enqueues a task, never runs one.

Misfire policy: a schedule fires for fire times that pass while the daemon
runs. Fire times missed while it was down are not replayed (no backlog on
restart); an enqueue that fails is retried for the same fire time at the next
tick at the earliest (later while failures go on: a capped backoff), and when a
later fire time has passed meanwhile only the latest is kept.
The dedup id `<name>-<fire time, UTC ISO 8601>` and the unique index on it make
any number of instances enqueue each fire time once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import structlog

from outboxd.config import ScheduleEntry, SchedulerSettings
from outboxd.cron import CronSchedule, EverySchedule, Schedule, parse_timezone
from outboxd.services.tasks import TaskService
from outboxd.workers.loops import LoopFailures, sleep_or_stop

log = structlog.get_logger(__name__)


# Retention's own schedule: outbox.prune at the top of every hour, unless [[scheduler.jobs]]
# names outbox.prune itself (then that entry, and only it, decides).
HOURLY_PRUNE = ScheduleEntry(name="retention", task="outbox.prune", cron="0 * * * *")


def schedules(settings: SchedulerSettings) -> tuple[ScheduleEntry, ...]:
    """The configured schedules, and the hourly prune unless one of them runs outbox.prune."""
    if any(entry.task == HOURLY_PRUNE.task for entry in settings.jobs):
        return settings.jobs
    return (*settings.jobs, HOURLY_PRUNE)


def schedule_of(entry: ScheduleEntry) -> tuple[Schedule, ZoneInfo]:
    """The entry's schedule and time zone; CronError (a ValueError) when invalid."""
    tz = parse_timezone(entry.timezone)
    if entry.cron is not None:
        return CronSchedule.parse(entry.cron), tz
    assert entry.every_s is not None
    return EverySchedule(entry.every_s), tz


def dedup_id(name: str, fire_at: datetime) -> str:
    utc = fire_at.astimezone(UTC)
    # Only as precise as needed, but never less: two fire times must never share an id.
    spec = (
        "seconds"
        if utc.microsecond == 0
        else "milliseconds"
        if utc.microsecond % 1000 == 0
        else "microseconds"
    )
    return f"{name}-{utc.replace(tzinfo=None).isoformat(timespec=spec)}Z"


@dataclass
class _Slot:
    entry: ScheduleEntry
    schedule: Schedule
    tz: ZoneInfo
    next_fire: datetime
    # After a failed enqueue: not tried again before this (the fire time itself has passed).
    retry_at: datetime | None = None

    def due(self) -> datetime:
        return self.next_fire if self.retry_at is None else max(self.next_fire, self.retry_at)


class Scheduler:
    def __init__(
        self,
        settings: SchedulerSettings,
        tasks: TaskService,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._settings = settings
        self._tasks = tasks
        self._clock = clock
        self._failures = LoopFailures("scheduler", "scheduler_enqueue_failed", level="error")
        now = self._now()
        self._slots = []
        for entry in schedules(settings):
            schedule, tz = schedule_of(entry)
            self._slots.append(_Slot(entry, schedule, tz, schedule.next_after(now, tz)))

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self._clock(), UTC)

    async def run(self, stop: asyncio.Event) -> None:
        log.info("scheduler_started", schedules=[s.entry.name for s in self._slots])
        while not stop.is_set():
            await self.tick()
            await sleep_or_stop(stop, self._sleep_s())
        log.info("scheduler_stopped")

    def next_fires(self) -> list[tuple[str, str, datetime]]:
        """(schedule name, task type, next fire time) of every schedule, for the console."""
        return [(s.entry.name, s.entry.task, s.next_fire) for s in self._slots]

    def _sleep_s(self) -> float:
        if not self._slots:
            return self._settings.tick_s
        soonest = min(s.due() for s in self._slots)
        until = (soonest - self._now()).total_seconds()
        return max(0.0, min(self._settings.tick_s, until))

    async def tick(self) -> int:
        """Enqueue every due fire time; returns how many task runs this call created."""
        created = 0
        now = self._now()
        for slot in self._slots:
            if slot.due() > now:
                continue
            # Only the latest passed fire time is enqueued (no backlog).
            fire = slot.next_fire
            following = slot.schedule.next_after(fire, slot.tz)
            while following <= now:
                fire, following = following, slot.schedule.next_after(following, slot.tz)
            dedup = dedup_id(slot.entry.name, fire)
            try:
                run, new = await self._tasks.enqueue(
                    slot.entry.task, dict(slot.entry.payload), dedup
                )
            except Exception as exc:
                delay = self._failures.failed(exc, schedule=slot.entry.name, dedup_id=dedup)
                # The same fire time, at the next tick at the earliest: never at once (the
                # fire time has passed, and a wait until it would be no wait at all).
                slot.next_fire = fire
                slot.retry_at = now + timedelta(seconds=max(self._settings.tick_s, delay))
                continue
            self._failures.ok()
            slot.retry_at = None
            created += int(new)
            log.info(
                "scheduler_fired",
                schedule=slot.entry.name,
                dedup_id=dedup,
                task_id=run.id,
                created=new,
            )
            slot.next_fire = following
        return created
