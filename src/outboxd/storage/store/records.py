"""Rows as the records of storage/ports.py, and JSON columns in and out."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal

from outboxd.storage.db import Row
from outboxd.storage.ports import JobEvent, JobRecord, NewPortalJob, PaceState, RelayRow, TaskRun
from outboxd.storage.website_ports import Website, WorkRow


def json_or_none(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    value = json.loads(text)
    return value if isinstance(value, dict) else None


def dump(value: Mapping[str, Any] | None) -> str | None:
    return None if value is None else json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def job_record(r: Row) -> JobRecord:
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
        progress=json_or_none(r["progress"]),
        error_code=r["error_code"],
        error_message=r["error_message"],
        result=json_or_none(r["result"]),
        created_at=float(r["created_at"]),
        updated_at=float(r["updated_at"]),
        finished_at=r["finished_at"],
        version=int(r["version"]),
        cancel_requested=bool(r["cancel_requested"]),
        traceparent=r["traceparent"],
        wait_until=r["wait_until"],
        wait_for=json_or_none(r["wait_for"]),
        wait_outbox_id=r["wait_outbox_id"],
        locked_until=r["locked_until"],
    )


# What a new row holds in the columns its insert leaves to the table (the migrations' defaults).
_NEW_JOB: dict[str, Any] = {
    "status": "QUEUED",
    "attempts": 0,
    "version": 0,
    "cancel_requested": False,
    **dict.fromkeys(
        (
            "lease_until",
            "progress",
            "error_code",
            "error_message",
            "result",
            "finished_at",
            "wait_until",
            "wait_for",
            "wait_outbox_id",
            "locked_until",
        )
    ),
}
_NEW_RELAY_ROW: dict[str, Any] = {
    "status": "PENDING",
    "version": 0,
    **dict.fromkeys(("last_error", "queue_message_id", "sent_at")),
}


def new_job_params(new: NewPortalJob, now: float) -> dict[str, Any]:
    """What `insert_job` writes for an intake (one row of `insert_jobs_many` on Postgres)."""
    return {
        "id": new.job_id,
        "kind": "portal_link",
        "portal": new.portal,
        "user_id": new.user_id,
        "idempotency_key": new.idempotency_key,
        "fingerprint": new.fingerprint,
        "key_id": new.key_id,
        "sealed": new.sealed,
        "now": now,
        "traceparent": new.traceparent,
        "login_subject": new.login_subject,
    }


def new_relay_params(
    outbox_id: str,
    kind: Literal["job", "task"],
    job_id: str | None,
    task_id: str | None,
    dedup_id: str,
    now: float,
    claimed_until: float | None = None,
    traceparent: str | None = None,
    due_at: float | None = None,
) -> dict[str, Any]:
    """What `insert_relay_row` writes. Inserted claimed (by the request that publishes it
    right after the commit), the row counts as attempt 1; due at `due_at` (default: now)."""
    return {
        "id": outbox_id,
        "kind": kind,
        "job_id": job_id,
        "task_id": task_id,
        "dedup_id": dedup_id,
        "now": now,
        "next_attempt_at": now if due_at is None else due_at,
        "claimed_until": claimed_until,
        "attempt_count": 0 if claimed_until is None else 1,
        "traceparent": traceparent,
    }


def intake_relay_params(new: NewPortalJob, now: float) -> dict[str, Any]:
    """An intake's outbox row: its job's, deduplicated on the job id."""
    return new_relay_params(
        new.outbox_id, "job", new.job_id, None, new.job_id, now, new.claimed_until, new.traceparent
    )


def inserted_job(params: Mapping[str, Any]) -> JobRecord:
    """The job row `insert_job` wrote with `params`, as the database holds it: intake answers
    from what it wrote instead of reading the row back with RETURNING, the most expensive
    part of the insert on SQLite (tests/integration/test_intake_records.py checks the two
    agree)."""
    return job_record(
        {**_NEW_JOB, **params, "created_at": params["now"], "updated_at": params["now"]}
    )


def inserted_relay_row(params: Mapping[str, Any]) -> RelayRow:
    """The outbox row `insert_relay_row` wrote with `params` (see `inserted_job`)."""
    now = params["now"]
    return relay_record({**_NEW_RELAY_ROW, "next_attempt_at": now, **params, "created_at": now})


def job_event_record(r: Row) -> JobEvent:
    return JobEvent(
        job_id=r["job_id"],
        seq=int(r["seq"]),
        at=float(r["at"]),
        type=r["type"],
        status=r["status"],
        attempt=int(r["attempt"]),
        instance=r["instance"],
        detail=json_or_none(r["detail"]),
    )


def relay_record(r: Row) -> RelayRow:
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
        traceparent=r.get("traceparent"),
    )


def task_record(r: Row) -> TaskRun:
    return TaskRun(
        id=r["id"],
        type=r["type"],
        payload=json_or_none(r["payload"]) or {},
        dedup_id=r["dedup_id"],
        status=r["status"],
        error=r["error"],
        enqueued_at=float(r["enqueued_at"]),
        finished_at=r["finished_at"],
        version=int(r["version"]),
    )


def website_record(r: Row) -> Website:
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


def work_record(r: Row) -> WorkRow:
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


def pace_state_record(r: Row) -> PaceState:
    last = r["last_at"]
    return PaceState(
        name=r["name"],
        last_at=float(last) if last is not None else None,
        next_at=float(r["next_at"]),
        paused_until=float(r["paused_until"]),
        now=float(r["now"]),
        sessions=int(r.get("sessions") or 0),
    )
