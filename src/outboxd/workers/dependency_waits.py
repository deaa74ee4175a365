"""The consumer's side of the portal's breaker (services/breakers.py): before a job's run,
whether it may call the portal; after it, what the outcome tells the breaker.

- the portal is `up`: the run goes ahead (a job that waited gains its `resumed` event);
- it is down and this job is the cluster's probe: the run goes ahead as the probe;
- otherwise the job waits: it is held (no lease, the attempt its start took given back,
  a relay row that goes out when the portal is back) and its message deleted, so the wait
  spends no SQS receive and cannot walk the message to the DLQ, however long it lasts. A
  crash between the hold and the delete: the redelivered message finds the job held for
  another row and is deleted unrun (services/parking.py `parked_for_another_message`).
- a run that ends in an outage failure is counted; once the portal is not up (that run
  opened the breaker, or it was the probe), the job waits as above instead of spending
  the attempt.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any, Literal

import structlog

from outboxd.ids import new_id
from outboxd.services.breakers import PROBE, Breaker, Waiting
from outboxd.storage.breaker_ports import BreakerStore
from outboxd.storage.ports import JobRecord
from outboxd.workers.login_gate import Deleter

log = structlog.get_logger(__name__)

Admission = Waiting | Literal["probe"] | None


class DependencyWaits:
    def __init__(
        self,
        breaker: Breaker | None,
        store: BreakerStore,
        queues: Deleter,
        clock: Callable[[], float],
    ) -> None:
        self._breaker = breaker
        self._store = store
        self._queues = queues
        self._clock = clock

    async def admit(self, job: JobRecord) -> Admission:
        if self._breaker is None:
            return None
        return await self._breaker.admit(job.id)

    async def hold(
        self, job: JobRecord, receipt_handle: str, waits: Waiting, bind: Mapping[str, Any]
    ) -> str:
        """`job` (RUNNING, the caller's) waits for its dependency; its message is deleted."""
        wait_for = waits.wait_for()
        new_wait = dict(job.wait_for or {}) != wait_for
        held = await asyncio.shield(
            self._store.hold_job(
                job,
                new_id(),
                wait_for,
                waits.until,
                self._clock(),
                give_back=True,
                new_wait=new_wait,
            )
        )
        if held is None:
            log.warning("job_outcome_lost_race", **bind)
            return "raced"
        # One line a job only at debug: an outage is told by dependency_down/_up.
        log.debug("job_waiting", dependency=waits.dependency, state=waits.state, **bind)
        await self._queues.delete("jobs", receipt_handle)
        return "waiting"

    async def resumed(self, job: JobRecord) -> JobRecord:
        """A job that waited for this dependency runs again: its `resumed` event."""
        if self._breaker is None or job.wait_for is None:
            return job
        if job.wait_for.get("dependency") != self._breaker.name:
            return job
        if job.wait_for.get("state") not in ("down", "maintenance", "paused"):
            return job
        resumed = await self._store.resume_job(job, self._clock())
        return job if resumed is None else resumed

    async def outage(self, error: str, job: JobRecord, admitted: Admission) -> Waiting | None:
        """Count an outage failure of the run; why the job waits now (None: the portal is
        still up and the run counts as any failure)."""
        if self._breaker is None:
            return None
        return await self._breaker.outage(error, job.id if admitted == PROBE else None)

    async def through(self) -> None:
        if self._breaker is not None:
            await self._breaker.through()
