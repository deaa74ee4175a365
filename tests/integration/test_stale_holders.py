"""Guards against stale holders and half-done transactions, at the store, on both backends.

A holder whose lease ran out (a slow or paused process) may still come back with an
outcome; the version guard must make that late write change nothing. A redrive is
one transaction: the job and its fresh outbox row commit together or not at all.
Each test here kills a mutant of `tests/mutants/` (see its `why`).
"""

from __future__ import annotations

import uuid

import pytest

from outboxd.errors import StorageError
from outboxd.services.retries import publish_failure
from outboxd.storage.store import SqlStore
from tests.support.db import install_outbox_fault, remove_outbox_fault
from tests.support.ops import insert_portal_job

# ---------------------------------------------------------------- relay rows


async def test_a_stale_relay_holders_late_sent_changes_nothing(store: SqlStore) -> None:
    """Claimed at t=100 (10 s lease), claimed again at t=111, that claim marked DEAD:
    the first holder's late SENT is refused, the row and its job stay DEAD."""
    job_id, outbox_id = await insert_portal_job(store, 50.0)
    first = await store.claim_relay_row(outbox_id, 100.0, 10.0)
    assert first is not None and first.claimed_until == 110.0
    # The lease holds until it expires: no second holder at t=105, neither way.
    assert await store.claim_relay_row(outbox_id, 105.0, 10.0) is None
    assert await store.claim_relay_due(105.0, 10, 10.0) == []
    second = await store.claim_relay_row(outbox_id, 111.0, 10.0)
    assert second is not None and second.version != first.version
    assert second.attempt_count == 2
    await store.mark_relay_failed(
        [publish_failure(row=second, error="boom", next_attempt_at=111.0, dead=True)], 111.0
    )

    late = await store.mark_relay_sent([(first, "late-message-id")], 112.0)

    assert late == []
    row = await store.get_relay_row(outbox_id)
    assert row is not None
    assert (row.status, row.queue_message_id, row.sent_at) == ("DEAD", None, None)
    job = await store.get_job(job_id)
    assert job is not None and job.status == "DEAD" and job.error_code == "RETRIES_EXHAUSTED"


async def test_a_round_with_one_stale_row_marks_only_the_others(store: SqlStore) -> None:
    """Three rows of one round SENT, one of them claimed again by a newer holder in the
    meantime: the other two are SENT and their jobs RUNNING, and the rows answered are
    exactly the rows as committed (SQLite builds them from the claimed ones); the stale
    one is left to its new holder."""
    ids = [await insert_portal_job(store, t) for t in (50.0, 51.0, 52.0)]
    rows = await store.claim_relay_due(100.0, 3, 10.0)
    assert [r.id for r in rows] == [o for _, o in ids]
    stale = await store.claim_relay_row(ids[1][1], 111.0, 10.0)
    assert stale is not None

    marked = await store.mark_relay_sent([(r, f"mid-{i}") for i, r in enumerate(rows)], 112.0)

    assert [m.id for m in marked] == [ids[0][1], ids[2][1]]
    for m in marked:
        assert m == await store.get_relay_row(m.id)
        assert (m.status, m.sent_at, m.claimed_until) == ("SENT", 112.0, None)
    assert [m.queue_message_id for m in marked] == ["mid-0", "mid-2"]
    held = await store.get_relay_row(ids[1][1])
    assert held == stale and held.status == "PENDING"
    statuses = [(await store.get_job(j)).status for j, _ in ids]  # type: ignore[union-attr]
    assert statuses == ["RUNNING", "QUEUED", "RUNNING"]


async def test_one_transaction_records_a_round_and_claims_the_next(store: SqlStore) -> None:
    """The relay loop's transaction per round: the sent row is SENT (its job RUNNING), the
    failed one backs off, the next due row is claimed, and neither of the rows it just
    recorded is claimed again. A stale holder's outcome in it changes nothing."""
    ids = [await insert_portal_job(store, t) for t in (50.0, 51.0, 52.0)]
    (a_job, a), (_, b), (_, c) = ids
    ra, rb = await store.claim_relay_due(100.0, 2, 10.0)
    assert (ra.id, rb.id) == (a, b)
    failure = publish_failure(row=rb, error="boom", next_attempt_at=200.0, dead=False)

    marked, claimed = await store.record_relay_outcome_and_claim_due(
        [(ra, "mid-a")], [failure], 101.0, 10, 10.0
    )

    assert [m.id for m in marked] == [a] and marked[0].queue_message_id == "mid-a"
    assert [r.id for r in claimed] == [c] and claimed[0].claimed_until == 111.0
    row_b = await store.get_relay_row(b)
    assert row_b is not None
    assert (row_b.status, row_b.next_attempt_at) == ("RETRYABLE_FAILED", 200.0)
    job = await store.get_job(a_job)
    assert job is not None and job.status == "RUNNING"
    # A late copy of the same outcome (the rows' versions moved on) and no claim: nothing.
    assert await store.record_relay_outcome_and_claim_due(
        [(ra, "mid-late")], [], 102.0, 0, 10.0
    ) == ([], [])
    row_a = await store.get_relay_row(a)
    assert row_a is not None and row_a.queue_message_id == "mid-a"


async def test_a_round_without_failures_is_recorded_and_the_next_claimed_at_once(
    store: SqlStore,
) -> None:
    """The relay loop's usual round (no failures; on Postgres a single statement): the
    sent row is SENT with its MessageId and its job RUNNING, and the next due row is
    claimed, but not a row another holder leases, nor the recorded row itself although
    its lease ran out before the outcome came in."""
    (a_job, a), (_, b), (_, c) = [await insert_portal_job(store, t) for t in (50.0, 51.0, 52.0)]
    [ra] = await store.claim_relay_due(100.0, 1, 10.0)
    assert ra.id == a and ra.claimed_until == 110.0
    assert await store.claim_relay_row(b, 100.0, 30.0) is not None  # another holder's

    marked, claimed = await store.record_relay_outcome_and_claim_due(
        [(ra, "mid-a")], [], 115.0, 10, 10.0
    )

    assert [(m.id, m.status, m.queue_message_id, m.sent_at) for m in marked] == [
        (a, "SENT", "mid-a", 115.0)
    ]
    assert [(r.id, r.claimed_until, r.attempt_count) for r in claimed] == [(c, 125.0, 1)]
    row_a = await store.get_relay_row(a)
    assert row_a is not None
    assert (row_a.status, row_a.claimed_until, row_a.attempt_count) == ("SENT", None, 1)
    row_b = await store.get_relay_row(b)
    assert row_b is not None and row_b.claimed_until == 130.0
    job = await store.get_job(a_job)
    assert job is not None and job.status == "RUNNING"


async def test_a_stale_relay_holders_late_failure_changes_nothing(store: SqlStore) -> None:
    """The new holder's SENT stands; the first holder's late DEAD is refused, the job
    stays RUNNING."""
    job_id, outbox_id = await insert_portal_job(store, 50.0)
    first = await store.claim_relay_row(outbox_id, 100.0, 10.0)
    assert first is not None
    [second] = await store.claim_relay_due(111.0, 10, 10.0)
    assert second.id == outbox_id and second.version != first.version
    [sent] = await store.mark_relay_sent([(second, "mid-2")], 112.0)
    assert sent.status == "SENT"

    await store.mark_relay_failed(
        [publish_failure(row=first, error="late", next_attempt_at=113.0, dead=True)], 113.0
    )

    row = await store.get_relay_row(outbox_id)
    assert row is not None and (row.status, row.queue_message_id) == ("SENT", "mid-2")
    job = await store.get_job(job_id)
    assert job is not None and job.status == "RUNNING"


# ---------------------------------------------------------------- job runs


async def test_a_stale_runs_late_outcome_cannot_overwrite_the_current_runs(
    store: SqlStore,
) -> None:
    """Run 1 starts at t=100 with a 10 s lease, run 2 takes over at t=111: run 1's late
    outcome, lease extension, progress, retry and release all change nothing."""
    job_id, _ = await insert_portal_job(store, 50.0)
    stale = await store.start_job_run(job_id, 100.0, 10.0)
    assert stale is not None and stale.status == "RUNNING" and stale.attempts == 1
    # A live lease: nobody else starts the job.
    assert await store.start_job_run(job_id, 105.0, 10.0) is None
    current = await store.start_job_run(job_id, 111.0, 10.0)
    assert current is not None and current.attempts == 2 and current.version != stale.version

    assert await store.finish_job(stale, "FAILED", 112.0, error=("PORTAL_AUTH_FAILED", "x")) is None
    assert await store.finish_job(stale, "SUCCEEDED", 112.0, result={"from": "stale"}) is None
    assert await store.extend_job_lease(stale, 500.0) is False
    assert await store.update_job_progress(stale, {"step": "STALE"}, 112.0) is None
    assert await store.job_retry_later(stale, ("PORTAL_UNAVAILABLE", "x"), 112.0) is None
    assert await store.release_job_lease(stale, 112.0) is False

    job = await store.get_job(job_id)
    assert job is not None
    assert (job.status, job.attempts, job.version) == ("RUNNING", 2, current.version)
    assert job.lease_until == 121.0 and job.progress is None and job.error_code is None
    assert job.sealed is not None and job.key_id is not None

    # The current holder's own writes go through.
    assert await store.extend_job_lease(current, 130.0) is True
    done = await store.finish_job(current, "SUCCEEDED", 113.0, result={"from": "current"})
    assert done is not None and done.status == "SUCCEEDED" and done.result == {"from": "current"}
    assert done.sealed is None and done.key_id is None  # credentials erased at the end


async def test_a_second_finish_after_succeeded_changes_nothing(store: SqlStore) -> None:
    """Once SUCCEEDED, neither the run's own record nor the finished one can finish it again."""
    job_id, _ = await insert_portal_job(store, 50.0)
    run = await store.start_job_run(job_id, 100.0, 10.0)
    assert run is not None
    done = await store.finish_job(run, "SUCCEEDED", 101.0, result={"n": 1})
    assert done is not None and done.status == "SUCCEEDED"

    assert await store.finish_job(run, "FAILED", 102.0, error=("PORTAL_AUTH_FAILED", "x")) is None
    # Same version as the row now: only the status guard stands in the way.
    assert await store.finish_job(done, "FAILED", 102.0, error=("PORTAL_AUTH_FAILED", "x")) is None
    assert await store.finish_job(done, "SUCCEEDED", 102.0, result={"n": 2}) is None
    assert await store.mark_job_dead(job_id, ("RETRIES_EXHAUSTED", "x"), 103.0) is None
    assert await store.start_job_run(job_id, 200.0, 10.0) is None

    job = await store.get_job(job_id)
    assert job is not None
    assert (job.status, job.result, job.error_code, job.finished_at, job.version) == (
        "SUCCEEDED",
        {"n": 1},
        None,
        101.0,
        done.version,
    )


# ---------------------------------------------------------------- redrive


async def test_a_redrive_whose_outbox_insert_fails_leaves_the_job_dead(
    store: SqlStore, db_url: str
) -> None:
    """One transaction: with the outbox insert failing, the job stays DEAD (never QUEUED
    with no outbox row to carry it); once the fault is gone the redrive works."""
    job_id, outbox_id = await insert_portal_job(store, 50.0)
    dead = await store.mark_job_dead(job_id, ("RETRIES_EXHAUSTED", "x"), 60.0)
    assert dead is not None and dead.status == "DEAD"

    await install_outbox_fault(db_url)
    try:
        with pytest.raises(StorageError):
            await store.redrive_job(job_id, str(uuid.uuid4()), 70.0)
    finally:
        await remove_outbox_fault(db_url)

    job = await store.get_job(job_id)
    assert job is not None
    assert (job.status, job.version, job.error_code) == ("DEAD", dead.version, "RETRIES_EXHAUSTED")
    latest = await store.latest_relay_row_for_job(job_id)
    assert latest is not None and latest.id == outbox_id

    fresh_id = str(uuid.uuid4())
    redriven = await store.redrive_job(job_id, fresh_id, 80.0)
    assert redriven.status == "QUEUED"
    latest = await store.latest_relay_row_for_job(job_id)
    assert latest is not None and latest.id == fresh_id and latest.status == "PENDING"
