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
its wait still wakes it. The holds entering in one turn of the loop share that read too
(`Hold.current`: a read started after all of them registered). Ten thousand may be held at
once, so a hold is one slotted object and one future, its deadline a slot of one shared
wheel of timers (`TICK_S`), and the request awaits the future itself
(docs/decisions/0038-held-waits-cost-little.md). `api.max_waiters` bounds the requests
held at once, jobs and views together, and `api.max_waiters_per_user` one user's share of
them, so one user cannot take every hold; the daemon's stop Event answers all of them at
once. (Each held request keeps its HTTP connection: `api.max_waiters` stays below
`server.max_connections`, config_file.py, so held requests cannot fill the listener.)
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
from collections.abc import Awaitable, Callable
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
# A shared read that failed: each hold that shared it reads on its own (one exception
# object raised in thousands of requests would grow one traceback through all of them).
_FAILED: Final = object()
# How finely the deadlines of held requests are kept: a wait ends at most this long after
# its time, and requests whose deadlines fall in one slot share one timer.
TICK_S: Final = 0.05


class JobReader(Protocol):
    async def get_job(self, job_id: str) -> JobRecord | None: ...


@dataclass(eq=False)
class _Watch(Generic[T]):
    read: Callable[[], Awaitable[T]]
    settle_s: float = 0.0
    holds: set[Hold[T]] = field(default_factory=set)
    refresh: asyncio.Task[None] | None = None
    again: bool = False
    # What was last read for this watch: what holds are answered with.
    value: T | None = None
    reading: asyncio.Future[T] | None = None
    # The read the holds entering in this turn of the loop share (`Hold.current`), until
    # it starts at the next turn.
    joining: asyncio.Future[Any] | None = None


class Hold(Generic[T]):
    """One request's hold on a job or a view (from `JobWaits.hold`, `JobWaits.hold_view`),
    and the async context it is held in: entering registers it (None past the bounds),
    leaving releases it.

    Ten thousand of these may be held at once (docs/decisions/0038-held-waits-cost-little.md):
    slots, one future, no task, closure or timer of its own (its deadline is a slot of the
    shared wheel, `JobWaits._arm`)."""

    __slots__ = (
        "_fut",
        "_key",
        "_read",
        "_settle_s",
        "_slot",
        "_user",
        "_waits",
        "_watch",
        "condition",
        "signalled",
    )

    def __init__(
        self,
        waits: JobWaits,
        key: str,
        user: str,
        read: Callable[[], Awaitable[T]] | None,
        settle_s: float,
    ) -> None:
        self._waits = waits
        self._key = key
        self._user = user
        self._read = read  # how a new watch reads (None: the job `key`)
        self._settle_s = settle_s
        self._fut: asyncio.Future[Ending] | None = None
        self._watch: _Watch[T] | None = None
        self._slot: int | None = None  # its deadline's slot on the wheel while it waits
        self.condition: Callable[[T], bool] | None = None
        # A change came before the holder said what it waits for: look once it does.
        self.signalled = False

    def enter(self) -> bool:
        """Register the hold: False (answer at once) past the bounds or while stopping.
        What `async with` does; a caller that holds through `enter` and `release` keeps no
        `__aexit__` of its own across the wait."""
        return self._waits._enter(self)

    def release(self) -> None:
        """Let go of the hold (nothing when it was not entered, or was released)."""
        if self._watch is not None:
            self._waits._leave(self)

    async def __aenter__(self) -> Hold[T] | None:
        return self if self.enter() else None

    async def __aexit__(self, *_exc: object) -> None:
        self.release()

    async def current(self) -> T:
        """The value as read after this hold was entered: one read, starting at the next
        turn of the loop, for every hold of the watch that asks in this one (a burst of
        requests on one job costs a read, not one each). Should that read fail, this
        hold reads on its own (and so raises what the read raises)."""
        waits = self._waits
        assert self._watch is not None, "current() is for a hold that was entered"
        return cast(T, await waits._current(self._watch))

    def wait(self, condition: Callable[[T], bool], timeout_s: float) -> asyncio.Future[Ending]:
        """Why the hold ended, once `condition(value)` holds for the value as read after a
        change, or `timeout_s` has passed (ending up to `TICK_S` later), or the daemon stops:
        its future, for the holder to await itself (no coroutine of this one's held across
        the wait). The value then: `value`."""
        waits, fut = self._waits, self._fut
        assert fut is not None, "wait() is for a hold that was entered"
        self.condition = condition
        if self.signalled:
            waits.wake(self._key)
        if not fut.done():
            waits._arm(self, timeout_s)
        return fut

    async def value(self, ending: Ending) -> T:
        """The value the hold ended with: the read that met the condition, or (timed out or
        stopping) the value as it is now, one read for every hold of the watch that asks at
        the same time."""
        if ending == "changed":
            return cast(T, self._waits.last_read(self._key))
        return cast(T, await self._waits.read(self._key))

    async def until(self, condition: Callable[[T], bool], timeout_s: float) -> tuple[Ending, T]:
        """`wait`, then `value`."""
        ending = await self.wait(condition, timeout_s)
        return ending, await self.value(ending)


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
    # The deadline wheel: the holds waiting, by the TICK_S slot their time runs out in, and
    # one timer per slot in use (not one per hold).
    _due: dict[int, set[Hold[Any]]] = field(default_factory=dict, init=False)
    _timers: dict[int, asyncio.TimerHandle] = field(default_factory=dict, init=False)

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
                if h._fut is not None and not h._fut.done():
                    h._fut.set_result("stopped")

    @property
    def deadlines(self) -> int:
        """The wheel's slots in use: one timer each, however many holds share it."""
        return len(self._timers)

    def held_by(self, user: str) -> int:
        """Requests `user` holds now."""
        return self._held_by.get(user, 0)

    def hold(self, job_id: str, user: str) -> Hold[JobRecord | None]:
        """A hold on `job_id` for `user`, for `async with`: registered on entering, before
        the caller reads the job; None (answer at once) past `api.max_waiters`, past `user`'s
        `api.max_waiters_per_user`, or while the daemon stops."""
        return Hold(self, job_id, user, None, 0.0)

    def hold_view(self, key: str, user: str, read: Callable[[], Awaitable[T]]) -> Hold[T]:
        """A hold for `user` on a view of many jobs that `read` reads, woken by any job's
        change; the holds of one `key` share its reads, so `key` must name all `read`
        depends on. None as for `hold`."""
        return Hold(self, _VIEW + key, user, read, self.view_settle_s)

    def _enter(self, h: Hold[Any]) -> bool:
        user, key = h._user, h._key
        mine = self._held_by.get(user, 0)
        per_user = self.max_waiters_per_user
        if (
            self._stopping
            or self._held >= self.max_waiters
            or (per_user is not None and mine >= per_user)
        ):
            return False
        watch = self._watches.get(key)
        if watch is None:
            read = h._read if h._read is not None else functools.partial(self.store.get_job, key)
            watch = self._watches[key] = _Watch(read, h._settle_s)
            if key.startswith(_VIEW):
                self.changes.watch_any(key, self.wake)
            else:
                self.changes.watch(key, self.wake)
        h._read = None
        h._watch = watch
        h._fut = asyncio.get_running_loop().create_future()
        watch.holds.add(h)
        self._held += 1
        self._held_by[user] = mine + 1
        return True

    def _leave(self, h: Hold[Any]) -> None:
        watch, key, user = h._watch, h._key, h._user
        assert watch is not None
        h._watch = None
        self._disarm(h)
        self._held -= 1
        left = self._held_by[user] - 1
        if left:
            self._held_by[user] = left
        else:
            del self._held_by[user]
        watch.holds.discard(h)
        if not watch.holds and self._watches.get(key) is watch:
            del self._watches[key]
            if key.startswith(_VIEW):
                self.changes.unwatch_any(key)
            else:
                self.changes.unwatch(key)

    def _arm(self, h: Hold[Any], timeout_s: float) -> None:
        """Answer `h` "timeout" once `timeout_s` has passed: it joins the wheel's slot its
        deadline falls in (rounded up to TICK_S), whose one timer answers every hold in it."""
        loop = asyncio.get_running_loop()
        slot = math.ceil((loop.time() + timeout_s) / TICK_S)
        due = self._due.get(slot)
        if due is None:
            due = self._due[slot] = set()
            self._timers[slot] = loop.call_at(slot * TICK_S, self._expire, slot)
        due.add(h)
        h._slot = slot

    def _disarm(self, h: Hold[Any]) -> None:
        slot, h._slot = h._slot, None
        if slot is None:
            return
        due = self._due.get(slot)
        if due is None:
            return
        due.discard(h)
        if not due:
            del self._due[slot]
            self._timers.pop(slot).cancel()

    def _expire(self, slot: int) -> None:
        self._timers.pop(slot, None)
        for h in self._due.pop(slot, ()):
            h._slot = None
            if h._fut is not None and not h._fut.done():
                h._fut.set_result("timeout")

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
                fut, condition = h._fut, h.condition
                if (
                    condition is not None
                    and fut is not None
                    and not fut.done()
                    and condition(value)
                ):
                    fut.set_result("changed")
            if not watch.again:
                return

    async def _current(self, watch: _Watch[Any]) -> Any:
        joining = watch.joining
        if joining is None:
            loop = asyncio.get_running_loop()
            joining = watch.joining = loop.create_future()
            loop.call_soon(self._start_joined, watch, joining)
        # Shielded: one request that goes away does not cancel the read of the others.
        value = await asyncio.shield(joining)
        return await watch.read() if value is _FAILED else value

    def _start_joined(self, watch: _Watch[Any], joining: asyncio.Future[Any]) -> None:
        """The shared read starts: every hold that asks from now on shares the next one."""
        if watch.joining is joining:
            watch.joining = None
        task = asyncio.ensure_future(watch.read())
        task.add_done_callback(functools.partial(_settle_joined, joining))

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


def _settle_joined(joining: asyncio.Future[Any], task: asyncio.Task[Any]) -> None:
    if joining.done():  # pragma: no cover - only this callback settles it
        return
    if task.cancelled() or task.exception() is not None:
        joining.set_result(_FAILED)
    else:
        joining.set_result(task.result())
