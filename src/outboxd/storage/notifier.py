"""Telling the other processes on a Postgres database which jobs this one changed.

After each commit that changed a job, the store hands its ids to `ChangeNotifier`, which
sends them as `NOTIFY outboxd_jobs` (one notification per job id) in one statement of its
own, outside any write transaction: a transaction that notifies takes a cluster-wide lock
from its commit until the commit is flushed, so notifying inside the writes made every
commit wait for the others' flushes (docs/decisions/0023-notify-after-commit.md).

Ids that arrive while a statement is out, or in the short pause after it, wait for the
next one, so one statement carries whatever this process committed meanwhile: under load
the statements come at a steady pace, not one per commit (each costs a pooled connection's
round trip here and the notification queue's lock in Postgres), and a lone commit is told
at once. Should the process die between a commit and its statement, that notification is
lost: a request held elsewhere on that job is then answered at the end of its wait, as
after any lost notification.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Generator
from typing import Any

import structlog

from outboxd.errors import StorageError
from outboxd.storage.db import Database, Op, Query, fetch

log = structlog.get_logger(__name__)

# After each statement, how long the ids that follow gather before the next one: the
# most a notification is delayed, far below what a held request on another process waits.
GATHER_S = 0.01


class ChangeNotifier:
    def __init__(self, db: Database, query: Query, gather_s: float = GATHER_S) -> None:
        self._db = db
        self._query = query
        self._gather_s = gather_s
        self._ids: dict[str, None] = {}  # ordered, without repeats
        self._task: asyncio.Task[None] | None = None

    def __call__(self, job_ids: list[str]) -> None:
        self._ids.update(dict.fromkeys(job_ids))
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._send())

    async def _send(self) -> None:
        try:
            while self._ids:
                ids = list(self._ids)
                self._ids.clear()
                try:
                    await self._db.read(functools.partial(_notify, self._query, ids))
                except StorageError as exc:
                    # The database is out of reach: the writes fail too, and the listeners
                    # reconnect and wake every held request once it is back.
                    log.debug("job_notify_failed", jobs=len(ids), error=exc)
                await asyncio.sleep(self._gather_s)
        finally:
            self._task = None

    async def drain(self) -> None:
        """Send what is waiting (before the database closes)."""
        while self._task is not None:
            await asyncio.shield(self._task)


def _notify(query: Query, ids: list[str]) -> Generator[Op, Any, None]:
    yield fetch(query, {"ids": ids})
