"""Portal-link jobs: the transaction boundary for intake, replay and cancel."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from outboxd.errors import CapReached, OutboxdError, QuotaExceeded, StorageError
from outboxd.ids import new_id
from outboxd.observability import log_info
from outboxd.security import KeyRing
from outboxd.storage.ports import (
    RELAY_UNSENT_STATUSES,
    CancelOutcome,
    JobIntake,
    JobRecord,
    JobStore,
    NewPortalJob,
    RelayRow,
    RelayStore,
)

log = structlog.get_logger(__name__)

PORTALS = ("suwon",)


class IdempotencyConflict(OutboxdError):
    """The key was used before by this user for a different request."""


class DispatchFailed(OutboxdError):
    """`api.require_dispatch` is on and the synchronous publish did not succeed."""

    def __init__(self, job: JobRecord, outbox: RelayRow | None) -> None:
        super().__init__("the job was stored but could not be put on the queue")
        self.job = job
        self.outbox = outbox


class Dispatcher(Protocol):
    def intake_claim_until(self, now: float) -> float | None:
        """The lease the intake transaction puts on the new outbox row, or None."""
        ...

    async def dispatch(self, outbox_id: str, claimed: RelayRow | None = None) -> RelayRow | None:
        """Publish one outbox row now (`claimed`: as inserted with `intake_claim_until`);
        the row as committed SENT, or None when it is not SENT. Never raises for SQS
        failures."""
        ...


class JobsStore(JobStore, RelayStore, Protocol):
    pass


# What a client over api.max_active_jobs_per_user is told to wait: about one job's run.
ACTIVE_JOBS_RETRY_AFTER_S = 5


@dataclass(frozen=True)
class LinkCredentials:
    """What a portal job is asked to link, as the service takes it (the HTTP body, checked, is
    `http/models.py` `PortalLinkRequest`): sealed at intake, fingerprinted for replays."""

    portal: str
    username: str
    password: str

    def canonical(self) -> dict[str, str]:
        return {"portal": self.portal, "username": self.username, "password": self.password}


@dataclass(eq=False, repr=False)
class PortalJobService:
    store: JobsStore
    keys: KeyRing
    dispatcher: Dispatcher | None
    require_dispatch: bool = False
    clock: Callable[[], float] = time.time
    max_active_jobs: int = 0

    async def submit(
        self,
        user: str,
        idempotency_key: str,
        req: LinkCredentials,
        traceparent: str | None = None,
    ) -> JobIntake:
        """Store the job and its outbox row in one transaction, then publish the row.

        `traceparent` is the trace the job carries to the worker (a replay keeps the one
        the job was made with). QuotaExceeded when api.max_active_jobs_per_user is on and
        reached (a replay of an existing job never is). The jobs are counted in the intake's
        own transaction, so concurrent requests of one user never pass the cap together."""
        job_id, outbox_id = new_id(), new_id()
        # Sealed before the transaction so the transaction holds no CPU work;
        # the job id as associated data ties the ciphertext to its row.
        sealed = self.keys.seal_json(
            {"username": req.username, "password": req.password}, associated_data=job_id
        )
        now = self.clock()
        new = NewPortalJob(
            job_id=job_id,
            outbox_id=outbox_id,
            user_id=user,
            idempotency_key=idempotency_key,
            fingerprint=self.keys.fingerprint(req.canonical()),
            portal=req.portal,
            key_id=sealed.key_id,
            sealed=sealed.ciphertext,
            # The row is claimed in the intake transaction: the publish right after
            # the commit needs no claim transaction of its own.
            claimed_until=(self.dispatcher.intake_claim_until(now) if self.dispatcher else None),
            traceparent=traceparent,
            # How an operator finds the job by username (the login lock's keyed hash, never
            # the username), written by the statement that inserts the job.
            login_subject=self.keys.login_subject(req.portal, req.username),
        )
        try:
            intake = await self.store.create_portal_job(new, now, self.max_active_jobs)
        except CapReached as exc:
            raise QuotaExceeded(
                f"{exc.count} jobs of this user are QUEUED or RUNNING "
                f"(api.max_active_jobs_per_user = {self.max_active_jobs})",
                ACTIVE_JOBS_RETRY_AFTER_S,
            ) from None
        job, outbox = intake.job, intake.outbox
        if not intake.created and not self.keys.fingerprint_matches(
            job.fingerprint, req.canonical()
        ):
            raise IdempotencyConflict("Idempotency-Key was used with a different request")
        log_info(
            "job_accepted" if intake.created else "job_replayed",
            {"job_id": job.id, "outbox_id": outbox.id if outbox else None},
        )
        if outbox is not None and outbox.status in RELAY_UNSENT_STATUSES:
            own = outbox if intake.created and outbox.claimed_until is not None else None
            job, outbox = await self._dispatch(job, outbox, own)
        return replace(intake, job=job, outbox=outbox)

    async def _dispatch(
        self, job: JobRecord, outbox: RelayRow, claimed: RelayRow | None
    ) -> tuple[JobRecord, RelayRow]:
        if self.dispatcher is None:
            if self.require_dispatch:
                raise DispatchFailed(job, outbox)
            return job, outbox
        try:
            sent = await self.dispatcher.dispatch(outbox.id, claimed)
            if sent is None:
                # Not published (rare): read back what is durable, e.g. a backed-off row.
                read_job, read_outbox = await self.store.get_job_and_relay_row(job.id, outbox.id)
                job, outbox = read_job or job, read_outbox or outbox
        except StorageError as exc:
            # The job and its outbox row are committed: the relay delivers it. A 503
            # now would tell the client nothing was accepted.
            log.warning("dispatch_after_commit_failed", job_id=job.id, error=exc)
            if self.require_dispatch:
                raise DispatchFailed(job, outbox) from None
            return job, outbox
        if sent is None:
            # Not published: the row stays for the relay loop.
            if self.require_dispatch and outbox.status != "SENT":
                raise DispatchFailed(job, outbox)
            return job, outbox
        # The answer is what the batch committed (no read-back): the row SENT, and the
        # job, QUEUED at intake, RUNNING in the same transaction (the consumer may have
        # moved it further since; GET /v1/jobs/{id} shows that).
        if job.status == "QUEUED":
            job = replace(job, status="RUNNING", updated_at=sent.sent_at or job.updated_at)
        return job, sent

    async def cancel(self, job_id: str, by: str) -> tuple[JobRecord, CancelOutcome]:
        """Cancel a job (`by`: owner or admin); NotFound, or InvalidState once it finished
        otherwise. A job nobody runs is CANCELLED at once, one a worker runs is flagged."""
        return await self.store.cancel_job(job_id, self.clock(), by)

    async def get(self, job_id: str) -> tuple[JobRecord, RelayRow | None] | None:
        job = await self.store.get_job(job_id)
        if job is None:
            return None
        return job, await self.store.latest_relay_row_for_job(job_id)
