"""The scheduler on a real store (both backends) with an injected clock.

docs/contract.md#scheduler: at each fire time the scheduler only inserts a task run whose
dedup id is `<name>-<fire time, UTC ISO 8601>`; a unique index makes that safe on any number of
instances; a failed enqueue is logged once (`storage_unavailable` for a database that is
down, `scheduler_enqueue_failed` otherwise) and retried at the next tick at the earliest;
fire times missed while the daemon was down are not replayed.
"""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import pytest
from structlog.testing import capture_logs

from outboxd.config import ScheduleEntry, SchedulerSettings
from outboxd.errors import StorageError
from outboxd.services.tasks import TaskService
from outboxd.storage.ports import RelayRow, TaskRun, TaskStore
from outboxd.storage.store import SqlStore, open_store
from outboxd.workers.scheduler import Scheduler
from tests.support.clock import Clock
from tests.support.waits import consistently


def ts(text: str) -> float:
    """`2024-03-10T12:03:30.5` (UTC) as epoch seconds."""
    return datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp()


async def tick_at(s: Scheduler, clock: Clock, when: str) -> int:
    """Move the clock to `when` (UTC) and run one tick: the runs it enqueued."""
    clock.now = ts(when)
    return await s.tick()


def every(name: str, seconds: float, task: str = "noop", **payload: Any) -> ScheduleEntry:
    return ScheduleEntry(name=name, task=task, every_s=seconds, payload=payload)


def cron(name: str, expr: str, timezone: str = "UTC", task: str = "noop") -> ScheduleEntry:
    return ScheduleEntry(name=name, task=task, cron=expr, timezone=timezone)


def scheduler(store: Any, clock: Clock, *entries: ScheduleEntry) -> Scheduler:
    return Scheduler(SchedulerSettings(jobs=entries), TaskService(store, clock), clock)


async def dedup_ids(store: SqlStore) -> list[str]:
    """The dedup ids of every task run, sorted."""
    return sorted(r.dedup_id for r in await task_runs(store))


async def ticked(s: Scheduler, clock: Clock, when: str, store: SqlStore) -> tuple[int, list[str]]:
    """`tick_at`, then the dedup ids of every task run so far: how many runs the tick
    enqueued, and which runs there are."""
    return await tick_at(s, clock, when), await dedup_ids(store)


async def task_runs(store: SqlStore) -> list[TaskRun]:
    page = await store.list_tasks(None, 500, None)
    assert page.next_cursor is None
    return list(page.items)


async def relay_rows(store: SqlStore) -> list[RelayRow]:
    page = await store.list_relay_rows(None, 500, None)
    return list(page.items)


async def test_a_due_fire_time_inserts_one_task_run_with_its_dedup_id(store: SqlStore) -> None:
    clock = Clock(ts("2024-03-10T12:00:03.250"))
    s = scheduler(store, clock, every("heartbeat", 10, note="x"))

    assert await s.tick() == 0, "nothing is due before the first fire time"
    assert await task_runs(store) == []

    assert await tick_at(s, clock, "2024-03-10T12:00:10.100") == 1
    runs = await task_runs(store)
    assert [(r.dedup_id, r.type, r.status, dict(r.payload)) for r in runs] == [
        ("heartbeat-2024-03-10T12:00:10Z", "noop", "PENDING", {"note": "x"})
    ]
    # The run and its relay outbox row were written together, with the same dedup id.
    rows = await relay_rows(store)
    assert [(r.kind, r.task_id, r.status, r.dedup_id) for r in rows] == [
        ("task", runs[0].id, "PENDING", "heartbeat-2024-03-10T12:00:10Z")
    ]

    # The same fire time is never enqueued twice by the same instance.
    assert await tick_at(s, clock, "2024-03-10T12:00:15") == 0
    assert len(await task_runs(store)) == 1

    assert await ticked(s, clock, "2024-03-10T12:00:20", store) == (
        1,
        ["heartbeat-2024-03-10T12:00:10Z", "heartbeat-2024-03-10T12:00:20Z"],
    )


async def test_fractional_every_s_uses_millisecond_dedup_ids(store: SqlStore) -> None:
    clock = Clock(ts("2024-03-10T12:00:00.100"))
    s = scheduler(store, clock, every("fast", 0.25))
    assert await ticked(s, clock, "2024-03-10T12:00:00.260", store) == (
        1,
        ["fast-2024-03-10T12:00:00.250Z"],
    )


async def test_sub_millisecond_fire_times_keep_distinct_dedup_ids(store: SqlStore) -> None:
    """Fire times 0.5 ms apart must not collapse onto one millisecond-precision id."""
    clock = Clock(ts("2024-03-10T12:00:00"))
    s = scheduler(store, clock, every("tiny", 0.0005))
    for us in (500, 1000, 1500):
        clock.now = ts("2024-03-10T12:00:00") + us / 1_000_000
        assert await s.tick() == 1, us
    assert {r.dedup_id for r in await task_runs(store)} == {
        "tiny-2024-03-10T12:00:00.000500Z",
        "tiny-2024-03-10T12:00:00.001Z",
        "tiny-2024-03-10T12:00:00.001500Z",
    }


async def test_two_instances_on_one_store_enqueue_a_fire_time_once(
    store: SqlStore, other: SqlStore
) -> None:
    # `other`: a second store (its own connections) stands for a second daemon.
    clock = Clock(ts("2024-03-10T12:00:01"))
    a = scheduler(store, clock, every("job", 5))
    b = scheduler(other, clock, every("job", 5))
    clock.now = ts("2024-03-10T12:00:05.001")
    created = await asyncio.gather(a.tick(), b.tick())
    assert sorted(created) == [0, 1]
    runs = await task_runs(store)
    assert [r.dedup_id for r in runs] == ["job-2024-03-10T12:00:05Z"]
    assert len(await relay_rows(store)) == 1
    # Sequential ticks of the next fire time: the later one is a no-op too.
    assert await tick_at(b, clock, "2024-03-10T12:00:10.5") == 1
    assert await a.tick() == 0
    assert len(await task_runs(store)) == 2
    assert len(await relay_rows(store)) == 2


class SwitchableStore:
    """A TaskStore that forwards to `target`, so a test can swap a broken store for a live one."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> Any:
        return getattr(self.target, name)


async def closed_store(db_url: str, tmp_path: Path) -> SqlStore:
    dead = await open_store(db_url, tmp_path, 2, 1.0)
    await dead.close()
    return dead


class CountingStore(SwitchableStore):
    """SwitchableStore that counts the enqueues it was asked for."""

    def __init__(self, target: Any) -> None:
        super().__init__(target)
        self.enqueues = 0

    async def enqueue_task(self, *args: Any) -> Any:
        self.enqueues += 1
        return await self.target.enqueue_task(*args)


async def test_a_failed_enqueue_is_retried_at_the_next_tick_never_at_once(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """The database down: one `storage_unavailable` line, the same fire time tried again
    no sooner than the next tick and then ever less often (the loop never spins on a fire
    time that has passed), and once it is back the same fire time is enqueued, with one
    `storage_recovered` line."""
    proxy = CountingStore(await closed_store(db_url, tmp_path))
    clock = Clock(ts("2024-03-10T12:00:01"))
    s = Scheduler(
        SchedulerSettings(jobs=(every("retry-me", 60),), tick_s=1.0),
        TaskService(cast(TaskStore, proxy), clock),
        clock,
    )
    clock.now = ts("2024-03-10T12:01:00.5")
    with capture_logs() as logs:
        assert await s.tick() == 0
        assert proxy.enqueues == 1
        # The fire time has passed, but the loop sleeps a whole tick before trying again.
        assert s._sleep_s() == pytest.approx(1.0)
        assert await s.tick() == 0
        assert proxy.enqueues == 1  # not due yet: nothing was tried
        # Thirty seconds of ticks while it stays down: a capped backoff (1, 1, 2, 4, 5, 5
        # ... s), not thirty tries, and no more lines.
        for _ in range(30):
            clock.now += 1.0
            assert await s.tick() == 0
            assert s._sleep_s() > 0
    assert 6 <= proxy.enqueues <= 10, proxy.enqueues
    down = [e for e in logs if e["event"] == "storage_unavailable"]
    assert len(down) == 1, logs
    assert down[0]["log_level"] == "warning"
    assert down[0]["component"] == "scheduler"
    assert down[0]["schedule"] == "retry-me"
    assert down[0]["dedup_id"] == "retry-me-2024-03-10T12:01:00Z"
    assert "closed" in str(down[0]["error"])
    assert [e for e in logs if e["log_level"] in ("warning", "error")] == down
    assert await task_runs(store) == []

    # The database is back before the next fire time: the same fire time is enqueued.
    proxy.target = store
    clock.now += 5.0
    with capture_logs() as logs:
        assert await s.tick() == 1
    recovered = [e for e in logs if e["event"] == "storage_recovered"]
    assert len(recovered) == 1 and recovered[0]["component"] == "scheduler", logs
    assert recovered[0]["count"] == proxy.enqueues - 1
    assert await dedup_ids(store) == ["retry-me-2024-03-10T12:01:00Z"]

    # And the schedule goes on from there, at every tick again.
    assert await tick_at(s, clock, "2024-03-10T12:02:00") == 1
    assert len(await task_runs(store)) == 2


class RefusingStore:
    """A TaskStore whose enqueue fails with an error that is no outage (a bug, a refusal)."""

    def __init__(self) -> None:
        self.enqueues = 0

    async def enqueue_task(self, *args: Any) -> Any:
        self.enqueues += 1
        raise StorageError("postgres: check constraint violated")


async def test_an_error_that_is_no_outage_is_logged_each_try_and_backs_off_too() -> None:
    refusing = RefusingStore()
    clock = Clock(ts("2024-03-10T12:00:01"))
    s = Scheduler(
        SchedulerSettings(jobs=(every("bad", 10),)),
        TaskService(cast(TaskStore, refusing), clock),
        clock,
    )
    clock.now = ts("2024-03-10T12:00:10")
    with capture_logs() as logs:
        for _ in range(20):
            assert await s.tick() == 0
            clock.now += 0.5
    failed = [e for e in logs if e["event"] == "scheduler_enqueue_failed"]
    assert len(failed) == refusing.enqueues and 3 <= refusing.enqueues <= 6, logs
    assert failed[0]["log_level"] == "error"
    assert "constraint" in str(failed[0]["error"])


async def test_an_outage_spanning_fire_times_keeps_only_the_latest(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    proxy = SwitchableStore(await closed_store(db_url, tmp_path))
    clock = Clock(ts("2024-03-10T12:00:01"))
    s = Scheduler(
        SchedulerSettings(jobs=(every("o", 10),)), TaskService(cast(TaskStore, proxy), clock), clock
    )
    clock.now = ts("2024-03-10T12:00:10")
    with capture_logs():
        assert await s.tick() == 0
    proxy.target = store
    assert await ticked(s, clock, "2024-03-10T12:00:41", store) == (1, ["o-2024-03-10T12:00:40Z"])


async def test_missed_fire_times_are_not_replayed(store: SqlStore) -> None:
    clock = Clock(ts("2024-03-10T12:00:00.5"))
    s = scheduler(store, clock, every("m", 10))
    # The loop stalled (or the host slept) across five fire times: only the latest fires.
    assert await ticked(s, clock, "2024-03-10T12:00:55", store) == (1, ["m-2024-03-10T12:00:50Z"])

    # A restart an hour later: nothing from the downtime is enqueued at start ...
    clock.now = ts("2024-03-10T13:00:03")
    restarted = scheduler(store, clock, every("m", 10))
    assert await restarted.tick() == 0
    assert len(await task_runs(store)) == 1
    # ... only fire times that pass while it runs.
    assert await ticked(restarted, clock, "2024-03-10T13:00:10", store) == (
        1,
        ["m-2024-03-10T12:00:50Z", "m-2024-03-10T13:00:10Z"],
    )


async def test_cron_schedules_fire_at_their_minutes_with_utc_dedup_ids(store: SqlStore) -> None:
    clock = Clock(ts("2024-03-10T11:58:30"))
    s = scheduler(
        store,
        clock,
        cron("five", "*/5 * * * *"),
        # 09:00 in Seoul (UTC+9, no DST) is 00:00 UTC; the dedup id is in UTC.
        cron("seoul", "0 9 * * *", timezone="Asia/Seoul"),
    )
    assert await tick_at(s, clock, "2024-03-10T11:59:59.999") == 0
    # "five" and the built-in hourly prune ("retention") at the top of the hour.
    assert await tick_at(s, clock, "2024-03-10T12:00:00") == 2
    assert await tick_at(s, clock, "2024-03-10T12:04:59") == 0
    assert await tick_at(s, clock, "2024-03-10T12:05:01") == 1
    clock.now = ts("2024-03-11T00:00:30")
    # All are due: "five" (latest passed 00:00), "seoul" (09:00 KST) and the hourly prune.
    assert await s.tick() == 3
    assert await dedup_ids(store) == [
        "five-2024-03-10T12:00:00Z",
        "five-2024-03-10T12:05:00Z",
        "five-2024-03-11T00:00:00Z",
        "retention-2024-03-10T12:00:00Z",
        "retention-2024-03-11T00:00:00Z",
        "seoul-2024-03-11T00:00:00Z",
    ]
    assert {r.type for r in await task_runs(store) if r.dedup_id.startswith("retention")} == {
        "outbox.prune"
    }


async def test_a_configured_prune_replaces_the_hourly_one(store: SqlStore) -> None:
    clock = Clock(ts("2024-03-10T11:58:30"))
    nightly = ScheduleEntry(name="nightly", task="outbox.prune", cron="30 3 * * *")
    s = scheduler(store, clock, nightly)
    assert await tick_at(s, clock, "2024-03-10T12:00:01") == 0  # no hourly prune
    assert await tick_at(s, clock, "2024-03-11T03:30:01") == 1
    assert await dedup_ids(store) == ["nightly-2024-03-11T03:30:00Z"]


async def test_cron_and_every_instances_agree_on_fire_times(
    store: SqlStore, other: SqlStore
) -> None:
    """Instances started at different moments compute the same fire times (epoch-anchored)."""
    early = scheduler(store, Clock(ts("2024-03-10T12:00:00.3")), every("e", 3))
    late_clock = Clock(ts("2024-03-10T12:00:01.7"))
    late = scheduler(other, late_clock, every("e", 3))
    early._clock = late_clock  # from now on both see the same time
    late_clock.now = ts("2024-03-10T12:00:03.01")
    assert sorted(await asyncio.gather(early.tick(), late.tick())) == [0, 1]
    assert await dedup_ids(store) == ["e-2024-03-10T12:00:03Z"]


@pytest.mark.real_clock  # how many fire in a second of the loop's own clock
async def test_run_loop_enqueues_on_the_real_clock_and_stops(store: SqlStore) -> None:
    s = Scheduler(SchedulerSettings(jobs=(every("live", 0.2),), tick_s=0.05), TaskService(store))
    stop = asyncio.Event()
    started = time.monotonic()
    with capture_logs() as logs:
        runner = asyncio.create_task(s.run(stop))
        await consistently(lambda: not runner.done(), 1.05)  # it runs until stopped
        stop.set()
        await asyncio.wait_for(runner, 2)
    assert time.monotonic() - started < 3
    runs = await task_runs(store)
    ids = [r.dedup_id for r in runs]
    assert len(ids) == len(set(ids))
    assert 3 <= len(ids) <= 7, ids
    events = [e["event"] for e in logs]
    assert events[0] == "scheduler_started"
    assert events[-1] == "scheduler_stopped"
    assert events.count("scheduler_fired") == len(ids)


@pytest.mark.parametrize("bad", [{"every_s": 0}, {"cron": "61 * * * *"}])
def test_invalid_schedules_are_rejected(bad: dict[str, Any]) -> None:
    from outboxd.cron import CronError

    entry = ScheduleEntry(name="bad", task="noop", **bad)
    with pytest.raises(CronError):
        Scheduler(SchedulerSettings(jobs=(entry,)), TaskService(object()))  # type: ignore[arg-type]
