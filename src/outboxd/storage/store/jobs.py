"""Jobs (`ports.JobStore`): intake, alone or as one statement per group, runs and leases,
outcomes, redrive."""

from __future__ import annotations

from collections.abc import Generator, Mapping, Sequence
from typing import Any, Literal

from outboxd.errors import InvalidState, NotFound
from outboxd.storage.db import Op, TxBody, execute, fetch
from outboxd.storage.ports import (
    JobIntake,
    JobRecord,
    LoginFailure,
    NewPortalJob,
    Page,
    RelayRow,
)
from outboxd.storage.store.base import StoreBase
from outboxd.storage.store.records import dump, job_record, relay_record


class SqlJobs(StoreBase):
    async def create_portal_job(self, new: NewPortalJob, now: float) -> JobIntake:
        def body() -> Generator[Op, Any, JobIntake]:
            inserted = yield from self._one(
                "insert_job",
                {
                    "id": new.job_id,
                    "kind": "portal_link",
                    "portal": new.portal,
                    "user_id": new.user_id,
                    "idempotency_key": new.idempotency_key,
                    "fingerprint": new.fingerprint,
                    "key_id": new.key_id,
                    "sealed": new.sealed,
                    "now": now,
                },
            )
            if inserted is not None:
                outbox = yield from self._insert_relay(
                    new.outbox_id, "job", new.job_id, None, new.job_id, now, new.claimed_until
                )
                return JobIntake(job=job_record(inserted), outbox=outbox, created=True)
            row = yield from self._one(
                "select_job_by_key",
                {"user_id": new.user_id, "idempotency_key": new.idempotency_key},
            )
            if row is None:  # pragma: no cover - the conflict row cannot vanish in the tx
                raise NotFound("idempotency key row vanished")
            latest = yield from self._relay_row(row["id"])
            return JobIntake(job=job_record(row), outbox=latest, created=False)

        if self.group is None:
            return await self.db.run(body)
        return await self.group.run(body, (new, now))

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
                    "not_after": not_after,
                },
            )
            made: dict[str, JobIntake] = {}
            for r in rows:
                relay = {
                    k.removeprefix("relay_"): v for k, v in r.items() if k.startswith("relay_")
                }
                made[r["id"]] = JobIntake(
                    job=job_record(r), outbox=relay_record(relay), created=True
                )
            return [made.get(n.job_id) for n, _ in items]

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

    async def start_job_run(self, job_id: str, now: float, lease_s: float) -> JobRecord | None:
        return await self._record(
            "start_job_run", {"id": job_id, "now": now, "lease_until": now + lease_s}, job_record
        )

    async def extend_job_lease(self, job: JobRecord, lease_until: float) -> bool:
        return await self._changed(
            "extend_job_lease", {"id": job.id, "version": job.version, "lease_until": lease_until}
        )

    async def update_job_progress(
        self, job: JobRecord, progress: Mapping[str, Any], now: float
    ) -> bool:
        return await self._changed(
            "update_job_progress",
            {"id": job.id, "version": job.version, "progress": dump(progress), "now": now},
        )

    async def finish_job(
        self,
        job: JobRecord,
        status: Literal["SUCCEEDED", "FAILED"],
        now: float,
        result: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
        login_failure: LoginFailure | None = None,
    ) -> JobRecord | None:
        params = {
            "id": job.id,
            "version": job.version,
            "status": status,
            "result": dump(result),
            "error_code": error[0] if error else None,
            "error_message": error[1] if error else None,
            "now": now,
        }
        if login_failure is None:
            return await self._record("finish_job", params, job_record)

        def body() -> Generator[Op, Any, JobRecord | None]:
            row = yield from self._one("finish_job", params)
            if row is None:
                return None  # another holder's outcome: the failure is not ours to count
            subject = login_failure.subject
            yield execute(self.q["login_failure_insert"], {"subject": subject, "now": now})
            yield execute(
                self.q["login_failures_trim"],
                {"subject": subject, "before": login_failure.forget_before},
            )
            return job_record(row)

        return await self.db.run(body)

    async def job_quota(self, user_id: str, idempotency_key: str, limit: int) -> int | None:
        row = await self._record(
            "job_quota",
            {"user_id": user_id, "idempotency_key": idempotency_key, "limit": limit},
            dict,
            write=False,
        )
        assert row is not None
        return None if row["taken"] else int(row["active"])

    async def login_failures(self, subject: str, since: float, limit: int) -> list[float]:
        def body() -> Generator[Op, Any, list[float]]:
            rows = yield fetch(
                self.q["login_failures_recent"],
                {"subject": subject, "since": since, "limit": limit},
            )
            return [float(r["failed_at"]) for r in rows]

        return await self.db.read(body)

    async def job_retry_later(
        self, job: JobRecord, error: tuple[str, str], now: float
    ) -> JobRecord | None:
        return await self._record(
            "job_retry_later",
            {
                "id": job.id,
                "version": job.version,
                "error_code": error[0],
                "error_message": error[1],
                "now": now,
            },
            job_record,
        )

    async def release_job_lease(self, job: JobRecord, now: float) -> bool:
        return await self._changed(
            "release_job_lease", {"id": job.id, "version": job.version, "now": now}
        )

    async def mark_job_dead(
        self, job_id: str, error: tuple[str, str], now: float
    ) -> JobRecord | None:
        return await self._record(
            "job_dead",
            {"id": job_id, "error_code": error[0], "error_message": error[1], "now": now},
            job_record,
        )

    def _redrive(
        self, job_id: str, outbox_id: str, now: float
    ) -> Generator[Op, Any, JobRecord | NotFound | InvalidState]:
        """One job's redrive inside a transaction: the job (QUEUED again), or why not."""
        row = yield from self._one("redrive_job", {"id": job_id, "now": now})
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
        yield from self._insert_relay(outbox_id, "job", job_id, None, job_id, now)
        return job_record(row)

    async def redrive_job(self, job_id: str, outbox_id: str, now: float) -> JobRecord:
        def body() -> Generator[Op, Any, JobRecord]:
            outcome = yield from self._redrive(job_id, outbox_id, now)
            if isinstance(outcome, NotFound | InvalidState):
                raise outcome
            return outcome

        return await self.db.run(body)

    async def redrive_jobs(
        self, jobs: Sequence[tuple[str, str]], now: float
    ) -> list[JobRecord | NotFound | InvalidState]:
        """Several (job id, fresh outbox id) redriven in one transaction, each outcome in
        order: a job that cannot be redriven changes nothing and does not stop the others."""

        def body() -> Generator[Op, Any, list[JobRecord | NotFound | InvalidState]]:
            out: list[JobRecord | NotFound | InvalidState] = []
            for job_id, outbox_id in jobs:
                out.append((yield from self._redrive(job_id, outbox_id, now)))
            return out

        return await self.db.run(body) if jobs else []

    async def list_jobs(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[JobRecord]:
        return await self._page("list_jobs", {"status": status}, limit, cursor, job_record)
