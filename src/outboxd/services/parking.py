"""Parking a job until a time: the one way a worker lets a job wait for something outside
(a throttled portal login today; a circuit breaker's open state later) without spending
SQS receives on it.

A parked job is QUEUED with `waitingFor` on its body, and has a fresh relay-outbox row due
at `until`: the relay publishes it then, and only that row's message may start the job
(`start_job_run`'s guard). The caller deletes the message it holds after the park
committed; should it die first, the redelivered message finds the job parked for another
row and is deleted unrun. So the wait costs no receive, and cannot walk the message to
the DLQ however long it lasts (docs/decisions/0028-login-lock-per-user.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from outboxd.ids import new_id
from outboxd.storage.ports import JobRecord


@dataclass(frozen=True)
class WaitingFor:
    """What a parked job waits for: an outside system (`dependency`) in some `state`."""

    dependency: str
    state: str


class ParkStore(Protocol):
    async def park_job(
        self, job: JobRecord, outbox_id: str, until: float, wait_for: Mapping[str, Any], now: float
    ) -> JobRecord | None: ...


async def park_job(
    store: ParkStore, job: JobRecord, until: float, waiting_for: WaitingFor, now: float
) -> JobRecord | None:
    """Park `job` (RUNNING, held by the caller) until `until`: the job as parked, or None
    when it is no longer the caller's (nothing changed; its message is not the caller's
    to delete either)."""
    wait_for = {"dependency": waiting_for.dependency, "state": waiting_for.state}
    return await store.park_job(job, new_id(), max(until, now), wait_for, now)


def parked_for_another_message(job: JobRecord, outbox_id: str | None) -> bool:
    """Whether a message (of outbox row `outbox_id`) is an older one of a job parked since:
    the park's own row delivers the job, this one is to be deleted unrun."""
    return not job.terminal and job.wait_outbox_id is not None and job.wait_outbox_id != outbox_id
