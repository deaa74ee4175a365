"""Telling the other processes on a Postgres database which jobs this one changed.

After each commit that changed a job, the store hands its ids to `ChangeNotifier`, which
sends them on `outboxd_jobs` in one statement of its own, outside any write transaction: a
transaction that notifies takes a cluster-wide lock from its commit until the commit is
flushed, so notifying inside the writes made every commit wait for the others' flushes
(docs/decisions/0023-notify-after-commit.md).

Ids that arrive while a statement is out, or in the short pause after it, wait for the
next one, so one statement carries whatever this process committed meanwhile: under load
the statements come at a steady pace, not one per commit (each costs a pooled connection's
round trip here and the notification queue's lock in Postgres), and a lone commit is told
at once. A statement sends one notification per up to `IDS_PER_NOTIFICATION` ids, its
payload the sender's token and the ids (`payloads`, read back by `heard`): Postgres queues
and delivers each notification to every listener, this process's own included, which skips
what it sent itself (docs/decisions/0024-timeline-cost-recovered.md). Should the process
die between a commit and its statement, that notification is lost: a request held
elsewhere on that job is then answered at the end of its wait, as after any lost
notification.
"""

from __future__ import annotations

import asyncio
import functools
import secrets
from collections.abc import Generator
from typing import Any

import structlog

from outboxd.errors import StorageError
from outboxd.observability import detached
from outboxd.storage.db import Database, Op, Query, fetch

log = structlog.get_logger(__name__)

# After each statement, how long the ids that follow gather before the next one: the
# most a notification is delayed, far below what a held request on another process waits.
GATHER_S = 0.01
# Ids per notification: a payload must stay under Postgres's 8,000 bytes (an id is 36).
IDS_PER_NOTIFICATION = 200


def payloads(sender: str, ids: list[str]) -> list[str]:
    """The notifications carrying `ids` from `sender`: "<sender> <id> <id> ..."."""
    step = IDS_PER_NOTIFICATION
    return [" ".join((sender, *ids[i : i + step])) for i in range(0, len(ids), step)]


def heard(payload: str, own: str) -> list[str]:
    """The job ids a notification names, none when this process sent it (`own`). A payload
    without a space is one job id, as daemons before the sender's token sent them."""
    sender, _, ids = payload.partition(" ")
    if not ids:
        return [payload]
    return [] if sender == own else ids.split(" ")


class ChangeNotifier:
    def __init__(self, db: Database, query: Query, gather_s: float = GATHER_S) -> None:
        self._db = db
        self._query = query
        self._gather_s = gather_s
        # Names this process's notifications, so that its own listener skips them.
        self.sender = secrets.token_hex(8)
        self._ids: dict[str, None] = {}  # ordered, without repeats
        self._task: asyncio.Task[None] | None = None

    def __call__(self, job_ids: list[str]) -> None:
        self._ids.update(dict.fromkeys(job_ids))
        if self._task is None:
            self._task = detached(self._send())

    async def _send(self) -> None:
        try:
            while self._ids:
                ids = list(self._ids)
                self._ids.clear()
                try:
                    await self._db.read(
                        functools.partial(_notify, self._query, payloads(self.sender, ids))
                    )
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


def _notify(query: Query, notes: list[str]) -> Generator[Op, Any, None]:
    yield fetch(query, {"payloads": notes})
