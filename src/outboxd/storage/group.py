"""Group commit: concurrent write transactions share one commit, a savepoint each.

On SQLite every commit is an fsync of the WAL, and on Postgres a flush of its own;
under load those dominate an intake. Requests that arrive while a group is being
written wait for the next one, which takes all of them (up to `max_members`) in one
transaction: on SQLite one thread hop and one fsync, on Postgres one connection, one
BEGIN and one COMMIT. A request that finds nothing in flight is written at once, on
the ordinary single path, so a lone request waits for nobody.

- A member whose body raises is rolled back to its savepoint; the others commit.
  After the commit it runs again alone, so its answer is exactly the one it would
  get alone (an idempotency replay, a constraint's error, ...).
- When the group as a whole fails (begin or commit, a lost connection, a locked
  file), each member runs again alone. Bodies given here must therefore be safe to
  run twice: when a commit's outcome is unknown the rows may already be there, and
  the rerun must find them (intake and registration are keyed, so it does).
- Each caller is answered only after the transaction holding its rows committed.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog

from outboxd.crashpoints import crash_point
from outboxd.storage.db import Database, Outcome, TxBody

log = structlog.get_logger(__name__)

T = TypeVar("T")
_Member = tuple[TxBody[Any], "asyncio.Future[Any]"]


@dataclass
class GroupStats:
    """Counters since start (tests and benchmarks read them)."""

    groups: int = 0  # group transactions attempted (two members or more)
    largest: int = 0
    member_failures: int = 0  # members rolled back to their savepoint, then run alone
    group_failures: int = 0  # whole groups that failed, their members then run alone


class GroupCommitter:
    def __init__(self, db: Database, max_members: int = 64, max_groups: int | None = None) -> None:
        self._db = db
        self._max_members = max(1, max_members)
        # SQLite has one writer: one group in flight, the next one gathering meanwhile.
        # Postgres writes groups side by side, but few of them, so that groups form.
        self._max_groups = max_groups or (1 if db.backend == "sqlite" else 2)
        self._pending: deque[_Member] = deque()
        self._writers = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self.stats = GroupStats()

    async def run(self, body: TxBody[T]) -> T:
        """`db.run(body)`, committed together with whatever else is waiting."""
        fut: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._pending.append((body, fut))
        if self._writers < self._max_groups:
            self._writers += 1
            task = asyncio.create_task(self._write_groups())
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        # A caller cancelled before its group is taken is dropped, as a cancelled
        # `db.run` would be; once taken, its transaction runs to the end regardless.
        return await fut

    async def drain(self) -> None:
        """Wait for every group in flight (before the database closes)."""
        while self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def _take(self) -> list[_Member]:
        batch: list[_Member] = []
        while self._pending and len(batch) < self._max_members:
            member = self._pending.popleft()
            if not member[1].done():
                batch.append(member)
        return batch

    async def _write_groups(self) -> None:
        try:
            # One turn of the loop: requests already on their way join this group.
            await asyncio.sleep(0)
            while batch := self._take():
                await self._write(batch)
        finally:
            self._writers -= 1

    async def _write(self, batch: list[_Member]) -> None:
        if len(batch) == 1:
            await self._alone(*batch[0])
            return
        self.stats.groups += 1
        self.stats.largest = max(self.stats.largest, len(batch))
        try:
            outcomes = await self._db.run_group([body for body, _ in batch])
        except asyncio.CancelledError:
            for _, fut in batch:
                fut.cancel()
            raise
        except Exception as exc:
            self.stats.group_failures += 1
            log.warning("group_commit_failed", members=len(batch), error=str(exc)[:300])
            await asyncio.gather(*(self._alone(body, fut) for body, fut in batch))
            return
        crash_point("after_group_commit_before_answers")
        again: list[_Member] = []
        for (body, fut), outcome in zip(batch, outcomes, strict=True):
            if outcome.error is None:
                _answer(fut, outcome)
            else:
                again.append((body, fut))
        if again:
            self.stats.member_failures += len(again)
            await asyncio.gather(*(self._alone(body, fut) for body, fut in again))

    async def _alone(self, body: TxBody[Any], fut: asyncio.Future[Any]) -> None:
        try:
            value = await self._db.run(body)
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except Exception as exc:
            _answer(fut, Outcome(error=exc))
        else:
            _answer(fut, Outcome(value=value))


def _answer(fut: asyncio.Future[Any], outcome: Outcome) -> None:
    if fut.done():  # the caller went away
        return
    if outcome.error is not None:
        fut.set_exception(outcome.error)
    else:
        fut.set_result(outcome.value)
