"""A run's progress, written at most once per `consumer.progress_interval_s`
(docs/decisions/0037-progress-written-per-interval.md).

The scraper reports each step of the portal flow through `ProgressWriter.step`. A step
that comes at least an interval after the run's last write (its start, or the last
progress write) is written at once; one that comes sooner is held, and the held steps are
written together, each as its own `progress` event at its own time:

- with the next step that is due (one statement: the job's progress is the newest step,
  the events are every held step's and that step's);
- by a timer an interval after the last write, when no step came to carry them, so a slow
  portal still shows each step within an interval;
- with the run's outcome: `settle` hands the held steps to the consumer, whose
  `finish_job` writes them in the outcome's statement; every other ending writes them
  first with `flush`.

So the job's progress and its last `progress` event agree after every commit, and the
timeline ends with every step. What is held lives only here: a crash loses those steps (the
job runs again), never the job. A write that fails loses its steps, as a failed progress
write always did.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

import structlog

from outboxd.errors import StorageError
from outboxd.storage.ports import JobRecord, ProgressStep

log = structlog.get_logger(__name__)


class JobCancelled(Exception):
    """Raised by a run's check hook: the job's cancel was requested, the run stops."""


class ProgressStore(Protocol):
    async def update_job_progress(
        self,
        job: JobRecord,
        progress: Mapping[str, Any],
        now: float,
        held: Sequence[ProgressStep] = (),
    ) -> JobRecord | None: ...


class ProgressWriter:
    """One run's progress writes. `job` answers the run's job as the consumer holds it now
    (its version guards the writes); `clock` stamps the steps; the interval is measured on
    the event loop's monotonic clock, from the writer's creation (the run's start)."""

    def __init__(
        self,
        store: ProgressStore,
        job: Callable[[], JobRecord],
        clock: Callable[[], float],
        interval_s: float,
    ) -> None:
        self._store = store
        self._job = job
        self._clock = clock
        self._interval = interval_s
        self._loop = asyncio.get_running_loop()
        self._last = self._loop.time()  # the run's start was its last write
        self._held: list[ProgressStep] = []
        self._timer: asyncio.Task[None] | None = None
        # Every write and every look at the timer: a write in flight is never cancelled,
        # and the outcome never overtakes a write of the steps before it.
        self._lock = asyncio.Lock()
        self._cancel_seen = False

    async def step(self, step: str, done: int, total: int) -> None:
        """The scraper's progress callback (`ProgressCallback`). Raises JobCancelled when a
        write found the job's cancel requested."""
        if self._cancel_seen:
            raise JobCancelled()
        self._held.append(ProgressStep(self._clock(), {"step": step, "done": done, "total": total}))
        if self._due():
            async with self._lock:
                if self._due():  # not when the timer wrote while this step waited for it
                    self._stop_timer()
                    await self._write()
        if self._held and self._timer is None:
            self._timer = asyncio.create_task(self._write_when_due())
        if self._cancel_seen:
            raise JobCancelled()

    async def settle(self) -> list[ProgressStep]:
        """The run is over: no timer any more, no write in flight; the steps still held, for
        the outcome's own write (`finish_job(progress=...)`)."""
        async with self._lock:
            self._stop_timer()
            held, self._held = self._held, []
        return held

    async def flush(self) -> None:
        """The run is over and its outcome is not `finish_job`: the held steps in a write of
        their own, before that outcome's."""
        async with self._lock:
            self._stop_timer()
            await self._write()

    def _due(self) -> bool:
        return self._loop.time() - self._last >= self._interval

    def _stop_timer(self) -> None:
        # Only under the lock: the timer is then asleep or waiting for the lock, not writing.
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    async def _write_when_due(self) -> None:
        await asyncio.sleep(max(0.0, self._last + self._interval - self._loop.time()))
        async with self._lock:
            self._timer = None
            try:
                await self._write()
            except Exception as exc:  # a task nobody awaits: said here, or never
                log.exception("progress_write_failed", job_id=self._job().id, error=exc)

    async def _write(self) -> None:
        """Every held step, the newest as the job's progress (under the lock)."""
        if not self._held:
            return
        steps, self._held = self._held, []
        # From the start of the write: steps that come while it runs count from here.
        self._last = self._loop.time()
        newest = steps[-1]
        updated = None
        with contextlib.suppress(StorageError):
            updated = await self._store.update_job_progress(
                self._job(), newest.progress, newest.at, held=steps[:-1]
            )
        if updated is not None and updated.cancel_requested:
            self._cancel_seen = True
