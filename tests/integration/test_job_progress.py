"""A run's progress, written at most once per `consumer.progress_interval_s`
(workers/progress.py, docs/decisions/0037-progress-written-per-interval.md), on both backends:

- steps held within the interval are written with the next write, each as its own
  `progress` event at its own time, before that write's own event;
- the job's progress and its last `progress` event agree after every commit;
- a held step is written within the interval even when no further step comes, and that
  write wakes whoever waits on the job;
- the outcome carries the steps still held: the timeline ends with every step, the job's
  progress with the last one;
- a cancel seen by a write stops the run at its next step.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.storage.ports import JobEvent, JobRecord, ProgressStep
from outboxd.storage.store import SqlStore
from outboxd.workers.progress import JobCancelled, ProgressWriter
from tests.support.consumer_rig import RigFactory
from tests.support.ops import placeholder_job
from tests.support.waits import eventually

# Every step the sample student's scrape reports (three semesters).
SAMPLE_STEPS = [
    {"step": "LOGIN", "done": 0, "total": 0},
    {"step": "SSO", "done": 0, "total": 0},
    {"step": "PROFILE", "done": 0, "total": 0},
    {"step": "SEMESTERS", "done": 0, "total": 0},
    {"step": "GRADES", "done": 0, "total": 3},
    {"step": "GRADES", "done": 1, "total": 3},
    {"step": "GRADES", "done": 2, "total": 3},
    {"step": "GRADES", "done": 3, "total": 3},
]


async def _running(store: SqlStore, key: str) -> JobRecord:
    job_id = str(uuid.uuid4())
    intake = await store.create_portal_job(
        placeholder_job(job_id, str(uuid.uuid4()), key), now=time.time()
    )
    assert intake.created
    run = await store.start_job_run(job_id, time.time(), 60.0, 1)
    assert run is not None
    return run


def _progress(events: list[JobEvent]) -> list[Any]:
    return [e.detail for e in events if e.type == "progress"]


def _step(name: str, done: int = 0, total: int = 0) -> dict[str, Any]:
    return {"step": name, "done": done, "total": total}


async def _agrees(store: SqlStore, job_id: str) -> tuple[JobRecord, list[JobEvent]] | None:
    """The job and its timeline read at one moment (the timeline the same before and after
    the job's read, so no write came between), after checking they agree: the job's
    progress is its last `progress` event's, and its last event's status is the job's.
    None when a write came between (read again)."""
    before = await store.job_events(job_id)
    job = await store.get_job(job_id)
    after = await store.job_events(job_id)
    if before != after:
        return None
    assert job is not None
    steps = _progress(after)
    assert job.progress == (steps[-1] if steps else None), (job.progress, steps)
    assert after[-1].status == job.status, after[-1]
    return job, after


async def test_held_steps_are_written_with_the_next_write_each_at_its_own_time(
    store: SqlStore,
) -> None:
    run = await _running(store, "held-1")
    held = [ProgressStep(101.0, _step("LOGIN")), ProgressStep(102.0, _step("SSO"))]
    updated = await store.update_job_progress(run, _step("PROFILE"), 103.0, held=held)
    assert updated is not None and updated.progress == _step("PROFILE")
    events = await store.job_events(run.id)
    assert [(e.type, e.at, e.status, e.attempt) for e in events[2:]] == [
        ("progress", 101.0, "RUNNING", 1),
        ("progress", 102.0, "RUNNING", 1),
        ("progress", 103.0, "RUNNING", 1),
    ]
    assert _progress(events) == [_step("LOGIN"), _step("SSO"), _step("PROFILE")]
    assert [e.seq for e in events] == sorted(e.seq for e in events)
    await _agrees(store, run.id)


async def test_the_outcome_carries_the_held_steps_and_ends_with_the_last(
    store: SqlStore,
) -> None:
    run = await _running(store, "held-2")
    assert await store.update_job_progress(run, _step("S-1"), 200.0) is not None
    held = [ProgressStep(201.0 + n, _step(f"S{n}")) for n in range(3)]
    done = await store.finish_job(run, "SUCCEEDED", 210.0, result={"ok": 1}, progress=held)
    assert done is not None and done.status == "SUCCEEDED"
    assert done.progress == _step("S2") and done.result == {"ok": 1}
    events = await store.job_events(run.id)
    assert [(e.type, e.at, e.status) for e in events[2:]] == [
        ("progress", 200.0, "RUNNING"),
        ("progress", 201.0, "RUNNING"),
        ("progress", 202.0, "RUNNING"),
        ("progress", 203.0, "RUNNING"),
        ("succeeded", 210.0, "SUCCEEDED"),
    ]
    await _agrees(store, run.id)


async def test_an_outcome_with_nothing_held_keeps_the_progress_written_before(
    store: SqlStore,
) -> None:
    run = await _running(store, "held-3")
    assert await store.update_job_progress(run, _step("GRADES", 3, 3), 301.0) is not None
    done = await store.finish_job(run, "FAILED", 302.0, error=("X", "y"))
    assert done is not None and done.progress == _step("GRADES", 3, 3)
    await _agrees(store, run.id)


async def test_a_refused_outcome_writes_none_of_its_held_steps(store: SqlStore) -> None:
    run = await _running(store, "held-4")
    assert await store.finish_job(run, "SUCCEEDED", 401.0, result={}) is not None
    before = await store.job_events(run.id)
    late = [ProgressStep(402.0, _step("LATE"))]
    assert await store.finish_job(run, "FAILED", 403.0, error=("X", "y"), progress=late) is None
    assert await store.update_job_progress(run, _step("LATER"), 404.0, held=late) is None
    assert await store.job_events(run.id) == before


@pytest.mark.real_clock  # the interval is real time: the writer's timer sleeps it
async def test_a_held_step_is_written_within_the_interval_and_wakes_the_waiters(
    store: SqlStore,
) -> None:
    run = await _running(store, "held-5")
    writer = ProgressWriter(store, lambda: run, time.time, 0.3)
    woken: list[float] = []
    store.changes.watch(run.id, lambda _job_id: woken.append(time.monotonic()))
    held_at = time.monotonic()
    await writer.step("LOGIN", 0, 0)
    await writer.step("SSO", 0, 0)
    job = await store.get_job(run.id)
    assert job is not None and job.progress is None  # held: within the interval of the start

    async def written() -> tuple[JobRecord, list[JobEvent]] | None:
        read = await _agrees(store, run.id)
        return read if read is not None and read[0].progress is not None else None

    # No further step comes: the timer writes both, an interval after the start.
    job, events = await eventually(written, 5, what="the held steps")
    assert job.progress == _step("SSO")
    assert _progress(events) == [_step("LOGIN"), _step("SSO")]
    assert woken and 0.2 < woken[0] - held_at < 0.3 + 1.0, (held_at, woken)
    # A step an interval after that write goes at once.
    await asyncio.sleep(0.35)
    await writer.step("PROFILE", 0, 0)
    job = await store.get_job(run.id)
    assert job is not None and job.progress == _step("PROFILE")
    assert await writer.settle() == []
    store.changes.unwatch(run.id)


async def test_settle_stops_the_timer_and_hands_back_what_is_held(store: SqlStore) -> None:
    run = await _running(store, "held-6")
    writer = ProgressWriter(store, lambda: run, time.time, 60.0)
    await writer.step("LOGIN", 0, 0)
    await writer.step("SSO", 0, 0)
    held = await writer.settle()
    assert [s.progress for s in held] == [_step("LOGIN"), _step("SSO")]
    assert held[0].at <= held[1].at
    assert await writer.settle() == []
    await writer.flush()  # nothing held: nothing written
    assert _progress(await store.job_events(run.id)) == []


async def test_a_write_that_finds_the_cancel_requested_stops_the_run(store: SqlStore) -> None:
    run = await _running(store, "held-7")
    writer = ProgressWriter(store, lambda: run, time.time, 0.0)  # every step at once
    await writer.step("LOGIN", 0, 0)
    _, outcome = await store.cancel_job(run.id, time.time(), "owner")
    assert outcome == "requested"
    with pytest.raises(JobCancelled):
        await writer.step("SSO", 0, 0)  # written, and its answer says stop
    assert _progress(await store.job_events(run.id)) == [_step("LOGIN"), _step("SSO")]


async def test_a_fast_run_writes_every_step_with_its_outcome(make_rig: RigFactory) -> None:
    """The default interval against an instant portal: no step is written on its own, the
    outcome's statement carries them all, and the job ends as it always did."""
    rig = await make_rig(consumer={"progress_interval_s": 60})
    rig.start_consumer()
    job_id, job = await rig.run_sample_job()
    assert job.status == "SUCCEEDED" and job.progress == SAMPLE_STEPS[-1]
    events = await rig.store.job_events(job_id)
    assert [e.type for e in events] == [
        "accepted",
        "dispatched",
        "started",
        *["progress"] * len(SAMPLE_STEPS),
        "succeeded",
    ]
    assert _progress(events) == SAMPLE_STEPS
    ats = [e.at for e in events]
    assert ats == sorted(ats), ats
    started, succeeded = events[2], events[-1]
    assert all(e.status == "RUNNING" and e.attempt == 1 for e in events[3:-1])
    # Each at the time it happened: between the start and the outcome.
    assert started.at <= events[3].at and events[-2].at <= succeeded.at


@pytest.mark.real_clock  # a slow portal: each request takes real time
async def test_a_slow_portal_shows_its_steps_while_it_runs(make_rig: RigFactory) -> None:
    """Each portal request takes 0.15 s and the interval is 0.3 s: the job's progress moves
    while it runs (held steps written by the timer or the next due step), agrees with its
    timeline at every look, and the timeline ends with every step in order."""
    rig = await make_rig(consumer={"progress_interval_s": 0.3})
    rig.portal.delay_s = 0.15
    rig.start_consumer()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)
    seen: list[Any] = []

    async def look() -> JobRecord | None:
        read = await _agrees(rig.store, job_id)
        if read is None:
            return None
        job, _ = read
        moved = not seen or seen[-1] != job.progress
        if job.status == "RUNNING" and job.progress is not None and moved:
            seen.append(job.progress)
        return job if job.terminal else None

    job = await eventually(look, 30, what="the job's end", interval=0.05)
    assert job.status == "SUCCEEDED" and job.progress == SAMPLE_STEPS[-1]
    # Followed while it ran: more than one step seen, none out of order.
    assert len(seen) >= 2, seen
    assert seen == sorted(seen, key=SAMPLE_STEPS.index), seen
    events = await rig.store.job_events(job_id)
    assert _progress(events) == SAMPLE_STEPS
    ats = [e.at for e in events]
    assert ats == sorted(ats), ats
