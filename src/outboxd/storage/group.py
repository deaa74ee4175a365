"""Group commit: concurrent write transactions share one commit, a savepoint each.

On SQLite every commit is an fsync of the WAL; on Postgres each transaction costs
its round trips and a flush of its own. A request that finds no write in flight runs
at once on the ordinary single path, so a lone request waits for nobody. Requests
that arrive while writes are in flight wait for the next group, which takes all of
them (up to `max_members`) in one transaction:

- the savepoint path (`Database.run_group`): one BEGIN, a savepoint per member, one
  COMMIT; on SQLite the whole group is one thread hop and one fsync;
- optionally a set-based `bulk` body first (intake, where the driver's `Features` offer
  it: Postgres): the whole group in one statement, one round trip. Should it fail on a
  member's row (a constraint), the group is written again on the savepoint path.

A member that raises is rolled back to its savepoint; the others commit. After the
commit it runs again alone, so its answer is exactly the one it would get alone (an
idempotency replay, a constraint's error). When the group as a whole fails (begin or
commit, a lost connection) each member runs alone; but where the driver says a database
out of reach is out of reach for every member (`Features.rerun_unavailable` off: on
SQLite, a file that is locked or failing, which each member alone would meet after
waiting the busy timeout again), every member is answered with the group's error at
once. Bodies given here must therefore be safe to run twice: when a commit's outcome is
unknown the rows may already be there, and the rerun must find them (intake and
registration are keyed on the idempotency key and the domain, so it does). Each caller
is answered only after the transaction holding its rows committed.

A body may take a lock of its own before it writes (a per-user cap's, named by `order`):
such a member is never written by the `bulk` statement, and a group with such members runs
them in the order of their names, so two groups in flight never wait for each other's locks
in a cycle (docs/decisions/0030-per-user-bounds.md).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from outboxd.crashpoints import crash_point
from outboxd.errors import StorageUnavailable
from outboxd.observability import detached
from outboxd.storage.db import Database, Outcome, TxBody

log = structlog.get_logger(__name__)

T = TypeVar("T")
# Items of a group, and the time the statement is sent -> a body of one statement (run
# with `one_statement=True`) answering, per item, its value or None ("run it alone").
Bulk = Callable[[Sequence[Any], float], TxBody[list[Any]]]


@dataclass
class GroupStats:
    """Counters since start (tests and benchmarks read them)."""

    groups: int = 0  # groups of two members or more
    largest: int = 0
    bulk_refused: int = 0  # bulk statements that failed on a row: savepoint path instead
    member_failures: int = 0  # members rolled back to their savepoint, then run alone
    group_failures: int = 0  # whole groups that failed, their members then run alone


@dataclass
class _Member:
    body: TxBody[Any]
    item: Any
    fut: asyncio.Future[Any]
    taken: bool = False
    order: str | None = None


class GroupCommitter:
    def __init__(
        self,
        db: Database,
        *,
        bulk: Bulk | None = None,
        max_members: int = 64,
        max_groups: int | None = None,
        patience_s: float | None = None,
    ) -> None:
        self._db = db
        # How long a call may wait in line before a group takes it (then 503), as a
        # single write may wait for the SQLite lock or a pooled connection.
        self._patience_s = patience_s
        self._bulk = bulk
        self._max_members = max(1, max_members)
        # How many groups write at once, and whether a group that could not reach the
        # database reruns its members alone: the driver's to say (its `Features`).
        self.max_groups = max_groups or db.features.group_writers
        self._rerun_unavailable = db.features.rerun_unavailable
        self._pending: deque[_Member] = deque()
        self._writers = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    async def run(self, body: TxBody[T], item: Any = None, order: str | None = None) -> T:
        """`db.run(body)`, committed together with whatever else is waiting.

        `item` is what the `bulk` body needs to write this member (when there is one).
        `order` names the lock the body takes first (a user's, for a cap): the member is
        written by its own body, never by `bulk`, in the order of its name in the group.
        """
        if order is not None:
            item = None  # no item: `bulk` never writes it (it could not take the lock)
        if not self._pending and self._writers < self.max_groups:
            # Nothing waiting: the single path, at once, cancellable as `db.run` is.
            self._writers += 1
            try:
                return await self._one(body, item)  # type: ignore[no-any-return]
            finally:
                self._writers -= 1
                self._wake()
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        member = _Member(body, item, fut, order=order)
        self._pending.append(member)
        self._wake()
        # A caller cancelled before its group is taken is dropped (its future is cancelled
        # with it, and `_take` skips it), as a cancelled `db.run` would be; once taken,
        # its group runs to the end regardless.
        if self._patience_s is None:
            return await fut
        # One timer, not asyncio.wait (a waiter future and callbacks per call).
        timer = loop.call_later(self._patience_s, self._expire, member)
        try:
            return await fut
        finally:
            timer.cancel()

    def _expire(self, member: _Member) -> None:
        """Patience ran out: a caller still in line answers 503; one taken waits on."""
        if not member.taken and not member.fut.done():
            member.fut.set_exception(
                StorageUnavailable(f"{self._db.backend}: timed out waiting for the database")
            )

    async def drain(self) -> None:
        """Wait for every group in flight (before the database closes)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _wake(self) -> None:
        if self._pending and self._writers < self.max_groups:
            self._writers += 1
            # A group writes for every member: it logs as none of them.
            task = detached(self._write_groups())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    def _take(self) -> list[_Member]:
        batch: list[_Member] = []
        while self._pending and len(batch) < self._max_members:
            member = self._pending.popleft()
            if not member.fut.done():
                member.taken = True
                batch.append(member)
        return batch

    async def _write_groups(self) -> None:
        try:
            while batch := self._take():
                try:
                    await self._write(batch)
                except asyncio.CancelledError:
                    for m in batch:
                        m.fut.cancel()
                    raise
                except Exception as exc:  # a bug here must not leave callers waiting forever
                    log.exception("group_commit_crashed", members=len(batch))
                    for m in batch:
                        _settle(m.fut, Outcome(error=exc))
        finally:
            self._writers -= 1
            self._wake()

    async def _one(self, body: TxBody[Any], item: Any) -> Any:
        """One member on its own: the `bulk` body when there is one and the member has an
        item (on Postgres one statement, one round trip less than the member's own body),
        else `db.run(body)`.
        Should bulk not write the item (its key was taken, or a row refused), the member's
        own body runs, so the answer is the one it would get alone."""
        if self._bulk is not None and item is not None:
            try:
                values = await self._db.run(self._bulk([item], time.time()), one_statement=True)
            except StorageUnavailable:
                raise  # the connection or the database, as `db.run(body)` would meet
            except Exception:
                values = [None]
            if values[0] is not None:
                return values[0]
        return await self._db.run(body)

    async def _write(self, batch: list[_Member]) -> None:
        if len(batch) == 1:
            await _answer(batch[0], self._one(batch[0].body, batch[0].item))
            return
        self.stats.groups += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        locking = any(m.order is not None for m in batch)
        if locking:
            # Locks taken in one order by every group: none waits for another in a cycle.
            batch.sort(key=lambda m: m.order or "")
        try:
            if self._bulk is not None and not locking and await self._write_bulk(batch):
                return
            outcomes = await self._db.run_group([m.body for m in batch])
        except Exception as exc:
            self.stats.group_failures += 1
            log.warning("group_commit_failed", members=len(batch), error=str(exc)[:300])
            if isinstance(exc, StorageUnavailable) and not self._rerun_unavailable:
                # SQLite's file is locked, busy or failing: the group already waited the
                # busy timeout, and each member alone would wait it again for the same 503.
                for m in batch:
                    _settle(m.fut, Outcome(error=exc))
                return
            await self._alone(batch)
            return
        crash_point("after_group_commit_before_answers")
        failed = [m for m, o in zip(batch, outcomes, strict=True) if o.error is not None]
        for m, o in zip(batch, outcomes, strict=True):
            if o.error is None:
                _settle(m.fut, o)
        if failed:
            self.stats.member_failures += len(failed)
            await self._alone(failed)

    async def _write_bulk(self, batch: list[_Member]) -> bool:
        """True once the bulk body committed and its members were answered."""
        assert self._bulk is not None
        try:
            bulk = self._bulk([m.item for m in batch], time.time())
            values = await self._db.run(bulk, one_statement=True)
        except StorageUnavailable:
            raise  # the connection or the database, not a row: a whole-group failure
        except Exception as exc:
            self.stats.bulk_refused += 1
            log.info("group_bulk_refused", members=len(batch), error=str(exc)[:300])
            return False
        crash_point("after_group_commit_before_answers")
        rest = [m for m, v in zip(batch, values, strict=True) if v is None]
        for m, v in zip(batch, values, strict=True):
            if v is not None:
                _settle(m.fut, Outcome(value=v))
        if rest:
            await self._alone(rest)
        return True

    async def _alone(self, members: list[_Member]) -> None:
        await asyncio.gather(*(_answer(m, self._db.run(m.body)) for m in members))


async def _answer(member: _Member, write: Awaitable[Any]) -> None:
    """Run a member's own write and answer the member with its value or its error."""
    try:
        value = await write
    except asyncio.CancelledError:
        member.fut.cancel()
        raise
    except Exception as exc:
        _settle(member.fut, Outcome(error=exc))
    else:
        _settle(member.fut, Outcome(value=value))


def _settle(fut: asyncio.Future[Any], outcome: Outcome) -> None:
    if fut.done():  # the caller went away
        return
    if outcome.error is not None:
        fut.set_exception(outcome.error)
    else:
        fut.set_result(outcome.value)
