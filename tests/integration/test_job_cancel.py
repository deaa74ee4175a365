"""Cancelling a job (POST /v1/jobs/{id}/cancel) on both backends, against real SQS (moto),
the strict fake portal and the consumer in-process:

- QUEUED: CANCELLED at once, its outbox row never published, its credentials gone;
- RUNNING on a worker: cancelRequested, the worker stops before its next portal request
  (the request in flight finishes), the job ends CANCELLED;
- on the queue, not yet received: CANCELLED at once, the message deleted unrun;
- the answers: 202 again for a cancelled job, 409 C11 once it finished, 404 C04 for
  another user's job; an idempotent replay of a cancelled job's POST returns it CANCELLED;
- cancel never races a redrive, or a worker's start, into a running job.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from typing import Any

import pytest
from structlog.testing import capture_logs
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO
from testkit.moto import MotoServer

from outboxd.errors import InvalidState
from outboxd.metrics import Metrics
from outboxd.queue.sqs import SqsQueues
from outboxd.services.admin import AdminService
from outboxd.services.retries import publish_failure
from outboxd.storage.store import SqlStore
from outboxd.workers.publishing import message_body
from outboxd.workers.relay import Relay
from tests.conftest import SettingsFactory
from tests.integration.conftest import Client

# The consumer's rig and fake portal, as fixtures of this module too.
from tests.support.clock import Clock
from tests.support.consumer_rig import Rig, RigFactory
from tests.support.db import raw_rows
from tests.support.ops import placeholder_job
from tests.support.sqs import read_all, send_to_dlq
from tests.support.waits import eventually

LINK = {"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD}


async def sealed_of(db_url: str, job_id: str) -> list[dict[str, Any]]:
    """The credentials columns as stored (read directly, not through the store)."""
    return await raw_rows(db_url, "SELECT sealed, key_id FROM jobs WHERE id = ?", job_id)


async def event_types(store: SqlStore, job_id: str) -> list[tuple[str, str]]:
    return [(e.type, e.status) for e in await store.job_events(job_id)]


def assert_ends_cancelled(timeline: list[tuple[str, str]]) -> None:
    """A run stopped by a cancel: its timeline ends `cancel_requested`, then `cancelled`, and
    in between only the progress steps the worker held when it stopped, written before its
    outcome (docs/decisions/0037-progress-written-per-interval.md)."""
    asked = timeline.index(("cancel_requested", "RUNNING"))
    assert timeline[-1] == ("cancelled", "CANCELLED"), timeline
    assert set(timeline[asked + 1 : -1]) <= {("progress", "RUNNING")}, timeline


async def test_a_queued_job_is_cancelled_at_once_and_never_published(
    two_role_api: tuple[Client, str, str],
    store: SqlStore,
    db_url: str,
    make_settings: SettingsFactory,
    moto_server: MotoServer,
    queue_names: dict[str, str],
) -> None:
    client, user, admin = two_role_api
    auth = {"Authorization": f"Bearer {user}"}
    posted = await client.post(
        "/v1/portal-link-jobs", json=LINK, headers={**auth, "Idempotency-Key": "c-q"}
    )
    assert posted.status == 202
    job_id = (await posted.json())["jobId"]
    assert (await posted.json())["status"] == "QUEUED"  # no queue in this API: not published
    assert len(await raw_rows(db_url, "SELECT id FROM relay_outbox WHERE job_id = ?", job_id)) == 1

    cancelled = await client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert cancelled.status == 202
    assert cancelled.headers["Location"] == f"/v1/jobs/{job_id}"
    body = await cancelled.json()
    assert (body["status"], body["cancelRequested"]) == ("CANCELLED", True)
    assert body["finishedAt"] is not None
    assert await sealed_of(db_url, job_id) == [{"sealed": None, "key_id": None}]
    assert await raw_rows(db_url, "SELECT id FROM relay_outbox WHERE job_id = ?", job_id) == []
    assert await event_types(store, job_id) == [("accepted", "QUEUED"), ("cancelled", "CANCELLED")]
    [last] = (await store.job_events(job_id))[-1:]
    assert last.detail == {"by": "owner"}

    # Again: 202, nothing new. The admin may too. A replay of the POST: the same job, cancelled.
    again = await client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert again.status == 202 and (await again.json())["status"] == "CANCELLED"
    by_admin = await client.post(
        f"/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {admin}"}
    )
    assert by_admin.status == 202
    assert len(await store.job_events(job_id)) == 2
    replay = await client.post(
        "/v1/portal-link-jobs", json=LINK, headers={**auth, "Idempotency-Key": "c-q"}
    )
    assert replay.status == 202 and replay.headers["Idempotent-Replayed"] == "true"
    replayed = await replay.json()
    assert (replayed["jobId"], replayed["status"], replayed["dispatch"]) == (
        job_id,
        "CANCELLED",
        None,
    )
    got = await client.get(f"/v1/jobs/{job_id}", headers=auth)
    assert (await got.json())["status"] == "CANCELLED"

    # The relay finds nothing to publish for it: the queue stays empty.
    settings = make_settings(
        sqs={"endpoint_url": moto_server.endpoint_url, **queue_names, "wait_time_s": 0}
    )
    async with SqsQueues(settings.sqs, settings.sqs.endpoint_url) as queues:
        relay = Relay(store, queues, settings.relay, Metrics())
        assert await relay.relay_pass() == 0
        depth = await queues.depth("jobs")
        assert (depth.visible, depth.in_flight) == (0, 0)


async def test_who_may_cancel_and_what_cannot_be(
    two_role_api: tuple[Client, str, str], store: SqlStore
) -> None:
    client, user, _admin = two_role_api
    theirs = await _job(store, "carol")
    mine = await _job(store, "bob")
    for job_id, status, code in (
        (theirs, 404, "C04"),  # another user's job: as if it did not exist
        (str(uuid.uuid4()), 404, "C04"),
    ):
        got = await client.post(
            f"/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {user}"}
        )
        assert (got.status, (await got.json())["code"]) == (status, code)
    assert (await store.get_job(theirs)).status == "QUEUED"  # type: ignore[union-attr]
    # Finished otherwise: 409 C11, the job unchanged.
    run = await store.start_job_run(mine, time.time(), 10.0)
    assert run is not None
    assert await store.finish_job(run, "SUCCEEDED", time.time(), result={}) is not None
    got = await client.post(f"/v1/jobs/{mine}/cancel", headers={"Authorization": f"Bearer {user}"})
    assert (got.status, (await got.json())["code"]) == (409, "C11")
    assert (await store.get_job(mine)).status == "SUCCEEDED"  # type: ignore[union-attr]
    dead = await _job(store, "bob")
    assert await store.mark_job_dead(dead, ("RETRIES_EXHAUSTED", "x"), time.time()) is not None
    with pytest.raises(InvalidState):
        await store.cancel_job(dead, time.time(), "admin")


async def test_a_running_job_stops_before_its_next_portal_request(
    make_rig: RigFactory,
    store: SqlStore,
    db_url: str,
) -> None:
    rig = await make_rig()
    rig.portal.delay_s = 0.6  # every request is in flight for a while
    rig.start_consumer()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)

    async def a_request_in_flight() -> bool:
        return len(rig.portal.requests) >= 2 and rig.portal._in_flight == 1

    await eventually(a_request_in_flight, 15, what="the job's second portal request in flight")
    job, outcome = await store.cancel_job(job_id, time.time(), "owner")
    seen_at_cancel = len(rig.portal.requests)
    assert (outcome, job.status, job.cancel_requested) == ("requested", "RUNNING", True)
    assert job.sealed is not None  # the worker still holds it

    done = await rig.wait_status(job_id, "CANCELLED", "SUCCEEDED", "FAILED", "DEAD")
    assert done.status == "CANCELLED"
    await rig.wait_queue_empty()  # the message was deleted: the run is over
    assert len(rig.portal.requests) == seen_at_cancel, rig.portal.requests[seen_at_cancel:]
    assert await sealed_of(db_url, job_id) == [{"sealed": None, "key_id": None}]
    assert done.result is None and done.finished_at is not None
    timeline = await event_types(store, job_id)
    assert_ends_cancelled(timeline)
    assert [t for t, _ in timeline].count("started") == 1
    [last] = (await store.job_events(job_id))[-1:]
    assert last.detail == {"by": "consumer"}


async def test_a_job_waiting_on_the_queue_is_cancelled_and_its_message_deleted_unrun(
    make_rig: RigFactory,
    store: SqlStore,
    db_url: str,
) -> None:
    rig = await make_rig()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)  # on the queue, nobody consuming
    assert (await rig.job(job_id)).status == "RUNNING"
    job, outcome = await store.cancel_job(job_id, time.time(), "admin")
    assert (outcome, job.status) == ("cancelled", "CANCELLED")
    assert await sealed_of(db_url, job_id) == [{"sealed": None, "key_id": None}]

    rig.start_consumer()
    await eventually(_received(rig, job_id), 15, what="the message received")
    await rig.wait_queue_empty()
    assert rig.portal.requests == []  # nothing ran
    assert (await rig.job(job_id)).status == "CANCELLED"
    assert await event_types(store, job_id) == [
        ("accepted", "QUEUED"),
        ("dispatched", "RUNNING"),
        ("cancelled", "CANCELLED"),
    ]


async def test_a_requested_cancel_whose_worker_died_ends_at_the_next_receive(
    make_rig: RigFactory,
    store: SqlStore,
) -> None:
    """The holder died with the job leased: the cancel is only requested; once the lease is
    out the message comes back and the job ends CANCELLED, unrun."""
    rig = await make_rig()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)
    held = await store.start_job_run(job_id, time.time(), 2.0)  # a worker that then dies
    assert held is not None
    _, outcome = await store.cancel_job(job_id, time.time(), "owner")
    assert outcome == "requested"
    rig.start_consumer()
    assert (await rig.wait_status(job_id, "CANCELLED", timeout_s=20)).status == "CANCELLED"
    await rig.wait_queue_empty()
    assert rig.portal.requests == []
    assert [t for t, _ in await event_types(store, job_id)].count("started") == 1


@pytest.mark.parametrize("round_", range(4))
async def test_cancel_and_redrive_never_race_into_a_running_job(
    store: SqlStore, round_: int
) -> None:
    job_id = await _job(store, "bob")
    assert await store.mark_job_dead(job_id, ("RETRIES_EXHAUSTED", "x"), time.time()) is not None
    admin = AdminService(store)
    cancel, redrive = await asyncio.gather(
        store.cancel_job(job_id, time.time(), "admin"),
        admin.redrive_job(job_id, actor="test"),
        return_exceptions=True,
    )
    # A DEAD job cannot be cancelled, whichever comes first: the redrive wins.
    assert isinstance(cancel, InvalidState) or (
        isinstance(cancel, tuple) and cancel[1] == "cancelled"
    ), cancel
    if isinstance(cancel, InvalidState):
        assert not isinstance(redrive, BaseException)
        # Now QUEUED: cancelled at once, its fresh outbox row with it; no redrive after.
        job, outcome = await store.cancel_job(job_id, time.time(), "admin")
        assert (outcome, job.status) == ("cancelled", "CANCELLED")
    with pytest.raises(InvalidState):
        await admin.redrive_job(job_id, actor="test")
    job = await store.get_job(job_id)
    assert job is not None and job.status == "CANCELLED"
    rows = await store.relay_rows_for_job(job_id, 10)
    assert all(r.status not in ("PENDING", "RETRYABLE_FAILED") for r in rows), rows
    # The worker's start loses to a cancel, and cannot start it after.
    assert await store.start_job_run(job_id, time.time(), 10.0) is None
    events = await store.job_events(job_id)
    assert events[-1].status == "CANCELLED"


@pytest.mark.parametrize("round_", range(4))
async def test_cancel_and_a_workers_start_end_one_way_or_the_other(
    store: SqlStore, round_: int
) -> None:
    job_id = await _job(store, "bob")
    now = time.time()
    cancel, started = await asyncio.gather(
        store.cancel_job(job_id, now, "owner"), store.start_job_run(job_id, now, 30.0)
    )
    job = await store.get_job(job_id)
    assert job is not None
    if started is None:  # the cancel came first: never started
        assert cancel[1] == "cancelled" and job.status == "CANCELLED"
    else:  # the worker came first: the cancel waits for it
        assert cancel[1] == "requested"
        assert (job.status, job.cancel_requested, job.sealed is not None) == (
            "RUNNING",
            True,
            True,
        )
        assert await store.finish_cancelled(started, time.time()) is not None
    assert (await store.job_events(job_id))[-1].status == (await store.get_job(job_id)).status  # type: ignore[union-attr]


# ---------------------------------------------------------------- the paths off the happy one


async def _published(rig: Rig, clock: Clock) -> tuple[str, str]:
    """A job published (its outbox row SENT, the job RUNNING, nobody holding it): the job
    id and the body of its message."""
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD)
    claimed = await rig.store.claim_relay_row(outbox_id, clock.now, 30)
    assert claimed is not None
    assert await rig.store.mark_relay_sent([(claimed, "m-1")], clock.now)
    assert (await rig.job(job_id)).status == "RUNNING"
    return job_id, message_body(claimed)


async def test_the_dlq_sweep_deletes_a_cancelled_jobs_letter(make_rig: RigFactory) -> None:
    """The DLQ keeps exactly the DEAD work: a CANCELLED job's letter is deleted, the job
    left as it is."""
    rig = await make_rig()
    clock = Clock()
    job_id, body = await _published(rig, clock)
    job, outcome = await rig.store.cancel_job(job_id, clock.now, "owner")
    assert (outcome, job.status) == ("cancelled", "CANCELLED")
    await send_to_dlq(rig.queues, "jobs", [body])

    with capture_logs() as logs:
        swept = await rig.consumer(clock=clock).sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead, swept.kept) == (1, 0, 0)
    assert await read_all(rig.queues, "jobs", dlq=True) == []
    deleted = [e for e in logs if e["event"] == "dlq_message_deleted"]
    assert [e["job_id"] for e in deleted] == [job_id]
    assert await rig.job(job_id) == job


async def test_the_dlq_sweep_ends_a_cancel_requested_job_cancelled_not_dead(
    make_rig: RigFactory, db_url: str
) -> None:
    """A RUNNING job whose cancel was requested, its holder gone and its letter in the DLQ:
    the sweep ends it CANCELLED (as asked), not DEAD, and deletes the letter."""
    rig = await make_rig()
    clock = Clock()
    job_id, body = await _published(rig, clock)
    held = await rig.store.start_job_run(job_id, clock.now, 60)  # a worker that then dies
    assert held is not None
    _, outcome = await rig.store.cancel_job(job_id, clock.now, "owner")
    assert outcome == "requested"
    await send_to_dlq(rig.queues, "jobs", [body])
    consumer = rig.consumer(clock=clock)

    swept = await consumer.sweep_dlq_once()  # the lease is live: left alone
    assert (swept.deleted, swept.marked_dead, swept.kept) == (0, 0, 1)
    clock.now += 61  # the lease ran out with nobody finishing the job
    swept = await consumer.sweep_dlq_once()
    assert (swept.deleted, swept.marked_dead) == (1, 0)
    done = await rig.job(job_id)
    assert (done.status, done.error_code) == ("CANCELLED", None)
    assert await sealed_of(db_url, job_id) == [{"sealed": None, "key_id": None}]
    assert await read_all(rig.queues, "jobs", dlq=True) == []
    assert (await event_types(rig.store, job_id))[-1] == ("cancelled", "CANCELLED")


async def test_a_cancel_requested_during_a_run_failing_at_its_last_receive_ends_cancelled(
    make_rig: RigFactory,
) -> None:
    """The run's portal request fails (retryable) at the last receive SQS allows, after its
    cancel was requested: the job ends CANCELLED and its message is deleted; it does not go
    DEAD, nor its message to the DLQ."""
    rig = await make_rig(sqs={"max_receive_count": 1})
    rig.portal.delay_s = 3.0  # the first request stays in flight for a while
    rig.start_consumer()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)

    async def a_request_in_flight() -> bool:
        return rig.portal._in_flight == 1

    await eventually(a_request_in_flight, 15, what="the job's first portal request in flight")
    rig.portal.always_fail_503 = True  # the request in flight answers 503
    job, outcome = await rig.store.cancel_job(job_id, time.time(), "owner")
    assert (outcome, job.status) == ("requested", "RUNNING")

    done = await rig.wait_status(job_id, "CANCELLED", "SUCCEEDED", "FAILED", "DEAD")
    assert (done.status, done.error_code) == ("CANCELLED", None)
    await rig.wait_queue_empty(dlq=0)
    assert len(rig.receiver.receives_of(job_id)) == 1
    assert_ends_cancelled(await event_types(rig.store, job_id))


async def test_a_backed_off_outbox_row_of_a_cancelled_job_is_never_published(
    make_rig: RigFactory,
) -> None:
    """A job whose publish failed and backed off (its outbox row RETRYABLE_FAILED, due
    again) is cancelled: the relay never sends it after."""
    rig = await make_rig()
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD)
    now = time.time()
    claimed = await rig.store.claim_relay_row(outbox_id, now, 30)
    assert claimed is not None
    await rig.store.mark_relay_failed([publish_failure(claimed, "sqs down", now, dead=False)], now)
    row = await rig.store.get_relay_row(outbox_id)
    assert row is not None and row.status == "RETRYABLE_FAILED"

    job, outcome = await rig.store.cancel_job(job_id, time.time(), "owner")
    assert (outcome, job.status) == ("cancelled", "CANCELLED")
    relay = Relay(rig.store, rig.publisher, rig.settings.relay, Metrics())
    assert await relay.relay_pass() == 0
    assert not await relay.publish_now(outbox_id)
    assert rig.publisher.bodies == []
    depth = await rig.queues.depth("jobs")
    assert (depth.visible, depth.in_flight) == (0, 0)
    assert (await rig.job(job_id)).status == "CANCELLED"


async def test_a_second_cancel_of_a_running_job_changes_nothing(
    two_role_api: tuple[Client, str, str], store: SqlStore
) -> None:
    """Cancelling a RUNNING job again while its worker has not stopped yet: 202, nothing
    recorded (one `cancel_requested` event), the job's ETag unchanged."""
    client, user, admin = two_role_api
    job_id = await _job(store, "bob")
    assert await store.start_job_run(job_id, time.time(), 60.0) is not None  # a worker holds it
    auth = {"Authorization": f"Bearer {user}"}

    first = await client.post(f"/v1/jobs/{job_id}/cancel", headers=auth)
    assert first.status == 202
    body = await first.json()
    assert (body["status"], body["cancelRequested"]) == ("RUNNING", True)
    got = await client.get(f"/v1/jobs/{job_id}", headers=auth)
    etag = got.headers["ETag"]
    events = await store.job_events(job_id)

    for token in (user, admin):
        again = await client.post(
            f"/v1/jobs/{job_id}/cancel", headers={"Authorization": f"Bearer {token}"}
        )
        assert again.status == 202
        assert ((await again.json())["status"], again.headers.get("ETag", etag)) == (
            "RUNNING",
            etag,
        )
    assert await store.job_events(job_id) == events
    assert [e.type for e in events].count("cancel_requested") == 1
    unchanged = await client.get(f"/v1/jobs/{job_id}", headers={**auth, "If-None-Match": etag})
    assert unchanged.status == 304
    assert (await client.get(f"/v1/jobs/{job_id}", headers=auth)).headers["ETag"] == etag


def _received(rig: Any, job_id: str) -> Any:
    async def check() -> bool:
        return bool(rig.receiver.receives_of(job_id))

    return check


async def _job(store: SqlStore, user: str) -> str:
    job_id = str(uuid.uuid4())
    intake = await store.create_portal_job(
        placeholder_job(job_id, str(uuid.uuid4()), f"k-{job_id}", user), now=time.time()
    )
    assert intake.created
    return job_id
