"""The consumer's side of the portal login lock (services/portal_logins.py): before a
job's login, its verdict carried out; after it, what the outcome counts.

- `locked` (this user, for this username): the job ends FAILED PORTAL_LOGIN_LOCKED with
  `lockedUntil`, and the portal sees nothing;
- `wait` (the username is throttled and its one try is not this job's, or this user's
  tries under way as the same username would lock it should they fail): the job is parked
  until the next try (services/parking.py) and its message deleted, so the wait spends no
  SQS receive;
- `try` / `go`: the login goes ahead, its try recorded as under way (counted as a failure,
  so jobs running at once cannot all pass); its success forgets the username's counts, a
  rejected password counts for this user, in the transaction of the job's outcome; any
  other end of the run gives the try back.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from outboxd.errors import StorageError
from outboxd.queue.sqs import QueueError, QueueKind
from outboxd.services.parking import ParkStore, park_job
from outboxd.services.portal_logins import LoginGuard, LoginVerdict
from outboxd.storage.login_ports import LoginFailure
from outboxd.storage.ports import JobRecord

log = structlog.get_logger(__name__)


class Deleter(Protocol):
    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None: ...


class LoginGate:
    def __init__(
        self, guard: LoginGuard, store: ParkStore, queues: Deleter, clock: Callable[[], float]
    ) -> None:
        self._guard = guard
        self._store = store
        self._queues = queues
        self._clock = clock

    async def check(self, job: JobRecord, username: str) -> LoginVerdict | None:
        """The verdict for `job`'s login (None: the lock is off)."""
        return await self._guard.check(job, username)

    async def park(
        self, job: JobRecord, receipt_handle: str, verdict: LoginVerdict, bind: Mapping[str, Any]
    ) -> str:
        """A throttled username's job parked until its next try, then its message deleted
        (a crash in between: the redelivered message finds the job parked, and is deleted
        unrun)."""
        until = verdict.until if verdict.until is not None else self._clock()
        parked = await asyncio.shield(
            park_job(self._store, job, until, verdict.waiting, self._clock())
        )
        if parked is None:
            log.warning("job_outcome_lost_race", **bind)
            return "raced"
        log.info(
            "job_parked",
            dependency=verdict.waiting.dependency,
            state=verdict.waiting.state,
            until=until,
            **bind,
        )
        await self._queues.delete("jobs", receipt_handle)
        return "parked"

    def forget_before(self) -> float:
        return self._guard.forget_before()

    async def give_back(self, login: LoginRun, job: JobRecord) -> None:
        """The try this job went ahead with, given back unless its outcome settled it (a run
        that ended otherwise: a retry, a cancel, a crash of the handler)."""
        if login.settled:
            return
        with contextlib.suppress(StorageError, QueueError):
            await asyncio.shield(self._guard.give_back(login.verdict, job))


@dataclass
class LoginRun:
    """One run's login verdict, and whether its outcome settled the try (a success
    forgets the username's counts, a rejected password counts for this user)."""

    verdict: LoginVerdict | None
    settled: bool = False

    def success(self) -> str | None:
        """The subject whose counts a success forgets."""
        self.settled = True
        return self.verdict.subject if self.verdict is not None else None

    def failure(self, gate: LoginGate, job: JobRecord) -> LoginFailure | None:
        """A rejected password to count, for this job's user."""
        self.settled = True
        if self.verdict is None:
            return None
        return LoginFailure(self.verdict.subject, gate.forget_before(), user_id=job.user_id)
