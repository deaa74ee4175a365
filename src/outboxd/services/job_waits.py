"""Requests held until their job changes (`GET /v1/jobs/{id}` with `Prefer: wait=N`), or
until a view of many jobs changes (a listing, the stats: `hold_view`).

A held request holds no database connection: it waits on a future. Per job there is one
watch, registered with `storage.changes.JobChanges`; when the job may have changed (a
commit in this process, a notification from another, a poll), the watch reads the job
once and answers every request it holds whose condition the job now meets. So a thousand
requests on one job cost one read per change, not a thousand.

A view is watched the same way under a key naming everything its read depends on (the
listing's filters and page): any job's change wakes it, and its holds share one read per
change, at most one per `VIEW_SETTLE_S` while jobs keep changing.

A request registers its hold before it reads, so a change committed between its read and
its wait still wakes it. `api.max_waiters` bounds the requests held at once, jobs and
views together, and `api.max_waiters_per_user` one user's share of them, so one user
cannot take every hold; the daemon's stop Event answers all of them at once. (Each held
request keeps its HTTP connection: `api.max_waiters` stays below `server.max_connections`,
config_file.py, so held requests cannot fill the listener.)
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Final, Generic, Literal, Protocol, TypeVar, cast

import structlog

from outboxd.errors import StorageError
from outboxd.observability import detached
from outboxd.storage.changes import JobChanges
from outboxd.storage.ports import JobRecord

log = structlog.get_logger(__name__)

T = TypeVar("T")
# Why a hold ended: the job met the condition, the time ran out, or the daemon is stopping.
Ending = Literal["changed", "timeout", "stopped"]
Condition = Callable[[JobRecord | None], bool]
# A view is read at most this often while jobs keep changing: a burst costs one read.
VIEW_SETTLE_S: Final = 1.0
# View keys live beside job ids (UUIDs) in one table of watches.
_VIEW: Final = "view:"


class JobReader(Protocol):
    async def get_job(self, job_id: str) -> JobRecord | None: ...


@dataclass(eq=False)
class _Hold(Generic[T]):
    fut: asyncio.Future[Ending]
    condition: Callable[[T], bool] | None = None
    # A change came before the holder said what it waits for: look once it does.
    signalled: bool = False


@dataclass(eq=False)
class _Watch(Generic[T]):
    read: Callable[[], Awaitable[T]]
    settle_s: float = 0.0
    holds: list[_Hold[T]] = field(default_factory=list)
    refresh: asyncio.Task[None] | None = None
    again: bool = False
    # What was last read for this watch: what holds are answered with.
    value: T | None = None
    reading: asyncio.Future[T] | None = None


class Hold(Generic[T]):
    """One request's hold on a job or a view (from `JobWaits.hold`, `JobWaits.hold_view`)."""

    def __init__(self, waits: JobWaits, key: str, hold: _Hold[T]) -> None:
        self._waits = waits
        self._key = key
        self._hold = hold

    async def until(self, condition: Callable[[T], bool], timeout_s: float) -> tuple[Ending, T]:
        """Wait until `condition(value)` holds for the value as read after a change, for at
        most `timeout_s`, or until the daemon stops; why it ended, and the value read then."""
        self._hold.condition = condition
        if self._hold.signalled:
            self._waits.wake(self._key)
        fut = self._hold.fut
        if not fut.done():
            await asyncio.wait({fut}, timeout=timeout_s)
        ending: Ending = fut.result() if fut.done() else "timeout"
        if ending == "changed":
            return ending, cast(T, self._waits.last_read(self._key))
        # Timed out or stopping: the value as it is now (one read for every hold of the
        # watch that asks at the same time).
        return ending, cast(T, await self._waits.read(self._key))


@dataclass(eq=False, repr=False)
class JobWaits:
    store: JobReader
    changes: JobChanges
    max_waiters: int
    max_waiters_per_user: int | None = None
    view_settle_s: float = VIEW_SETTLE_S
    _watches: dict[str, _Watch[Any]] = field(default_factory=dict, init=False)
    _held: int = field(default=0, init=False)
    # Requests held now per user (a user holding none has no entry).
    _held_by: dict[str, int] = field(default_factory=dict, init=False)
    _stopping: bool = field(default=False, init=False)
    _stopped: asyncio.Event = field(default_factory=asyncio.Event, init=False)

    @property
    def held(self) -> int:
        """Requests held now."""
        return self._held

    async def run(self, stop: asyncio.Event) -> None:
        """Until the daemon stops; then every held request is answered at once."""
        await stop.wait()
        self._stopping = True
        self._stopped.set()
        for watch in self._watches.values():
            for h in watch.holds:
                if not h.fut.done():
                    h.fut.set_result("stopped")

    def held_by(self, user: str) -> int:
        """Requests `user` holds now."""
        return self._held_by.get(user, 0)

    def hold(
        self, job_id: str, user: str
    ) -> contextlib.AbstractAsyncContextManager[Hold[JobRecord | None] | None]:
        """A hold on `job_id` for `user`, registered before the caller reads the job; None
        (answer at once) past `api.max_waiters`, past `user`'s `api.max_waiters_per_user`,
        or while the daemon stops."""

        async def read() -> JobRecord | None:
            return await self.store.get_job(job_id)

        return self._hold(job_id, user, read, 0.0)

    def hold_view(
        self, key: str, user: str, read: Callable[[], Awaitable[T]]
    ) -> contextlib.AbstractAsyncContextManager[Hold[T] | None]:
        """A hold for `user` on a view of many jobs that `read` reads, woken by any job's
        change; the holds of one `key` share its reads, so `key` must name all `read`
        depends on. None as for `hold`."""
        return self._hold(_VIEW + key, user, read, self.view_settle_s)

    @contextlib.asynccontextmanager
    async def _hold(
        self, key: str, user: str, read: Callable[[], Awaitable[T]], settle_s: float
    ) -> AsyncIterator[Hold[T] | None]:
        mine = self._held_by.get(user, 0)
        per_user = self.max_waiters_per_user
        if (
            self._stopping
            or self._held >= self.max_waiters
            or (per_user is not None and mine >= per_user)
        ):
            yield None
            return
        watch: _Watch[T] | None = self._watches.get(key)
        if watch is None:
            watch = self._watches[key] = _Watch(read, settle_s)
            if key.startswith(_VIEW):
                self.changes.watch_any(key, self.wake)
            else:
                self.changes.watch(key, self.wake)
        h: _Hold[T] = _Hold(asyncio.get_running_loop().create_future())
        watch.holds.append(h)
        self._held += 1
        self._held_by[user] = mine + 1
        try:
            yield Hold(self, key, h)
        finally:
            self._held -= 1
            left = self._held_by[user] - 1
            if left:
                self._held_by[user] = left
            else:
                del self._held_by[user]
            watch.holds.remove(h)
            if not watch.holds and self._watches.get(key) is watch:
                del self._watches[key]
                if key.startswith(_VIEW):
                    self.changes.unwatch_any(key)
                else:
                    self.changes.unwatch(key)

    def wake(self, key: str) -> None:
        """The job `key` (or any job, for a view) may have changed: read once and answer the
        holds the value now satisfies."""
        watch = self._watches.get(key)
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
        watch.refresh = detached(self._refresh(key, watch))

    async def _refresh(self, key: str, watch: _Watch[Any]) -> None:
        while True:
            if watch.settle_s:
                # Changes that come meanwhile are covered by the one read after the pause.
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), watch.settle_s)
                if self._stopping or not watch.holds:
                    return
            watch.again = False
            try:
                value = await watch.read()
            except StorageError as exc:
                # The holds wait on: the next change or their time answers them.
                log.warning("job_wait_read_failed", key=key, error=exc)
                return
            watch.value = value
            for h in watch.holds:
                if h.condition is not None and not h.fut.done() and h.condition(value):
                    h.fut.set_result("changed")
            if not watch.again:
                return

    def last_read(self, key: str) -> Any:
        watch = self._watches.get(key)
        return watch.value if watch is not None else None

    async def read(self, key: str) -> Any:
        """The value now, one read shared by the holds of the watch that ask together."""
        watch = self._watches.get(key)
        if watch is None:  # pragma: no cover - a hold keeps its watch until it is released
            return None
        if watch.reading is None or watch.reading.done():
            watch.reading = asyncio.ensure_future(watch.read())
        return await asyncio.shield(watch.reading)
