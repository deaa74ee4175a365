"""Changes made by other processes, for the requests this one holds (`Prefer: wait`).

This process's own commits reach `JobChanges` from the store directly. Other processes'
arrive here:

- Postgres: one connection per process LISTENs on the channel every process's store
  notifies after its commits (the job id: storage/notifier.py); a notification wakes
  that job's held requests. Should the connection fail, the loop polls until it is back
  (reconnecting with backoff, and polling during each attempt too: a connect over a
  network gone silent waits out its whole timeout), then wakes every watched job once,
  since notifications sent meanwhile are lost.
- SQLite (and Postgres while not listening): every `POLL_S` one query reads the newest
  event of each job a request waits on, for all of them, and wakes those that moved
  (and those watched since the last poll, so a change between a request's read and its
  hold is seen). While a listing is held (`JobChanges.watch_any`), the same poll reads the
  newest event of any job, and a move wakes the listings. Nothing is read while nobody
  waits.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable

import structlog

from outboxd.errors import StorageError, StorageUnavailable
from outboxd.storage.changes import JobChanges
from outboxd.storage.ports import JobChangeStore, Listening
from outboxd.workers.loops import backoff, sleep_or_stop

log = structlog.get_logger(__name__)

# How often other processes' changes are looked for without notifications (SQLite): a
# change is seen within two of these at most.
POLL_S = 1.0
# How often the listening connection is checked while it is quiet.
PING_S = 10.0
_UNSEEN = -1


class JobChangeFeed:
    def __init__(self, store: JobChangeStore, changes: JobChanges, poll_s: float = POLL_S) -> None:
        self._store = store
        self._changes = changes
        self._poll_s = poll_s
        self._marks: dict[str, int | None] = {}
        # The newest event of any job at the last poll, while listings are held.
        self._newest: int | None = _UNSEEN

    async def run(self, stop: asyncio.Event) -> None:
        failures = 0
        while not stop.is_set():
            listening = self._store.listen_job_changes(self._notified)
            if listening is None:  # no notifications on this database: poll, always
                while not stop.is_set():
                    await self.poll_once()
                    await sleep_or_stop(stop, self._poll_s)
                return
            try:
                async with contextlib.AsyncExitStack() as stack:
                    conn = await self._connect_polling(stack.enter_async_context(listening), stop)
                    if conn is None:  # stopping
                        break
                    if failures:
                        log.info("job_listener_restored", after_failures=failures)
                    failures = 0
                    self._marks.clear()
                    self._newest = _UNSEEN
                    # What changed while nothing listened was not notified.
                    self._changes.publish_all()
                    await self._listen(conn, stop)
            except StorageError as exc:
                failures += 1
                # One warning an outage (the database's own outage lines say the rest); the
                # reconnect attempts that follow are debug, and `job_listener_restored` ends it.
                (log.warning if failures == 1 else log.debug)(
                    "job_listener_lost", error=exc, failures=failures
                )
            if stop.is_set():
                break
            # Not listening: poll until the next attempt.
            retry_in = backoff(failures, 1.0, 30.0, jitter=True)
            loop = asyncio.get_running_loop()
            until = loop.time() + retry_in
            while not stop.is_set() and loop.time() < until:
                await self.poll_once()
                await sleep_or_stop(stop, min(self._poll_s, max(0.0, until - loop.time())))

    async def _connect_polling(
        self, connecting: Awaitable[Listening], stop: asyncio.Event
    ) -> Listening | None:
        """The listening connection once it is up, polling every poll_s meanwhile: a connect
        over a network that went silent waits out its whole timeout, and the holds must not
        wait with it. None when the daemon stops first."""
        task = asyncio.ensure_future(connecting)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                await asyncio.wait(
                    {task, stopping}, timeout=self._poll_s, return_when=asyncio.FIRST_COMPLETED
                )
                if task.done():
                    return task.result()
                if stopping.done():
                    return None
                await self.poll_once()
        finally:
            stopping.cancel()
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, StorageError):
                    await task

    def _notified(self, job_id: str) -> None:
        self._changes.publish((job_id,))

    async def _listen(self, conn: Listening, stop: asyncio.Event) -> None:
        """Until the daemon stops (return) or the connection is lost (StorageUnavailable)."""
        stopping = asyncio.ensure_future(stop.wait())
        lost = asyncio.ensure_future(conn.lost.wait())
        try:
            while True:
                await asyncio.wait(
                    {stopping, lost}, timeout=PING_S, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping.done():
                    return
                if lost.done():
                    raise StorageUnavailable("the listening connection was lost")
                await conn.ping()
        finally:
            for t in (stopping, lost):
                t.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await t

    async def poll_once(self) -> None:
        """One query for every watched job; wake those whose newest event moved. While
        listings are held, one more for the newest event of any job."""
        await self._poll_any()
        watched = self._changes.watched()
        if not watched:
            self._marks.clear()
            return
        try:
            marks = await self._store.job_event_marks(watched)
        except StorageError as exc:
            log.debug("job_changes_poll_failed", error=exc)
            return
        moved = [j for j in watched if self._marks.get(j, _UNSEEN) != marks.get(j)]
        self._marks = {j: marks.get(j) for j in watched}
        self._changes.publish(moved)

    async def _poll_any(self) -> None:
        if not self._changes.watching_any():
            self._newest = _UNSEEN
            return
        try:
            newest = await self._store.newest_job_event()
        except StorageError as exc:
            log.debug("job_changes_poll_failed", error=exc)
            return
        # The first poll of a watch wakes it too: a change between a listing's read and
        # this poll would otherwise be taken for the starting point.
        if newest != self._newest:
            self._changes.some_changed()
        self._newest = newest
