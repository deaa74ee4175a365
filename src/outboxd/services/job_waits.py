"""Requests held until their job changes (`GET /v1/jobs/{id}` with `Prefer: wait=N`).

A held request holds no database connection: it waits on a future. Per job there is one
watch, registered with `storage.changes.JobChanges`; when the job may have changed (a
commit in this process, a notification from another, a poll), the watch reads the job
once and answers every request it holds whose condition the job now meets. So a thousand
requests on one job cost one read per change, not a thousand.

A request registers its hold before it reads the job, so a change committed between its
read and its wait still wakes it. `api.max_waiters` bounds the requests held at once; the
daemon's stop Event answers all of them at once.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Literal, Protocol

import structlog

from outboxd.errors import StorageError
from outboxd.storage.changes import JobChanges
from outboxd.storage.ports import JobRecord

log = structlog.get_logger(__name__)

# Why a hold ended: the job met the condition, the time ran out, or the daemon is stopping.
Ending = Literal["changed", "timeout", "stopped"]
Condition = Callable[[JobRecord | None], bool]


class JobReader(Protocol):
    async def get_job(self, job_id: str) -> JobRecord | None: ...


@dataclass(eq=False)
class _Hold:
    fut: asyncio.Future[Ending]
    condition: Condition | None = None
    # A change came before the holder said what it waits for: look once it does.
    signalled: bool = False


@dataclass(eq=False)
class _Watch:
    holds: list[_Hold] = field(default_factory=list)
    refresh: asyncio.Task[None] | None = None
    again: bool = False
    # The job as last read for this watch: what holds are answered with.
    job: JobRecord | None = None
    reading: asyncio.Future[JobRecord | None] | None = None


class Hold:
    """One request's hold on a job (from `JobWaits.hold`)."""

    def __init__(self, waits: JobWaits, job_id: str, hold: _Hold) -> None:
        self._waits = waits
        self._job_id = job_id
        self._hold = hold

    async def until(
        self, condition: Condition, timeout_s: float
    ) -> tuple[Ending, JobRecord | None]:
        """Wait until `condition(job)` holds for the job as read after a change, for at most
        `timeout_s`, or until the daemon stops; why it ended, and the job as read then."""
        self._hold.condition = condition
        if self._hold.signalled:
            self._waits.wake(self._job_id)
        fut = self._hold.fut
        if not fut.done():
            await asyncio.wait({fut}, timeout=timeout_s)
        ending: Ending = fut.result() if fut.done() else "timeout"
        if ending == "changed":
            return ending, self._waits.last_read(self._job_id)
        # Timed out or stopping: the job as it is now (one read for every hold of the job
        # that asks at the same time).
        return ending, await self._waits.read(self._job_id)


class JobWaits:
    def __init__(self, store: JobReader, changes: JobChanges, max_waiters: int) -> None:
        self._store = store
        self._changes = changes
        self._max = max_waiters
        self._watches: dict[str, _Watch] = {}
        self._held = 0
        self._stopping = False

    @property
    def held(self) -> int:
        """Requests held now."""
        return self._held

    async def run(self, stop: asyncio.Event) -> None:
        """Until the daemon stops; then every held request is answered at once."""
        await stop.wait()
        self._stopping = True
        for watch in self._watches.values():
            for h in watch.holds:
                if not h.fut.done():
                    h.fut.set_result("stopped")

    @contextlib.asynccontextmanager
    async def hold(self, job_id: str) -> AsyncIterator[Hold | None]:
        """A hold on `job_id`, registered before the caller reads the job; None (answer at
        once) past `api.max_waiters` or while the daemon stops."""
        if self._stopping or self._held >= self._max:
            yield None
            return
        watch = self._watches.get(job_id)
        if watch is None:
            watch = self._watches[job_id] = _Watch()
            self._changes.watch(job_id, self.wake)
        h = _Hold(asyncio.get_running_loop().create_future())
        watch.holds.append(h)
        self._held += 1
        try:
            yield Hold(self, job_id, h)
        finally:
            self._held -= 1
            watch.holds.remove(h)
            if not watch.holds and self._watches.get(job_id) is watch:
                del self._watches[job_id]
                self._changes.unwatch(job_id)

    def wake(self, job_id: str) -> None:
        """`job_id` may have changed: read it once and answer the holds it now satisfies."""
        watch = self._watches.get(job_id)
        if watch is None:
            return
        if not any(h.condition is not None for h in watch.holds):
            for h in watch.holds:
                h.signalled = True
            return
        for h in watch.holds:
            h.signalled = h.condition is None
        if watch.refresh is not None and not watch.refresh.done():
            watch.again = True  # read again once the read in flight is back
            return
        watch.refresh = asyncio.ensure_future(self._refresh(job_id, watch))

    async def _refresh(self, job_id: str, watch: _Watch) -> None:
        while True:
            watch.again = False
            try:
                job = await self._store.get_job(job_id)
            except StorageError as exc:
                # The holds wait on: the next change or their time answers them.
                log.warning("job_wait_read_failed", job_id=job_id, error=exc)
                return
            watch.job = job
            for h in watch.holds:
                if h.condition is not None and not h.fut.done() and h.condition(job):
                    h.fut.set_result("changed")
            if not watch.again:
                return

    def last_read(self, job_id: str) -> JobRecord | None:
        watch = self._watches.get(job_id)
        return watch.job if watch is not None else None

    async def read(self, job_id: str) -> JobRecord | None:
        """The job now, one read shared by the holds of the job that ask together."""
        watch = self._watches.get(job_id)
        if watch is None:
            return await self._store.get_job(job_id)
        if watch.reading is None or watch.reading.done():
            watch.reading = asyncio.ensure_future(self._store.get_job(job_id))
        return await asyncio.shield(watch.reading)
