"""`SqlStore`: every storage Protocol, on either database driver.

The logic of each transaction is written once; the SQL it runs comes from the
named blocks of `sql/common.sql`, with per-backend overrides where the dialects
differ (claims: `FOR UPDATE SKIP LOCKED` on Postgres, `BEGIN IMMEDIATE` on SQLite).
Where a write is best done differently, the driver's `Features` say how; the store
never asks which backend it runs on.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Literal, TypeVar

from outboxd.errors import InvalidState, NotFound
from outboxd.storage import ports
from outboxd.storage.db import (
    Database,
    Op,
    Row,
    TxBody,
    execute,
    execute_each,
    fetch,
    load_queries,
    sqlite_path,
)
from outboxd.storage.group import GroupCommitter
from outboxd.storage.ports import (
    JobIntake,
    JobRecord,
    NewPortalJob,
    PaceLease,
    PaceSlot,
    PaceState,
    Page,
    RelayFailure,
    RelayRow,
    StatusCount,
    TaskRun,
    Website,
    WorkRow,
    decode_cursor,
    encode_cursor,
)
from outboxd.storage.postgres import PostgresDatabase
from outboxd.storage.sqlite import SqliteDatabase

T = TypeVar("T")


def _json_or_none(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def _dump(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _job(r: Row) -> JobRecord:
    sealed = r["sealed"]
    return JobRecord(
        id=r["id"],
        kind=r["kind"],
        portal=r["portal"],
        user_id=r["user_id"],
        idempotency_key=r["idempotency_key"],
        fingerprint=r["fingerprint"],
        status=r["status"],
        attempts=int(r["attempts"]),
        key_id=r["key_id"],
        sealed=bytes(sealed) if sealed is not None else None,
        lease_until=r["lease_until"],
        progress=_json_or_none(r["progress"]),
        error_code=r["error_code"],
        error_message=r["error_message"],
        result=_json_or_none(r["result"]),
        created_at=float(r["created_at"]),
        updated_at=float(r["updated_at"]),
        finished_at=r["finished_at"],
        version=int(r["version"]),
    )


def _relay(r: Row) -> RelayRow:
    return RelayRow(
        id=r["id"],
        kind=r["kind"],
        job_id=r["job_id"],
        task_id=r["task_id"],
        status=r["status"],
        attempt_count=int(r["attempt_count"]),
        next_attempt_at=float(r["next_attempt_at"]),
        last_error=r["last_error"],
        queue_message_id=r["queue_message_id"],
        dedup_id=r["dedup_id"],
        created_at=float(r["created_at"]),
        sent_at=r["sent_at"],
        claimed_until=r["claimed_until"],
        version=int(r["version"]),
    )


def _task(r: Row) -> TaskRun:
    return TaskRun(
        id=r["id"],
        type=r["type"],
        payload=_json_or_none(r["payload"]) or {},
        dedup_id=r["dedup_id"],
        status=r["status"],
        error=r["error"],
        enqueued_at=float(r["enqueued_at"]),
        finished_at=r["finished_at"],
        version=int(r["version"]),
    )


def _website(r: Row) -> Website:
    return Website(
        id=r["id"],
        domain=r["domain"],
        favicon_url=r["favicon_url"],
        category=r["category"],
        created_at=float(r["created_at"]),
        work_status=r.get("work_status"),
        work_attempts=int(r.get("work_attempts") or 0),
        work_last_error=r.get("work_last_error"),
    )


def _work(r: Row) -> WorkRow:
    return WorkRow(
        id=r["id"],
        website_id=r["website_id"],
        status=r["status"],
        attempt_count=int(r["attempt_count"]),
        attempted_at=r["attempted_at"],
        last_error=r["last_error"],
        created_at=float(r["created_at"]),
        version=int(r["version"]),
    )


def _pace_state(r: Row) -> PaceState:
    last = r["last_at"]
    return PaceState(
        name=r["name"],
        last_at=float(last) if last is not None else None,
        next_at=float(r["next_at"]),
        paused_until=float(r["paused_until"]),
        now=float(r["now"]),
        sessions=int(r.get("sessions") or 0),
    )


class SqlStore:
    """Every storage port. Each method is one transaction body (see `db.TxBody`),
    so SQLite runs it in one thread hop and Postgres on one connection."""

    def __init__(
        self, db: Database, group_commit: bool = True, patience_s: float | None = None
    ) -> None:
        self.db = db
        self.q = load_queries(db.backend)
        # Intake and registration: concurrent calls share one commit (see storage/group.py).
        # Where the driver can, an intake group is first tried as one statement.
        bulk = self._intake_bulk if db.features.intake_in_one_statement else None
        self.group = GroupCommitter(db, bulk=bulk, patience_s=patience_s) if group_commit else None
        self.website_group = GroupCommitter(db, patience_s=patience_s) if group_commit else None

    @property
    def backend(self) -> str:
        return self.db.backend

    async def close(self) -> None:
        for group in (self.group, self.website_group):
            if group is not None:
                await group.drain()
        await self.db.close()

    # ------------------------------------------------------------ shared steps

    def _one(self, name: str, params: Mapping[str, Any]) -> Generator[Op, Any, Row | None]:
        rows = yield fetch(self.q[name], params)
        return rows[0] if rows else None

    def _count(self, name: str, params: Mapping[str, Any]) -> Generator[Op, Any, int]:
        n: int = yield execute(self.q[name], params)
        return n

    def _relay_row(self, job_id: str) -> Generator[Op, Any, RelayRow | None]:
        row = yield from self._one("select_latest_relay_for_job", {"job_id": job_id})
        return _relay(row) if row else None

    def _insert_relay(
        self,
        outbox_id: str,
        kind: str,
        job_id: str | None,
        task_id: str | None,
        dedup_id: str,
        now: float,
        claimed_until: float | None = None,
    ) -> Generator[Op, Any, RelayRow]:
        row = yield from self._one(
            "insert_relay_row",
            {
                "id": outbox_id,
                "kind": kind,
                "job_id": job_id,
                "task_id": task_id,
                "dedup_id": dedup_id,
                "now": now,
                "claimed_until": claimed_until,
                "attempt_count": 0 if claimed_until is None else 1,
            },
        )
        assert row is not None
        return _relay(row)

    async def _record(
        self,
        name: str,
        params: Mapping[str, Any],
        record: Callable[[Row], T],
        write: bool = True,
    ) -> T | None:
        """The one row block `name` returns, as a record (None without a row): a write
        transaction, or a plain read with `write=False`."""

        def body() -> Generator[Op, Any, T | None]:
            row = yield from self._one(name, params)
            return record(row) if row else None

        return await (self.db.run(body) if write else self.db.read(body))

    async def _changed(self, name: str, params: Mapping[str, Any]) -> bool:
        def body() -> Generator[Op, Any, bool]:
            n = yield from self._count(name, params)
            return n == 1

        return await self.db.run(body)

    # ------------------------------------------------------------ jobs

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
                return JobIntake(job=_job(inserted), outbox=outbox, created=True)
            row = yield from self._one(
                "select_job_by_key",
                {"user_id": new.user_id, "idempotency_key": new.idempotency_key},
            )
            if row is None:  # pragma: no cover - the conflict row cannot vanish in the tx
                raise NotFound("idempotency key row vanished")
            latest = yield from self._relay_row(row["id"])
            return JobIntake(job=_job(row), outbox=latest, created=False)

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
                made[r["id"]] = JobIntake(job=_job(r), outbox=_relay(relay), created=True)
            return [made.get(n.job_id) for n, _ in items]

        return body

    async def get_job(self, job_id: str) -> JobRecord | None:
        return await self._record("select_job", {"id": job_id}, _job, write=False)

    async def latest_relay_row_for_job(self, job_id: str) -> RelayRow | None:
        return await self.db.read(lambda: self._relay_row(job_id))

    async def get_job_and_relay_row(
        self, job_id: str, outbox_id: str
    ) -> tuple[JobRecord | None, RelayRow | None]:
        def body() -> Generator[Op, Any, tuple[JobRecord | None, RelayRow | None]]:
            job = yield from self._one("select_job", {"id": job_id})
            relay = yield from self._one("select_relay_row", {"id": outbox_id})
            return (_job(job) if job else None), (_relay(relay) if relay else None)

        return await self.db.read(body)

    async def start_job_run(self, job_id: str, now: float, lease_s: float) -> JobRecord | None:
        return await self._record(
            "start_job_run", {"id": job_id, "now": now, "lease_until": now + lease_s}, _job
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
            {"id": job.id, "version": job.version, "progress": _dump(progress), "now": now},
        )

    async def finish_job(
        self,
        job: JobRecord,
        status: Literal["SUCCEEDED", "FAILED"],
        now: float,
        result: Mapping[str, Any] | None = None,
        error: tuple[str, str] | None = None,
    ) -> JobRecord | None:
        return await self._record(
            "finish_job",
            {
                "id": job.id,
                "version": job.version,
                "status": status,
                "result": _dump(result),
                "error_code": error[0] if error else None,
                "error_message": error[1] if error else None,
                "now": now,
            },
            _job,
        )

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
            _job,
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
            _job,
        )

    async def redrive_job(self, job_id: str, outbox_id: str, now: float) -> JobRecord:
        def body() -> Generator[Op, Any, JobRecord]:
            row = yield from self._one("redrive_job", {"id": job_id, "now": now})
            if row is None:
                current = yield from self._one("select_job", {"id": job_id})
                if current is None:
                    raise NotFound(f"job {job_id}")
                if current["status"] == "DEAD":
                    raise InvalidState("the job's credentials were erased; it cannot be redriven")
                raise InvalidState(f"job is {current['status']}, not DEAD")
            # Any DEAD outbox row of the job stays as history; the fresh row
            # carries the retry.
            yield from self._insert_relay(outbox_id, "job", job_id, None, job_id, now)
            return _job(row)

        return await self.db.run(body)

    # ------------------------------------------------------------ relay

    async def claim_relay_due(self, now: float, limit: int, lease_s: float) -> list[RelayRow]:
        return await self.db.run(
            lambda: self._claim_relay_due(now, limit, lease_s), one_statement=True
        )

    def _claim_relay_due(
        self, now: float, limit: int, lease_s: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        rows = yield fetch(
            self.q["claim_relay_due"],
            {"now": now, "limit": limit, "claimed_until": now + lease_s},
        )
        return sorted((_relay(r) for r in rows), key=lambda r: r.next_attempt_at)

    async def claim_relay_row(self, outbox_id: str, now: float, lease_s: float) -> RelayRow | None:
        return await self._record(
            "claim_relay_one", {"id": outbox_id, "now": now, "claimed_until": now + lease_s}, _relay
        )

    async def claim_relay_rows(
        self, outbox_ids: Sequence[str], now: float, lease_s: float
    ) -> list[RelayRow]:
        if not outbox_ids:
            return []
        ids = json.dumps(sorted(set(outbox_ids)))

        def body() -> Generator[Op, Any, list[RelayRow]]:
            rows = yield fetch(
                self.q["claim_relay_many"], {"ids": ids, "now": now, "claimed_until": now + lease_s}
            )
            return [_relay(r) for r in rows]

        return await self.db.run(body)

    async def mark_relay_sent(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> list[RelayRow]:
        if not sent:
            return []
        return await self.db.run(lambda: self._relay_sent(sent, now))

    async def mark_relay_failed(self, failures: Sequence[RelayFailure], now: float) -> None:
        if failures:
            await self.db.run(lambda: self._relay_failed(failures, now))

    async def record_relay_outcome(
        self, sent: Sequence[tuple[RelayRow, str]], failures: Sequence[RelayFailure], now: float
    ) -> list[RelayRow]:
        if not sent and not failures:
            return []

        def body() -> Generator[Op, Any, list[RelayRow]]:
            return (yield from self._relay_outcome(sent, failures, now))

        if self.db.features.sent_in_one_statement and not failures:
            # One statement (`relay_sent_many`: the rows SENT, their jobs RUNNING, their
            # tasks SENT), atomic on its own: one round trip, no BEGIN or COMMIT. It is
            # cheaper than the relay loop's round statement with nothing to claim (2.5-2.9
            # against 3.3-4.1 ms for eight rows, on 2 cores).
            return await self.db.run(body, one_statement=True)

        if self.group is not None and self.db.features.outcomes_share_commits:
            # A dispatch batch's outcome shares the next intake group's commit with the
            # intakes waiting for it, when writes are in flight (otherwise it runs at once,
            # alone): a commit is an fsync. Safe to rerun: a row SENT by a first run fails
            # the version match and is left alone.
            return await self.group.run(body)
        return await self.db.run(body)

    def _relay_outcome(
        self, sent: Sequence[tuple[RelayRow, str]], failures: Sequence[RelayFailure], now: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        done = (yield from self._relay_sent(sent, now)) if sent else []
        if failures:
            yield from self._relay_failed(failures, now)
        return done

    async def record_relay_outcome_and_claim_due(
        self,
        sent: Sequence[tuple[RelayRow, str]],
        failures: Sequence[RelayFailure],
        now: float,
        limit: int,
        lease_s: float,
    ) -> tuple[list[RelayRow], list[RelayRow]]:
        one_statement = self.db.features.sent_in_one_statement and not failures

        def body() -> Generator[Op, Any, tuple[list[RelayRow], list[RelayRow]]]:
            if one_statement:
                return (yield from self._relay_sent_and_claim_due(sent, now, limit, lease_s))
            done = yield from self._relay_outcome(sent, failures, now)
            claimed = (yield from self._claim_relay_due(now, limit, lease_s)) if limit > 0 else []
            return done, claimed

        if not sent and not failures and limit <= 0:
            return [], []
        return await self.db.run(body, one_statement=one_statement)

    def _relay_sent_and_claim_due(
        self, sent: Sequence[tuple[RelayRow, str]], now: float, limit: int, lease_s: float
    ) -> Generator[Op, Any, tuple[list[RelayRow], list[RelayRow]]]:
        """`sent_in_one_statement`: a round's SENT, its jobs RUNNING and the next claim as
        one statement (a round with failures takes the general path: they are rare, and
        each is a guarded update of its own)."""
        rows = yield fetch(
            self.q["relay_sent_and_claim_due"],
            {
                **self._sent_params(sent, now),
                "limit": max(limit, 0),
                "claimed_until": now + lease_s,
            },
        )
        done: list[RelayRow] = []
        claimed: list[RelayRow] = []
        for r in rows:
            (done if r.pop("sent") else claimed).append(_relay(r))
        claimed.sort(key=lambda r: r.next_attempt_at)
        return done, claimed

    @staticmethod
    def _sent_params(sent: Sequence[tuple[RelayRow, str]], now: float) -> dict[str, Any]:
        """`sent_in_one_statement`: the rows to mark SENT, each with its claimed version and
        its MessageId, as parallel arrays (`id = ANY(:ids)`, planned as primary-key
        lookups). Otherwise they are marked one by one (`_relay_sent_each`)."""
        return {
            "ids": [r.id for r, _ in sent],
            "versions": [r.version for r, _ in sent],
            "message_ids": [m for _, m in sent],
            "now": now,
        }

    def _relay_sent(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        # Rows a newer holder (or a redrive) owns now fail the version match
        # and are left alone.
        if self.db.features.sent_in_one_statement:
            rows = yield fetch(self.q["relay_sent_many"], self._sent_params(sent, now))
            # The same statement set the jobs RUNNING and the tasks SENT.
            return [_relay(r) for r in rows]
        done = yield from self._relay_sent_each(sent, now)
        job_ids = [r.job_id for r in done if r.job_id is not None]
        task_ids = [r.task_id for r in done if r.task_id is not None]
        if job_ids:
            yield execute(
                self.q["jobs_running_if_queued"], {"ids": json.dumps(job_ids), "now": now}
            )
        if task_ids:
            yield execute(self.q["tasks_sent"], {"ids": json.dumps(task_ids)})
        return done

    def _relay_sent_each(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        """Each row SENT by its own execution of one statement. The rows as committed are
        the claimed ones with what the update set (every update of the outbox moves
        `version`, so a row the guard let through had not changed since its claim). Only
        when the guard refused some are the rows read back, to tell which."""
        changed = yield execute_each(
            self.q["relay_sent_one"],
            [{"id": r.id, "v": r.version, "m": m, "now": now} for r, m in sent],
        )
        marked = [
            replace(
                r,
                status="SENT",
                queue_message_id=m,
                sent_at=now,
                claimed_until=None,
                last_error=None,
                version=r.version + 1,
            )
            for r, m in sent
        ]
        if changed == len(marked):
            return marked
        done = []
        for r in marked:
            row = yield from self._one("select_relay_row", {"id": r.id})
            if row is not None and (row["status"], row["version"], row["queue_message_id"]) == (
                "SENT",
                r.version,
                r.queue_message_id,
            ):
                done.append(r)
        return done

    def _relay_failed(
        self, failures: Sequence[RelayFailure], now: float
    ) -> Generator[Op, Any, None]:
        for f in failures:
            updated = yield from self._one(
                "relay_failed",
                {
                    "id": f.row.id,
                    "version": f.row.version,
                    "status": "DEAD" if f.dead else "RETRYABLE_FAILED",
                    "next_attempt_at": f.next_attempt_at,
                    "last_error": f.error[:1000],
                },
            )
            if updated is None or not f.dead:
                continue
            if f.row.job_id is not None and f.job_error is not None:
                code, message = f.job_error
                yield execute(
                    self.q["job_dead"],
                    {
                        "id": f.row.job_id,
                        "error_code": code,
                        "error_message": message,
                        "now": now,
                    },
                )
            elif f.row.task_id is not None:
                yield execute(
                    self.q["task_dead"],
                    {"id": f.row.task_id, "error": f.error[:1000], "now": now},
                )

    async def get_relay_row(self, outbox_id: str) -> RelayRow | None:
        return await self._record("select_relay_row", {"id": outbox_id}, _relay, write=False)

    async def redrive_relay_row(self, outbox_id: str, now: float) -> RelayRow:
        def body() -> Generator[Op, Any, RelayRow]:
            before = yield from self._one("select_relay_row", {"id": outbox_id})
            if before is None:
                raise NotFound(f"outbox row {outbox_id}")
            if before["job_id"] is not None:
                latest = yield from self._relay_row(before["job_id"])
                if latest is not None and latest.id != outbox_id:
                    # The job was redriven whole since: reviving this row too
                    # would publish the job twice.
                    raise InvalidState("the job has a newer outbox row; redrive the job instead")
            row = yield from self._one("relay_redrive", {"id": outbox_id, "now": now})
            if row is None:
                raise InvalidState(f"outbox row is {before['status']}, not DEAD")
            relay = _relay(row)
            if relay.job_id is not None:
                yield execute(self.q["job_requeue_if_dead"], {"id": relay.job_id, "now": now})
            elif relay.task_id is not None:
                yield execute(self.q["task_requeue"], {"id": relay.task_id})
            return relay

        return await self.db.run(body)

    async def list_relay_rows(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[RelayRow]:
        # A status other than SENT is read from the index of the rows not sent.
        name = "list_relay" if status in (None, "SENT") else "list_relay_unsent"
        return await self._page(name, {"status": status}, limit, cursor, _relay)

    async def relay_rows_for_job(self, job_id: str, limit: int) -> list[RelayRow]:
        def body() -> Generator[Op, Any, list[RelayRow]]:
            rows = yield fetch(self.q["list_relay_for_job"], {"job_id": job_id, "limit": limit})
            return [_relay(r) for r in rows]

        return await self.db.read(body)

    async def list_jobs(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[JobRecord]:
        return await self._page("list_jobs", {"status": status}, limit, cursor, _job)

    async def _page(
        self,
        name: str,
        params: Mapping[str, Any],
        limit: int,
        cursor: str | None,
        record: Callable[[Row], T],
        order_column: str = "created_at",
    ) -> Page[T]:
        """One page of a keyset query over (`order_column`, id); the query reads one row
        more than `limit`, which tells whether another page follows."""
        created, row_id = decode_cursor(cursor)
        bound = {**params, "cursor_created": created, "cursor_id": row_id, "limit": limit + 1}

        def body() -> Generator[Op, Any, list[Row]]:
            rows: list[Row] = yield fetch(self.q[name], bound)
            return rows

        rows = await self.db.read(body)
        last = rows[limit - 1] if len(rows) > limit else None
        nxt = encode_cursor(float(last[order_column]), last["id"]) if last is not None else None
        return Page(items=[record(r) for r in rows[:limit]], next_cursor=nxt)

    # ------------------------------------------------------------ tasks

    async def enqueue_task(
        self,
        task_id: str,
        outbox_id: str,
        type_: str,
        payload: Mapping[str, Any],
        dedup_id: str,
        now: float,
    ) -> tuple[TaskRun, bool]:
        def body() -> Generator[Op, Any, tuple[TaskRun, bool]]:
            inserted = yield from self._one(
                "insert_task_run",
                {
                    "id": task_id,
                    "type": type_,
                    "payload": _dump(payload),
                    "dedup_id": dedup_id,
                    "now": now,
                },
            )
            if inserted is not None:
                yield from self._insert_relay(outbox_id, "task", None, task_id, dedup_id, now)
            row = yield from self._one("select_task_by_dedup", {"dedup_id": dedup_id})
            assert row is not None
            return _task(row), inserted is not None

        return await self.db.run(body)

    async def get_task(self, task_id: str) -> TaskRun | None:
        return await self._record("select_task", {"id": task_id}, _task, write=False)

    async def finish_task(
        self, task_id: str, status: Literal["SUCCEEDED", "FAILED"], error: str | None, now: float
    ) -> TaskRun | None:
        return await self._record(
            "finish_task", {"id": task_id, "status": status, "error": error, "now": now}, _task
        )

    async def list_tasks(self, type_: str | None, limit: int, cursor: str | None) -> Page[TaskRun]:
        return await self._page(
            "list_tasks", {"type": type_}, limit, cursor, _task, order_column="enqueued_at"
        )

    # ------------------------------------------------------------ websites

    async def register_website(
        self, website_id: str, work_id: str, domain: str, favicon_url: str | None, now: float
    ) -> tuple[Website, bool]:
        def body() -> Generator[Op, Any, tuple[Website, bool]]:
            inserted = yield from self._one(
                "insert_website",
                {"id": website_id, "domain": domain, "favicon_url": favicon_url, "now": now},
            )
            if inserted is not None:
                yield execute(
                    self.q["insert_work_row"], {"id": work_id, "website_id": website_id, "now": now}
                )
            row = yield from self._one("select_website_by_domain", {"domain": domain})
            assert row is not None
            return _website(row), inserted is not None

        if self.website_group is None:
            return await self.db.run(body)
        return await self.website_group.run(body)

    async def get_website(self, domain: str) -> Website | None:
        return await self._record(
            "select_website_by_domain", {"domain": domain}, _website, write=False
        )

    async def website_by_id(self, website_id: str) -> Website | None:
        return await self._record("select_website", {"id": website_id}, _website, write=False)

    async def claim_work(
        self, now: float, retry_delay_s: float, processing_timeout_s: float
    ) -> WorkRow | None:
        params = {
            "now": now,
            "retry_before": now - retry_delay_s,
            "stale_before": now - processing_timeout_s,
        }

        def body() -> Generator[Op, Any, WorkRow | None]:
            # Three scans in priority order, each one small partial index:
            # never tried, then retries that waited long enough, then rows
            # whose holder died.
            for name in ("claim_work_fresh", "claim_work_retry", "claim_work_stale"):
                row = yield from self._one(name, params)
                if row is not None:
                    return _work(row)
            return None

        return await self.db.run(body)

    async def complete_work(self, row: WorkRow, category: str | None, now: float) -> bool:
        def body() -> Generator[Op, Any, bool]:
            n = yield from self._count("work_completed", {"id": row.id, "version": row.version})
            if n != 1:
                return False  # a newer holder owns the row: its result will win
            if category is not None:
                yield execute(
                    self.q["set_website_category"],
                    {"id": row.website_id, "category": category, "now": now},
                )
            return True

        return await self.db.run(body)

    async def fail_work(self, row: WorkRow, error: str, final: bool, now: float) -> bool:
        return await self._changed(
            "work_failed",
            {
                "id": row.id,
                "version": row.version,
                "status": "FAILED" if final else "PENDING",
                "last_error": error[:1000],
                "now": now,
            },
        )

    async def give_back_work(self, row: WorkRow) -> bool:
        return await self._changed("work_give_back", {"id": row.id, "version": row.version})

    async def list_websites(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[Website]:
        return await self._page("list_websites", {"status": status}, limit, cursor, _website)

    async def retry_failed_website(self, domain: str) -> Website:
        def body() -> Generator[Op, Any, Website]:
            before = yield from self._one("select_website_by_domain", {"domain": domain})
            if before is None:
                raise NotFound(f"no website {domain}")
            n = yield from self._count("work_retry_failed", {"website_id": before["id"]})
            if n != 1:
                raise InvalidState(
                    f"classification is {before['work_status'] or 'missing'}, not FAILED"
                )
            row = yield from self._one("select_website_by_domain", {"domain": domain})
            assert row is not None
            return _website(row)

        return await self.db.run(body)

    # ------------------------------------------------------------ stats and pruning

    async def status_counts(self) -> list[StatusCount]:
        def body() -> Generator[Op, Any, list[StatusCount]]:
            out: list[StatusCount] = []
            for table, qname in (
                ("jobs", "count_jobs"),
                ("relay_outbox", "count_relay"),
                ("work_outbox", "count_work"),
                ("task_runs", "count_tasks"),
            ):
                rows = yield fetch(self.q[qname], {})
                for r in rows:
                    oldest = r["oldest"]
                    out.append(
                        StatusCount(
                            table,
                            r["status"],
                            int(r["n"]),
                            float(oldest) if oldest is not None else None,
                        )
                    )
            return out

        return await self.db.read(body)

    async def pace_states(self, now: float) -> list[PaceState]:
        def body() -> Generator[Op, Any, list[PaceState]]:
            rows = yield fetch(self.q["pace_all"], {"now": now})
            return [_pace_state(r) for r in rows]

        return await self.db.read(body)

    # ------------------------------------------------------------ cluster pacing
    # `now` is the caller's clock, used on SQLite (one host: its clock); the Postgres
    # blocks ignore it and read clock_timestamp() instead.

    async def pace_ensure(self, name: str, lease_slots: int = 0) -> None:
        def body() -> Generator[Op, Any, None]:
            yield execute(self.q["pace_ensure"], {"name": name})
            for slot in range(lease_slots):
                yield execute(self.q["lease_ensure"], {"name": name, "slot": slot})

        await self.db.run(body)

    async def pace_take(self, name: str, delay_s: float, now: float) -> PaceSlot:
        def body() -> Generator[Op, Any, PaceSlot]:
            params = {"name": name, "delay": float(delay_s), "now": now}
            row = yield from self._one("pace_take", params)
            if row is None:  # first use on a database that has not seen this resource
                yield execute(self.q["pace_ensure"], {"name": name})
                row = yield from self._one("pace_take", params)
            assert row is not None
            return PaceSlot(
                slot=float(row["slot"]),
                now=float(row["now"]),
                paused_until=float(row["paused_until"]),
            )

        return await self.db.run(body)

    async def pace_pause(self, name: str, pause_s: float, now: float) -> PaceState:
        def body() -> Generator[Op, Any, PaceState]:
            params = {"name": name, "pause_s": float(pause_s), "now": now}
            row = yield from self._one("pace_pause", params)
            if row is None:
                yield execute(self.q["pace_ensure"], {"name": name})
                row = yield from self._one("pace_pause", params)
            assert row is not None
            state = yield from self._one("pace_read", {"name": name, "now": row["now"]})
            assert state is not None
            return _pace_state(state)

        return await self.db.run(body)

    async def pace_state(self, name: str, now: float) -> PaceState | None:
        def body() -> Generator[Op, Any, PaceState | None]:
            row = yield from self._one("pace_read", {"name": name, "now": now})
            return _pace_state(row) if row else None

        return await self.db.read(body)

    async def lease_take(
        self, name: str, holder: str, limit: int, lease_s: float, now: float
    ) -> PaceLease | None:
        def body() -> Generator[Op, Any, PaceLease | None]:
            row = yield from self._one(
                "lease_take",
                {
                    "name": name,
                    "holder": holder,
                    "limit": int(limit),
                    "lease_s": float(lease_s),
                    "now": now,
                },
            )
            if row is None:
                return None
            return PaceLease(name, int(row["slot"]), holder, float(row["expires_at"]))

        return await self.db.run(body)

    async def lease_renew(self, lease: PaceLease, lease_s: float, now: float) -> bool:
        return await self._changed(
            "lease_renew",
            {
                "name": lease.name,
                "slot": lease.slot,
                "holder": lease.holder,
                "lease_s": float(lease_s),
                "now": now,
            },
        )

    async def lease_release(self, lease: PaceLease) -> bool:
        return await self._changed(
            "lease_release", {"name": lease.name, "slot": lease.slot, "holder": lease.holder}
        )

    async def republish_unfinished(self, lost_before: float) -> int:
        """SENT rows of unfinished jobs and tasks, sent before `lost_before`, back to PENDING.

        For a queue that lost its messages: rows sent to the recreated queue keep theirs.
        """
        return await self.db.run(
            partial(self._count, "relay_republish_unfinished", {"now": lost_before})
        )

    async def prune(self, finished_before: float, dead_before: float, batch: int) -> dict[str, int]:
        """Delete old history in batches of `batch` rows, one short transaction each."""
        if not (math.isfinite(finished_before) and math.isfinite(dead_before)):
            # NaN compares false to everything but SQL may not: never guess.
            raise ValueError("prune needs finite cut-off times")
        totals: dict[str, int] = {}
        for name, before in (
            ("prune_relay_sent", finished_before),
            ("prune_work_completed", finished_before),
            ("prune_finished_jobs", finished_before),
            ("prune_finished_tasks", finished_before),
            ("prune_dead_credentials", dead_before),
        ):
            total = 0
            while True:
                params = {"before": before, "limit": batch}
                if name == "prune_relay_sent":
                    params["dead_before"] = dead_before
                n = await self.db.run(partial(self._count, name, params))
                total += n
                if n < batch:
                    break
            totals[name.removeprefix("prune_")] = total
        return totals


def _check(store: SqlStore) -> None:
    """mypy proves here that SqlStore satisfies every port."""
    _jobs: ports.JobStore = store
    _relay_store: ports.RelayStore = store
    _tasks: ports.TaskStore = store
    _websites: ports.WebsiteStore = store
    _stats: ports.StatsStore = store
    _prune: ports.PruneStore = store
    _pace: ports.PaceStore = store


async def open_database(
    url: str, base_dir: Path, pool_size: int, acquire_timeout_s: float
) -> SqliteDatabase | PostgresDatabase:
    """The driver for `url`, open: the one place a URL picks a driver, and with it the
    `Features` the store and group commit follow."""
    db: SqliteDatabase | PostgresDatabase
    if url.startswith("sqlite:///"):
        db = SqliteDatabase(sqlite_path(url, base_dir), acquire_timeout_s)
    else:
        db = PostgresDatabase(url, pool_size, acquire_timeout_s)
    await db.open()
    return db


async def open_store(
    url: str, base_dir: Path, pool_size: int, acquire_timeout_s: float
) -> SqlStore:
    db = await open_database(url, base_dir, pool_size, acquire_timeout_s)
    return SqlStore(db, patience_s=acquire_timeout_s)
