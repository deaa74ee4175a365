"""Jobs (`ports.JobStore`): intake, alone or as one statement per group, runs and leases,
outcomes, redrive, cancel, and each job's timeline.

Every write that changes a job records its event in the same transaction (in the same
statement where the driver's `Features` say so): a job's timeline never disagrees with it.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Literal

from outboxd.errors import CapReached, InvalidState, NotFound, StorageUnavailable
from outboxd.storage.db import Op, TxBody, execute, fetch
from outboxd.storage.login_ports import LoginFailure
from outboxd.storage.ports import (
    CancelOutcome,
    JobEvent,
    JobFilter,
    JobIntake,
    JobRecord,
    NewEvent,
    NewPortalJob,
    Page,
    ProgressStep,
    RelayRow,
    redriven_event,
)
from outboxd.storage.store.base import JOBS_CAP, StoreBase
from outboxd.storage.store.logins import count_login_failure, forget_login
from outboxd.storage.store.records import (
    dump,
    inserted_job,
    inserted_relay_row,
    intake_relay_params,
    job_event_record,
    job_record,
    new_job_params,
    new_relay_params,
    relay_record,
)


def progress_events(steps: Sequence[ProgressStep]) -> list[NewEvent]:
    """A `progress` event per step, each at its own time."""
    return [NewEvent("progress", s.at, dict(s.progress)) for s in steps]


# How often a cancel looks at a job that others keep changing before it answers 503.
_CANCEL_LOOKS = 3


class SqlJobs(StoreBase):
    async def create_portal_job(
        self, new: NewPortalJob, now: float, max_active: int = 0
    ) -> JobIntake:
        def body() -> Generator[Op, Any, JobIntake | CapReached]:
            if max_active:
                # The count and the insert are one step: no other intake of this user
                # commits in between (docs/decisions/0030-per-user-bounds.md).
                yield from self._cap_lock(JOBS_CAP, new.user_id)
                quota = yield from self._one(
                    "job_quota",
                    {
                        "user_id": new.user_id,
                        "idempotency_key": new.idempotency_key,
                        "limit": max_active,
                    },
                )
                assert quota is not None
                if not quota["taken"] and quota["active"] >= max_active:
                    # Returned, not raised: nothing was written, and a member that raised
                    # would be rolled back and run again alone.
                    return CapReached(int(quota["active"]))
            params = new_job_params(new, now)
            if (yield from self._count("insert_job", params)):
                job = inserted_job(params)
                outbox = yield from self._insert_relay(intake_relay_params(new, now))
                yield execute(
                    self.q["insert_job_event"],
                    {
                        **self._event_params(NewEvent("accepted", now)),
                        "job_id": job.id,
                        "ev_status": job.status,
                        "ev_attempt": job.attempts,
                    },
                )
                return JobIntake(job=job, outbox=outbox, created=True)
            row = yield from self._one(
                "select_job_by_key",
                {"user_id": new.user_id, "idempotency_key": new.idempotency_key},
            )
            if row is None:  # pragma: no cover - the conflict row cannot vanish in the tx
                raise NotFound("idempotency key row vanished")
            latest = yield from self._relay_row(row["id"])
            return JobIntake(job=job_record(row), outbox=latest, created=False)

        if self.group is None:
            intake = await self.db.run(body)
        else:
            intake = await self.group.run(
                body, (new, now), order=new.user_id if max_active else None
            )
        if isinstance(intake, CapReached):
            raise intake
        if intake.created:  # nobody waits on this job yet; a held listing may
            self.changes.committed((intake.job.id,))
        return intake

    def _intake_bulk(self, items: Sequence[Any], now: float) -> TxBody[list[Any]]:
        """A group's intakes as one statement: per item its JobIntake, or None when its
        key was taken (the member then runs alone and replays). `now` is the time the
        statement is sent (its deadline counts from then)."""
        # In key order: two groups taking the same keys wait for each other, never in a cycle.
        news: list[tuple[NewPortalJob, float]] = sorted(
            items, key=lambda item: (item[0].user_id, item[0].idempotency_key)
        )

        # The statement commits on its own (run with one_statement=True): one arriving after the
        # caller's statement deadline must not write what the caller answered 503 for.
        not_after = now + self.db.statement_timeout_s

        def body() -> Generator[Op, Any, list[Any]]:
            rows = yield fetch(
                self.q["insert_jobs_many"],
                {
                    "ids": [n.job_id for n, _ in news],
                    "outbox_ids": [n.outbox_id for n, _ in news],
                    "portals": [n.portal for n, _ in news],
                    "user_ids": [n.user_id for n, _ in news],
                    "keys": [n.idempotency_key for n, _ in news],
                    "fingerprints": [n.fingerprint for n, _ in news],
                    "key_ids": [n.key_id for n, _ in news],
                    "sealed": [n.sealed for n, _ in news],
                    "nows": [at for _, at in news],
                    "claimed_untils": [n.claimed_until for n, _ in news],
                    "traceparents": [n.traceparent for n, _ in news],
                    "login_subjects": [n.login_subject for n, _ in news],
                    "not_after": not_after,
                    "ev_instance": self.instance,
                },
            )
            # The statement returns the ids it inserted; the rows are what it wrote.
            made = {r["id"] for r in rows}
            return [
                JobIntake(
                    job=inserted_job(new_job_params(n, at)),
                    outbox=inserted_relay_row(intake_relay_params(n, at)),
                    created=True,
                )
                if n.job_id in made
                else None
                for n, at in items
            ]

        return body

    async def get_job(self, job_id: str) -> JobRecord | None:
        return await self._record("select_job", {"id": job_id}, job_record, write=False)

    async def latest_relay_row_for_job(self, job_id: str) -> RelayRow | None:
        return await self.db.read(lambda: self._relay_row(job_id))

    async def get_job_and_relay_row(
        self, job_id: str, outbox_id: str
    ) -> tuple[JobRecord | None, RelayRow | None]:
        def body() -> Generator[Op, Any, tuple[JobRecord | None, RelayRow | None]]:
            job = yield from self._one("select_job", {"id": job_id})
            relay = yield from self._one("select_relay_row", {"id": outbox_id})
            return (job_record(job) if job else None), (relay_record(relay) if relay else None)

        return await self.db.read(body)

    async def start_job_run(
        self,
        job_id: str,
        now: float,
        lease_s: float,
        receive_count: int | None = None,
        outbox_id: str | None = None,
    ) -> JobRecord | None:
        detail = None if receive_count is None else {"receiveCount": receive_count}
        return await self._job_write(
            "start_job_run",
            {"id": job_id, "now": now, "lease_until": now + lease_s, "outbox_id": outbox_id},
            NewEvent("started", now, detail),
        )

    async def park_job(
        self, job: JobRecord, outbox_id: str, until: float, wait_for: Mapping[str, Any], now: float
    ) -> JobRecord | None:
        params = {
            "id": job.id,
            "version": job.version,
            "now": now,
            "wait_until": until,
            "wait_for": dump(wait_for),
            "wait_outbox_id": outbox_id,
        }
        detail = {**wait_for, "waitS": round(max(0.0, until - now), 3), "outboxId": outbox_id}

        def body() -> Generator[Op, Any, JobRecord | None]:
            row = yield from self._job_change("park_job", params, NewEvent("parked", now, detail))
            if row is None:
                return None
            # The message that starts the job again: published by the relay once due.
            yield from self._insert_relay(
                new_relay_params(
                    outbox_id,
                    "job",
                    job.id,
                    None,
                    job.id,
                    now,
                    traceparent=row["traceparent"],
                    due_at=until,
                )
            )
            return job_record(row)

        parked = await self.db.run(body)
        if parked is not None:
            self.changes.committed((parked.id,))
        return parked

    async def extend_job_lease(self, job: JobRecord, lease_until: float) -> bool:
        return await self._changed(
            "extend_job_lease", {"id": job.id, "version": job.version, "lease_until": lease_until}
        )

    async def update_job_progress(
        self,
        job: JobRecord,
        progress: Mapping[str, Any],
        now: float,
        held: Sequence[ProgressStep] = (),
    ) -> JobRecord | None:
        return await self._job_write(
            "update_job_progress",
            {"id": job.id, "version": job.version, "progress": dump(progress), "now": now},
            NewEvent("progress", now, dict(progress)),
            progress_events(held),
        )

    async def finish_job(
        self,
        job: JobRecord,
        status: Literal["SUCCEEDED", "FAILED"],
        now: float,
        result: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
        login_failure: LoginFailure | None = None,
        login_success: str | None = None,
        locked_until: float | None = None,
        progress: Sequence[ProgressStep] = (),
    ) -> JobRecord | None:
        params = {
            "id": job.id,
            "version": job.version,
            "status": status,
            "result": dump(result),
            "error_code": error[0] if error else None,
            "error_message": error[1] if error else None,
            "now": now,
            "locked_until": locked_until,
            # The run's last step, when it held some: the progress the job ends with.
            "progress": dump(progress[-1].progress) if progress else None,
        }
        event = (
            NewEvent("succeeded", now)
            if status == "SUCCEEDED"
            else NewEvent("failed", now, {"code": error[0] if error else None})
        )
        held = progress_events(progress)
        if login_failure is None and login_success is None:
            return await self._job_write("finish_job", params, event, held)

        def body() -> Generator[Op, Any, JobRecord | None]:
            row = yield from self._job_change("finish_job", params, event, held)
            if row is None:
                return None  # another holder's outcome: the login is not ours to count
            if login_success is not None:
                yield from forget_login(self.q, login_success)
            if login_failure is not None:
                yield from count_login_failure(self.q, login_failure, job, now)
            return job_record(row)

        done = await self.db.run(body)
        if done is not None:
            self.changes.committed((done.id,))
        return done

    async def job_retry_later(
        self, job: JobRecord, error: tuple[str, str], now: float, delay_s: float | None = None
    ) -> JobRecord | None:
        return await self._job_write(
            "job_retry_later",
            {
                "id": job.id,
                "version": job.version,
                "error_code": error[0],
                "error_message": error[1],
                "now": now,
            },
            NewEvent("retry_scheduled", now, {"code": error[0], "delayS": delay_s}),
        )

    async def release_job_lease(self, job: JobRecord, now: float) -> bool:
        released = await self._job_write(
            "release_job_lease",
            {"id": job.id, "version": job.version, "now": now},
            NewEvent("released", now),
        )
        return released is not None

    async def mark_job_dead(
        self, job_id: str, error: tuple[str, str], now: float
    ) -> JobRecord | None:
        return await self._job_write(
            "job_dead",
            {"id": job_id, "error_code": error[0], "error_message": error[1], "now": now},
            NewEvent("dead", now, {"code": error[0]}),
        )

    def _redrive(
        self, job_id: str, outbox_id: str, now: float, by: str | None
    ) -> Generator[Op, Any, JobRecord | NotFound | InvalidState]:
        """One job's redrive inside a transaction: the job (QUEUED again), or why not."""
        row = yield from self._job_change(
            "redrive_job", {"id": job_id, "now": now}, redriven_event(now, outbox_id, by)
        )
        if row is None:
            current = yield from self._one("select_job", {"id": job_id})
            if current is None:
                return NotFound(f"job {job_id}")
            if current["status"] == "DEAD":
                return InvalidState("the job's credentials were erased; it cannot be redriven")
            return InvalidState(f"job is {current['status']}, not DEAD")
        # The job's DEAD outbox rows are answered by this redrive: they become SUPERSEDED
        # (history, not dead letters), and the fresh row carries the retry.
        yield execute(self.q["relay_supersede_dead"], {"job_id": job_id})
        yield from self._insert_relay(
            new_relay_params(
                outbox_id, "job", job_id, None, job_id, now, traceparent=row["traceparent"]
            )
        )
        return job_record(row)

    async def redrive_job(
        self, job_id: str, outbox_id: str, now: float, by: str | None = None
    ) -> JobRecord:
        def body() -> Generator[Op, Any, JobRecord]:
            outcome = yield from self._redrive(job_id, outbox_id, now, by)
            if isinstance(outcome, NotFound | InvalidState):
                raise outcome
            return outcome

        job = await self.db.run(body)
        self.changes.committed((job.id,))
        return job

    async def cancel_job(self, job_id: str, now: float, by: str) -> tuple[JobRecord, CancelOutcome]:
        def body() -> Generator[Op, Any, tuple[JobRecord, CancelOutcome]]:
            # Each statement reads afresh: a job changed by someone else between the look
            # and the guarded update (a redrive's fresh outbox row, a worker's start) is
            # looked at again, so the rows deleted are those of the job as cancelled.
            for _ in range(_CANCEL_LOOKS):
                current = yield from self._one("select_job", {"id": job_id})
                if current is None:
                    raise NotFound(f"job {job_id}")
                job = job_record(current)
                seen = {"id": job_id, "now": now, "version": job.version}
                # The outbox rows first, then the job: the relay's SENT marks lock them in
                # that order.
                yield execute(self.q["delete_unsent_relay_if_cancellable"], seen)
                row = yield from self._job_change(
                    "job_cancel_now", seen, NewEvent("cancelled", now, {"by": by})
                )
                if row is not None:
                    return job_record(row), "cancelled"
                row = yield from self._job_change(
                    "job_cancel_request", seen, NewEvent("cancel_requested", now, {"by": by})
                )
                if row is not None:
                    return job_record(row), "requested"
                current = yield from self._one("select_job", {"id": job_id})
                if current is None:
                    raise NotFound(f"job {job_id}")
                job = job_record(current)
                if job.status == "CANCELLED" or (job.status == "RUNNING" and job.cancel_requested):
                    return job, "unchanged"
                if job.terminal:
                    raise InvalidState(f"job is {job.status}: it cannot be cancelled")
            raise StorageUnavailable("the job kept changing while it was being cancelled")

        job, outcome = await self.db.run(body)
        if outcome != "unchanged":
            self.changes.committed((job.id,))
        return job, outcome

    async def finish_cancelled(self, job: JobRecord, now: float) -> JobRecord | None:
        return await self._job_write(
            "job_cancelled_by_worker",
            {"id": job.id, "version": job.version, "now": now},
            NewEvent("cancelled", now, {"by": "consumer"}),
        )

    async def job_events(self, job_id: str, after: int = 0, limit: int = 1000) -> list[JobEvent]:
        def body() -> Generator[Op, Any, list[JobEvent]]:
            rows = yield fetch(
                self.q["select_job_events"], {"job_id": job_id, "after": after, "limit": limit}
            )
            return [job_event_record(r) for r in rows]

        return await self.db.read(body)

    async def newest_job_event(self) -> int | None:
        def body() -> Generator[Op, Any, int | None]:
            rows = yield fetch(self.q["job_events_newest"], {})
            seq = rows[0]["seq"] if rows else None
            return None if seq is None else int(seq)

        return await self.db.read(body)

    async def job_event_marks(self, job_ids: Sequence[str]) -> dict[str, int]:
        if not job_ids:
            return {}
        ids = json.dumps(list(job_ids))

        def body() -> Generator[Op, Any, dict[str, int]]:
            rows = yield fetch(self.q["job_event_marks"], {"ids": ids})
            return {r["job_id"]: int(r["seq"]) for r in rows}

        return await self.db.read(body)

    async def redrive_jobs(
        self, jobs: Sequence[tuple[str, str]], now: float, by: str | None = None
    ) -> list[JobRecord | NotFound | InvalidState]:
        """Several (job id, fresh outbox id) redriven in one transaction, each outcome in
        order: a job that cannot be redriven changes nothing and does not stop the others."""

        def body() -> Generator[Op, Any, list[JobRecord | NotFound | InvalidState]]:
            out: list[JobRecord | NotFound | InvalidState] = []
            for job_id, outbox_id in jobs:
                out.append((yield from self._redrive(job_id, outbox_id, now, by)))
            return out

        if not jobs:
            return []
        outcomes = await self.db.run(body)
        self.changes.committed(o.id for o in outcomes if isinstance(o, JobRecord))
        return outcomes

    async def list_jobs(
        self, status: str | None, limit: int, cursor: str | None, where: JobFilter | None = None
    ) -> Page[JobRecord]:
        f = where or JobFilter()
        params = {
            "status": status if status is not None else f.status,
            "user_id": f.user_id,
            "error_code": f.error_code,
            "created_from": f.created_from,
            "created_to": f.created_to,
        }
        if f.login_subject is not None:
            # Its own statement, an equality on the key: the index on it serves every plan.
            params["login_subject"] = f.login_subject
            return await self._page("list_jobs_by_subject", params, limit, cursor, job_record)
        return await self._page("list_jobs", params, limit, cursor, job_record)
