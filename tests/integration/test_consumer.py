"""The consumer in-process against real SQS (moto), the strict fake portal and the real
scraper, on both backends.

What it must show (issue 3): success stores the full record and erases the credentials,
and the message is deleted; a wrong password fails after exactly one login; transient
503s are retried; a portal that always fails ends DEAD with the message in the DLQ
while other jobs go on; a duplicate delivery of a finished job is deleted unrun; the
heartbeat keeps a slow job from being redelivered; a job whose lease is held elsewhere
is not run twice at once.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Awaitable
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
from structlog.testing import capture_logs
from testkit.fakes.portal import (
    SAMPLE_PASSWORD,
    SAMPLE_SNO,
)
from testkit.records import CS101_RECORD, SAMPLE_STUDENT_RECORD

from outboxd.errors import StorageError
from outboxd.metrics import Metrics
from outboxd.queue.messages import encode_job, encode_task
from outboxd.queue.sqs import (
    OutgoingMessage,
    QueueKind,
)
from outboxd.services.admin import AdminService
from outboxd.storage.login_ports import LoginFailure
from outboxd.storage.ports import JobRecord, TaskRun
from outboxd.storage.store import SqlStore, open_store
from outboxd.workers.publishing import message_body
from outboxd.workers.relay import Relay
from tests.support.clock import Clock
from tests.support.consumer_rig import (
    BROKEN_PASSWORD,
    BROKEN_SNO,
    FINAL,
    Rig,
    RigFactory,
    broken_student,
)
from tests.support.db import sql
from tests.support.ops import fail, kill_in_processing, kill_task_at_publish, submit_job, succeed
from tests.support.sqs import read_all, send_to_dlq
from tests.support.students import it_student
from tests.support.waits import eventually


@pytest_asyncio.fixture
async def rig(make_rig: RigFactory) -> Rig:
    """The default rig with its consumer running; a test that sets the portal or the
    settings up first builds its own with `make_rig`."""
    made = await make_rig()
    made.start_consumer()
    return made


# ---------------------------------------------------------------- tests


async def test_success_stores_the_record_erases_credentials_and_deletes_the_message(
    rig: Rig,
) -> None:
    job_id, job = await rig.run_sample_job()

    assert job.status == "SUCCEEDED", job
    assert job.error_code is None and job.error_message is None
    assert job.attempts == 1 and job.finished_at is not None
    result = job.result
    assert result is not None
    assert result["student"] == {**SAMPLE_STUDENT_RECORD, "studentNumber": SAMPLE_SNO}
    assert [(s["year"], s["term"]) for s in result["semesters"]] == [
        (2020, "1"),
        (2020, "summer"),
        (2020, "2"),
    ]
    assert [[c["code"] for c in s["courses"]] for s in result["semesters"]] == [
        ["CS101", "GE110"],
        ["GE201"],
        ["CS201", "CS230"],
    ]
    first = result["semesters"][0]
    assert (first["creditsAttempted"], first["gpa"], first["rank"]) == (18, 4.12, "6/33")
    assert first["courses"][0] == CS101_RECORD
    assert result["totals"] == {
        "creditsAttempted": 40,
        "creditsEarned": 40,
        "gpa": 3.99,
        "percentile": 92.1,
    }
    assert job.progress == {"step": "GRADES", "done": 3, "total": 3}
    # Credentials erased: no ciphertext, no key id, in the row itself.
    assert job.sealed is None and job.key_id is None
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}

    await rig.wait_queue_empty()
    receives = rig.receiver.receives_of(job_id)
    assert len(receives) == 1
    assert receives[0].receipt_handle in rig.receiver.deleted
    assert all(SAMPLE_PASSWORD not in b for b in rig.publisher.bodies)


async def test_wrong_password_fails_after_exactly_one_login(rig: Rig) -> None:
    wrong = f"pw-{uuid.uuid4()}"
    job_id = await rig.submit(SAMPLE_SNO, wrong)

    job = await rig.wait_status(job_id, *FINAL)

    assert job.status == "FAILED"
    assert job.error_code == "PORTAL_AUTH_FAILED"
    assert job.error_message and wrong not in job.error_message
    assert job.sealed is None and job.key_id is None and job.result is None
    # The message is deleted: no delivery is left that could log in again.
    await rig.wait_queue_empty()
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}
    assert len(rig.receiver.receives_of(job_id)) == 1
    assert (await rig.job(job_id)).status == "FAILED"


async def test_two_503s_then_success(make_rig: RigFactory) -> None:
    rig = await make_rig(sqs={"max_receive_count": 3})
    rig.portal.fail_next_n_with_503(2)
    rig.start_consumer()
    job_id, job = await rig.run_sample_job()

    assert job.status == "SUCCEEDED", job
    assert job.error_code is None and job.result is not None
    assert job.attempts == 3
    assert [m.receive_count for m in rig.receiver.receives_of(job_id)] == [1, 2, 3]
    await rig.wait_queue_empty()


async def test_a_portal_that_always_fails_ends_dead_with_the_message_in_the_dlq(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(sqs={"max_receive_count": 2})
    rig.portal.always_fail_503 = True
    rig.start_consumer()
    job_id, job = await rig.run_sample_job()

    assert job.status == "DEAD"
    assert job.error_code == "RETRIES_EXHAUSTED"
    assert job.error_message is not None and "PORTAL_UNAVAILABLE" in job.error_message
    assert job.attempts == 2
    assert job.sealed is not None  # kept so the job can be redriven
    await rig.wait_queue_empty(dlq=1)
    dead = await read_all(rig.queues, "jobs", dlq=True)
    assert [json.loads(b)["jobId"] for b in dead] == [job_id]

    # The consumer goes on: the next job, once the portal is back, succeeds.
    rig.portal.always_fail_503 = False
    other = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)
    assert (await rig.wait_status(other, *FINAL)).status == "SUCCEEDED"
    assert (await rig.job(job_id)).status == "DEAD"


async def test_one_job_dying_does_not_affect_the_others(make_rig: RigFactory) -> None:
    rig = await make_rig(sqs={"max_receive_count": 2})
    rig.start_consumer()
    doomed = await rig.submit(BROKEN_SNO, BROKEN_PASSWORD)
    good = [await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD) for _ in range(2)]

    dead = await rig.wait_status(doomed, *FINAL)
    done = [await rig.wait_status(j, *FINAL) for j in good]

    assert dead.status == "DEAD" and dead.error_code == "RETRIES_EXHAUSTED"
    assert dead.error_message is not None and "PORTAL_BAD_RESPONSE" in dead.error_message
    assert [j.status for j in done] == ["SUCCEEDED", "SUCCEEDED"]
    assert all(j.attempts == 1 and j.sealed is None for j in done)
    await rig.wait_queue_empty(dlq=1)
    in_dlq = await read_all(rig.queues, "jobs", dlq=True)
    assert [json.loads(b)["jobId"] for b in in_dlq] == [doomed]


async def test_a_duplicate_delivery_of_a_finished_job_is_deleted_without_running(
    rig: Rig,
) -> None:
    job_id, finished = await rig.run_sample_job()
    assert finished.status == "SUCCEEDED"
    await rig.wait_queue_empty()
    requests_before = len(rig.portal.requests)

    row = await rig.store.latest_relay_row_for_job(job_id)
    assert row is not None
    sent = await rig.queues.send_batch("jobs", [OutgoingMessage("dup", message_body(row))])
    assert "dup" in sent.successful

    async def duplicate_seen() -> bool:
        return len(rig.receiver.receives_of(job_id)) == 2

    await eventually(duplicate_seen, 15, what="the duplicate to be received")
    await rig.wait_queue_empty()
    assert rig.receiver.receives_of(job_id)[1].receipt_handle in rig.receiver.deleted
    assert len(rig.portal.requests) == requests_before
    assert await rig.job(job_id) == finished


async def test_heartbeat_keeps_a_slow_job_from_being_redelivered(make_rig: RigFactory) -> None:
    # Every portal request takes 0.35 s (well inside the 5 s scraper timeout); the 11
    # requests of a job take about twice the 2 s visibility timeout.
    rig = await make_rig(sqs={"visibility_timeout_s": 2}, consumer={"heartbeat_s": 0.5})
    rig.portal.delay_s = 0.35
    rig.start_consumer()
    job_id, job = await rig.run_sample_job()

    assert job.status == "SUCCEEDED", job
    assert job.finished_at is not None and job.finished_at - job.created_at > 3.0
    assert job.attempts == 1
    assert len(rig.receiver.receives_of(job_id)) == 1, "the message was redelivered"
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}
    assert rig.portal.in_flight_max == 1
    await rig.wait_queue_empty()


async def test_a_job_whose_lease_is_held_elsewhere_is_not_run_until_it_expires(
    make_rig: RigFactory,
) -> None:
    rig = await make_rig(sqs={"max_receive_count": 3})
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD)
    # Another worker (a process that then died) holds the job for 3 more seconds.
    held = await rig.store.start_job_run(job_id, time.time(), 3.0)
    assert held is not None and held.lease_until is not None
    relay = Relay(rig.store, rig.publisher, rig.settings.relay, Metrics())
    assert await relay.publish_now(outbox_id)
    rig.start_consumer()

    # The consumer found the job busy: it put the message back until the lease runs out.
    [(_, back_in_s)] = await eventually(lambda: rig.receiver.visibility_changes, 15)
    assert rig.portal.requests == [], "the job ran while another worker held its lease"
    assert 1 <= back_in_s <= 3

    job = await rig.wait_status(job_id, *FINAL)
    assert job.status == "SUCCEEDED", job
    assert job.attempts == 2  # the other worker's attempt, then ours
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}
    await rig.wait_queue_empty()


async def test_two_consumers_with_a_duplicate_message_run_the_job_once(
    backend: str, db_url: str, make_rig: RigFactory, tmp_path: Path
) -> None:
    rig = await make_rig(sqs={"max_receive_count": 5})
    rig.portal.delay_s = 0.15  # about 2 s per job: long enough to overlap
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD)
    relay = Relay(rig.store, rig.publisher, rig.settings.relay, Metrics())
    assert await relay.publish_now(outbox_id)
    row = await rig.store.get_relay_row(outbox_id)
    assert row is not None
    # The same job's message twice, as after a relay crash between publish and SENT.
    await rig.queues.send_batch("jobs", [OutgoingMessage("again", message_body(row))])
    other_store: SqlStore | None = None
    if backend == "postgres":
        other_store = await open_store(db_url, tmp_path, 3, 5.0)  # a second instance
    try:
        rig.start_consumer()
        rig.start_consumer(other_store)
        job = await rig.wait_status(job_id, *FINAL)
        assert job.status == "SUCCEEDED" and job.attempts == 1
        assert rig.portal.login_attempts == {SAMPLE_SNO: 1}
        assert rig.portal.in_flight_max == 1
        await rig.wait_queue_empty()
        assert len(rig.receiver.receives_of(job_id)) >= 2
    finally:
        await rig.close()
        if other_store is not None:
            await other_store.close()


async def test_no_password_in_any_message_or_the_finished_row(make_rig: RigFactory) -> None:
    """Bodies captured at send time and the queues afterwards hold ids only."""
    rig = await make_rig(sqs={"max_receive_count": 2})
    secret = f"pw-{uuid.uuid4()}"
    rig.portal.students["20207777"] = it_student("20207777", secret, "이비밀", 1)
    rig.portal.students["20208888"] = broken_student("20208888", secret)
    rig.start_consumer()
    ok = await rig.submit("20207777", secret)
    wrong = await rig.submit(SAMPLE_SNO, secret)
    dead = await rig.submit("20208888", secret)
    for job_id, status in ((ok, "SUCCEEDED"), (wrong, "FAILED"), (dead, "DEAD")):
        job = await rig.wait_status(job_id, *FINAL)
        assert job.status == status
        assert secret not in repr(job)
    await rig.wait_queue_empty(dlq=1)
    bodies = rig.publisher.bodies + [m.body for m in rig.receiver.received]
    bodies += await read_all(rig.queues, "jobs", dlq=True)
    assert len(rig.publisher.bodies) == 3
    for body in bodies:
        assert secret not in body
        assert set(json.loads(body)) == {"type", "jobId", "outboxId"}


# ---------------------------------------------------------------- guards on the failure paths


class FinishFailsOnce(SqlStore):
    """The real store on the same database, whose first SUCCEEDED commit fails, as a
    database blip at that moment would (the fault is injected, the store is real)."""

    def __init__(self, inner: SqlStore) -> None:
        super().__init__(inner.db)
        self.failures = 0

    async def finish_job(self, job: JobRecord, status: Any, *rest: Any, **kw: Any) -> Any:
        if status == "SUCCEEDED" and self.failures == 0:
            self.failures += 1
            raise StorageError("injected: the SUCCEEDED commit failed")
        return await super().finish_job(job, status, *rest, **kw)


async def test_a_failed_succeeded_commit_keeps_the_message_and_redelivery_finishes_the_job(
    make_rig: RigFactory,
) -> None:
    """The message is deleted only after the outcome committed: with the first commit
    failing, the message comes back and the job still ends SUCCEEDED."""
    rig = await make_rig(sqs={"max_receive_count": 5})
    flaky = FinishFailsOnce(rig.store)
    rig.start_consumer(flaky)
    job_id, job = await rig.run_sample_job(timeout_s=40)

    assert job.status == "SUCCEEDED", job
    assert flaky.failures == 1
    receives = rig.receiver.receives_of(job_id)
    assert len(receives) >= 2
    assert receives[0].receipt_handle not in rig.receiver.deleted
    assert job.sealed is None and job.result is not None
    await rig.wait_queue_empty()


async def test_a_rejected_login_after_a_takeover_does_not_delete_the_message(
    make_rig: RigFactory,
) -> None:
    """The run meets PORTAL_AUTH_FAILED after another run took the job over: its FAILED
    commit is refused, so it must leave the message (the job's only carrier) alone."""
    rig = await make_rig(sqs={"max_receive_count": 5})
    rig.portal.delay_s = 1.0  # the login answer comes ~2 s after the first request
    rig.start_consumer()
    wrong = f"pw-{uuid.uuid4()}"
    job_id = await rig.submit(SAMPLE_SNO, wrong)

    async def run_started() -> bool:
        return bool(rig.portal.requests) and (await rig.job(job_id)).attempts == 1

    await eventually(run_started, 15, what="the first run to reach the portal")
    # Another run takes the job over, as one would once this run's lease ran out.
    other = await rig.store.start_job_run(job_id, time.time() + 100, 10.0)
    assert other is not None and other.attempts == 2

    async def login_answered_and_message_back() -> bool:
        return (
            rig.portal.login_attempts.get(SAMPLE_SNO) == 1
            and len(rig.receiver.receives_of(job_id)) >= 2
        )

    # The stale run is done once its message comes back: it was not deleted.
    await eventually(login_answered_and_message_back, 20, what="the message to be received again")
    first = rig.receiver.receives_of(job_id)[0]
    assert first.receipt_handle not in rig.receiver.deleted
    job = await rig.job(job_id)
    assert (job.status, job.attempts, job.error_code) == ("RUNNING", 2, None)
    assert job.sealed is not None
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}


@pytest.mark.parametrize("status", [401, 403])
async def test_a_rejection_page_with_an_error_status_fails_after_one_login(
    make_rig: RigFactory, status: int
) -> None:
    """The wrong-password page recognised by its text whatever its HTTP status: FAILED with
    PORTAL_AUTH_FAILED after exactly one login, never retried (that can lock the account)."""
    rig = await make_rig(sqs={"max_receive_count": 3})
    rig.portal.reject_status = status
    rig.start_consumer()
    wrong = f"pw-{uuid.uuid4()}"
    job_id = await rig.submit(SAMPLE_SNO, wrong)

    job = await rig.wait_status(job_id, *FINAL)

    assert (job.status, job.error_code) == ("FAILED", "PORTAL_AUTH_FAILED"), job
    assert job.sealed is None
    await rig.wait_queue_empty()
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}
    assert len(rig.receiver.receives_of(job_id)) == 1


@pytest.mark.real_clock  # SQS visibility and the lease: the first lease must really run out
async def test_the_heartbeat_renews_the_job_lease_so_a_duplicate_does_not_run_the_job(
    make_rig: RigFactory,
) -> None:
    """A job running longer than the visibility timeout keeps its lease live: a duplicate
    message arriving after the first lease would have run out finds the job busy."""
    rig = await make_rig(sqs={"visibility_timeout_s": 2}, consumer={"heartbeat_s": 0.5})
    rig.portal.delay_s = 0.5  # ~11 requests: about 5.5 s, well past the 2 s lease
    rig.start_consumer()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)

    async def run_started() -> bool:
        return (await rig.job(job_id)).attempts == 1

    await eventually(run_started, 15, what="the run to start")
    first = await rig.job(job_id)
    assert first.lease_until is not None
    end_of_first = first.lease_until

    async def renewed_past_the_first_lease() -> JobRecord | None:
        job = await rig.job(job_id)
        now = time.time()
        live = job.lease_until is not None and job.lease_until > now
        return job if now > end_of_first + 0.5 and live else None

    running = await eventually(renewed_past_the_first_lease, 15)
    assert running.status == "RUNNING" and running.attempts == 1, running
    row = await rig.store.latest_relay_row_for_job(job_id)
    assert row is not None
    await rig.queues.send_batch("jobs", [OutgoingMessage("dup", message_body(row))])

    job = await rig.wait_status(job_id, *FINAL)
    assert job.status == "SUCCEEDED" and job.attempts == 1, job
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}
    await rig.wait_queue_empty()


# ---------------------------------------------------------------- dead letters and the DLQ sweep


def dead_total(metrics: Metrics, table: str) -> float:
    value = metrics.registry.get_sample_value("outboxd_dead_total", {"table": table})
    return value or 0.0


async def dlq_depth(rig: Rig, kind: QueueKind = "jobs") -> int:
    return (await rig.queues.depth(kind)).dlq_visible


async def test_a_dead_job_redriven_succeeds_and_the_sweep_empties_the_dlq(
    make_rig: RigFactory,
) -> None:
    """The loop closes: a job dies at its last receive (message in the DLQ), the sweep
    keeps that dead letter, a redrive runs it again, and the next sweep deletes it."""
    rig = await make_rig(sqs={"max_receive_count": 2})
    rig.portal.always_fail_503 = True
    started = time.time()
    consumer = rig.start_consumer()
    job_id, job = await rig.run_sample_job()
    assert job.status == "DEAD"
    await rig.wait_queue_empty(dlq=1)
    assert dead_total(rig.metrics, "jobs") == 1
    last_receive = rig.metrics.registry.get_sample_value(
        "outboxd_consumer_last_receive_timestamp_seconds", {"queue": "jobs"}
    )
    assert last_receive is not None and last_receive >= started

    # While the job is DEAD its message is the dead letter: it stays, visible.
    swept = await consumer.sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead, swept.kept) == (0, 0, 1)
    assert await dlq_depth(rig) == 1

    rig.portal.always_fail_503 = False
    redriven = await AdminService(rig.store).redrive_jobs(actor="test", job_ids=[job_id])
    assert redriven.redriven == [job_id] and redriven.refused == []
    fresh = await rig.store.latest_relay_row_for_job(job_id)
    assert fresh is not None and fresh.status == "PENDING"
    relay = Relay(rig.store, rig.publisher, rig.settings.relay, rig.metrics)
    assert await relay.publish_now(fresh.id)
    done = await rig.wait_status(job_id, *FINAL)
    assert done.status == "SUCCEEDED", done

    with capture_logs() as logs:
        swept = await consumer.sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead, swept.kept) == (1, 0, 0)
    assert await dlq_depth(rig) == 0
    deleted = [e for e in logs if e["event"] == "dlq_message_deleted"]
    assert [(e["job_id"], e["reason"]) for e in deleted] == [(job_id, "job_redriven")]
    # Nothing of the job is DEAD any more.
    assert (await rig.job(job_id)).status == "SUCCEEDED"
    rows = await rig.store.relay_rows_for_job(job_id, 10)
    assert sorted(r.status for r in rows) == ["SENT", "SENT"]


async def test_the_sweep_never_marks_a_job_dead_while_its_lease_is_live(
    make_rig: RigFactory,
) -> None:
    """A copy of the message in the DLQ while another copy is being worked on (its run
    holds a live lease): the sweep leaves the job alone. Once that lease has run out with
    nobody finishing the job, the sweep marks it DEAD and keeps the dead letter."""
    rig = await make_rig()
    clock = Clock()
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD)
    claimed = await rig.store.claim_relay_row(outbox_id, clock.now, 30)
    assert claimed is not None
    assert await rig.store.mark_relay_sent([(claimed, "m-1")], clock.now)
    held = await rig.store.start_job_run(job_id, clock.now, 60)
    assert held is not None and held.status == "RUNNING"
    await send_to_dlq(rig.queues, "jobs", [message_body(claimed)])
    consumer = rig.consumer(clock=clock)

    swept = await consumer.sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead, swept.kept) == (0, 0, 1)
    assert await rig.job(job_id) == held
    assert dead_total(rig.metrics, "jobs") == 0
    assert await dlq_depth(rig) == 1

    clock.now += 61  # the holder died: its lease ran out
    swept = await consumer.sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead, swept.kept) == (0, 1, 1)
    dead = await rig.job(job_id)
    assert dead.status == "DEAD" and dead.error_code == "RETRIES_EXHAUSTED"
    assert dead.error_message == "the message reached the dead-letter queue"
    assert dead_total(rig.metrics, "jobs") == 1
    assert await dlq_depth(rig) == 1  # the dead letter itself stays


async def test_the_sweep_deletes_exactly_the_messages_of_closed_work(
    make_rig: RigFactory,
) -> None:
    """Each DLQ keeps the work that is DEAD (and what it cannot judge); a message whose job
    or task finished, was redriven or is gone is deleted."""
    rig = await make_rig()
    store, keys, now = rig.store, rig.keys, time.time()

    async def body_of(job_id: str) -> str:
        row = await store.latest_relay_row_for_job(job_id)
        assert row is not None
        return message_body(row)

    succeeded = (await succeed(store, (await submit_job(store, keys)).id)).id
    failed = (await fail(store, (await submit_job(store, keys)).id)).id
    redriven = (await kill_in_processing(store, (await submit_job(store, keys)).id)).id
    redriven_body = await body_of(redriven)
    await store.redrive_job(redriven, str(uuid.uuid4()), time.time())
    dead = (await kill_in_processing(store, (await submit_job(store, keys)).id)).id
    queued = (await submit_job(store, keys)).id
    delete_jobs = [
        await body_of(succeeded),
        await body_of(failed),
        encode_job(str(uuid.uuid4()), str(uuid.uuid4())),  # pruned since
        redriven_body,
    ]
    keep_jobs = [
        await body_of(dead),
        await body_of(queued),
        "not json",
        json.dumps({"jobId": dead}),  # no outboxId: not one of ours
    ]

    def task(status: str) -> Awaitable[tuple[TaskRun, bool]]:
        return store.enqueue_task(str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, status, now)

    done_task, _ = await task("t-succeeded")
    await store.finish_task(done_task.id, "SUCCEEDED", None, now)
    failed_task, _ = await task("t-failed")
    await store.finish_task(failed_task.id, "FAILED", "boom", now)
    dead_task, _ = await task("t-dead")
    dead_row = await kill_task_at_publish(store, dead_task.id)
    pending_task, _ = await task("t-pending")
    delete_tasks = [
        encode_task(done_task.id, str(uuid.uuid4())),
        encode_task(failed_task.id, str(uuid.uuid4())),
        encode_task(str(uuid.uuid4()), str(uuid.uuid4())),
    ]
    keep_tasks = [encode_task(dead_task.id, dead_row.id), encode_task(pending_task.id, "o")]
    await send_to_dlq(rig.queues, "jobs", delete_jobs + keep_jobs)
    await send_to_dlq(rig.queues, "tasks", delete_tasks + keep_tasks)
    before = {j: await rig.job(j) for j in (succeeded, failed, redriven, dead, queued)}

    with capture_logs() as logs:
        swept = await rig.consumer().sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead, swept.kept) == (7, 0, 6)
    assert sorted(await read_all(rig.queues, "jobs", dlq=True)) == sorted(keep_jobs)
    assert sorted(await read_all(rig.queues, "tasks", dlq=True)) == sorted(keep_tasks)
    reasons = sorted(e["reason"] for e in logs if e["event"] == "dlq_message_deleted")
    jobs_gone = ["job_finished", "job_finished", "job_pruned", "job_redriven"]
    tasks_gone = ["task_finished", "task_finished", "task_pruned"]
    assert reasons == sorted([*jobs_gone, *tasks_gone])
    # The sweep only deleted messages: no job changed.
    assert {j: await rig.job(j) for j in before} == before


# ---------------------------------------------------------------- the portal login lock


async def test_a_user_locked_after_failed_logins_gets_no_login_on_any_instance(
    backend: str, db_url: str, rig: Rig, tmp_path: Path
) -> None:
    """scrapers.suwon.max_auth_failures (3) wrong-password jobs from one user for one
    username lock that user out of it: a fourth job of that user, with the right password,
    ends FAILED PORTAL_LOGIN_LOCKED and the portal sees no login for it; on another instance
    on the same database too. Another user's job for the username is tried (and its success
    forgets the counts); another username is not affected. The database holds only a keyed
    hash of the username (the full story: tests/integration/test_login_lock.py)."""
    for n in range(3):
        job = await rig.wait_status(
            await rig.submit(SAMPLE_SNO, f"pw-wrong-{n}", user="mallory"), *FINAL
        )
        assert (job.status, job.error_code) == ("FAILED", "PORTAL_AUTH_FAILED")
    assert rig.portal.login_attempts == {SAMPLE_SNO: 3}
    # The next jobs run on another instance (a second store on the same database).
    other_store = await open_store(db_url, tmp_path, 3, 5.0) if backend == "postgres" else None
    try:
        await rig.stop_consumers()
        rig.start_consumer(other_store)
        locked = await rig.wait_status(
            await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD, user="mallory"), *FINAL
        )
        assert (locked.status, locked.error_code) == ("FAILED", "PORTAL_LOGIN_LOCKED")
        assert locked.sealed is None and locked.result is None
        assert SAMPLE_SNO not in (locked.error_message or "")
        # Another username logs in as before (unknown to the portal: one rejected login).
        other = await rig.wait_status(await rig.submit("20209998", "pw", user="dave"), *FINAL)
        assert other.error_code == "PORTAL_AUTH_FAILED"
        await rig.wait_queue_empty()
        assert rig.portal.login_attempts == {SAMPLE_SNO: 3, "20209998": 1}
        subjects = await sql(db_url, "SELECT subject FROM portal_login_failures")
        assert len(subjects) == 4
        assert all(SAMPLE_SNO not in s[0] and "20209998" not in s[0] for s in subjects)
        student = await rig.wait_status(
            await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD, user="dave"), *FINAL
        )
        assert student.status == "SUCCEEDED", student
    finally:
        await rig.close()
        if other_store is not None:
            await other_store.close()
    assert len(await sql(db_url, "SELECT subject FROM portal_login_failures")) == 1


async def test_failures_older_than_the_window_do_not_lock(
    db_url: str, make_rig: RigFactory
) -> None:
    """The lock holds until auth_failure_window_s has passed since the last failure: three
    failures recorded just over a window ago lock nothing; two more recent ones, with one
    old, lock nothing either (only two within the window); a third does. (A success would
    forget them all: these are one user's wrong passwords only.)"""
    rig = await make_rig(scrapers={"suwon": {"auth_failure_window_s": 600.0}})
    subject = rig.keys.login_subject("suwon", SAMPLE_SNO)
    now = time.time()

    async def fail_at(at: float) -> None:
        job_id, _ = await rig.create(SAMPLE_SNO, "pw-old")
        job = await rig.store.start_job_run(job_id, at, 60)
        assert job is not None
        done = await rig.store.finish_job(
            job,
            "FAILED",
            at,
            error=("PORTAL_AUTH_FAILED", "x"),
            login_failure=LoginFailure(subject, at - 1200, user_id="alice"),
        )
        assert done is not None

    for at in (now - 1500, now - 900, now - 800, now - 610):
        await fail_at(at)
    rig.start_consumer()
    # The last of the four is over a window old: a login is tried (and rejected).
    tried = await rig.wait_status(await rig.submit(SAMPLE_SNO, "pw-a"), *FINAL)
    assert tried.error_code == "PORTAL_AUTH_FAILED"
    await fail_at(now - 100)
    # The failure just recorded and -100 are within a window of each other, -610 is not:
    # a third login is tried, and its failure locks.
    third = await rig.wait_status(await rig.submit(SAMPLE_SNO, "pw-3"), *FINAL)
    assert third.error_code == "PORTAL_AUTH_FAILED"
    locked = await rig.wait_status(await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD), *FINAL)
    assert locked.error_code == "PORTAL_LOGIN_LOCKED"
    assert rig.portal.login_attempts == {SAMPLE_SNO: 2}
    # The failure two windows old was dropped when a newer one was recorded.
    times = await sql(db_url, "SELECT failed_at FROM portal_login_failures ORDER BY failed_at")
    assert len(times) == 6 and min(float(t[0]) for t in times) > now - 1300


async def test_the_lock_can_be_turned_off(make_rig: RigFactory) -> None:
    rig = await make_rig(scrapers={"suwon": {"max_auth_failures": 0}})
    rig.start_consumer()
    for n in range(4):
        job = await rig.wait_status(await rig.submit(SAMPLE_SNO, f"pw-{n}"), *FINAL)
        assert job.error_code == "PORTAL_AUTH_FAILED"
    assert rig.portal.login_attempts == {SAMPLE_SNO: 4}
