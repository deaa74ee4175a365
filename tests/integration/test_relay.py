"""The relay against a real SQS (the session's moto), on both backends.

What it must show (issue 3): pending rows go out in batches of at most 10 and are
marked SENT with their MessageId (job -> RUNNING); no row is ever SENT without a
message id; failed entries back off (growing, jittered) with `last_error` and end
DEAD after `relay.max_attempts` (job DEAD, RETRIES_EXHAUSTED); `publish_now`; an
SQS outage, and SQS coming back empty (queues recreated); concurrent relays never
claim one row twice; message bodies carry ids only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

from testkit.moto import MotoServer

from outboxd.metrics import Metrics
from outboxd.queue.sqs import BatchResult, OutgoingMessage, QueueKind, SqsQueues
from outboxd.security import KeyRing
from outboxd.services.admin import AdminService
from outboxd.storage.ports import RelayRow
from outboxd.storage.store import SqlStore, open_store
from outboxd.workers.relay import Relay, RelayShape, relay_shape
from tests.conftest import SettingsFactory
from tests.support.clock import Clock
from tests.support.ops import insert_portal_job
from tests.support.relay import (
    FAIL_REASON,
    GatedPublisher,
    PartialFailurePublisher,
    all_rows,
    assert_no_sent_without_message_id,
    drain,
    relay_settings,
)
from tests.support.waits import Calls, eventually

# ---------------------------------------------------------------- tests


async def test_pending_rows_go_out_in_batches_and_are_marked_sent(
    store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    password = f"pw-{uuid.uuid4()}"
    clock = Clock()
    made = [await insert_portal_job(store, clock.now, keys, password) for _ in range(23)]
    job_of = {outbox_id: job_id for job_id, outbox_id in made}
    pub = PartialFailurePublisher(queues)
    relay = Relay(store, pub, relay_settings(), Metrics(), clock=clock)

    claimed = [await relay.relay_once() for _ in range(2)]

    # One round claims up to ten batches' worth and sends them at once.
    assert claimed == [23, 0]
    assert sorted(len(b) for b in pub.batches) == [3, 10, 10]
    rows = await all_rows(store)
    assert {r.id for r in rows} == set(job_of)
    for r in rows:
        assert r.status == "SENT", r
        assert r.queue_message_id, r
        assert r.sent_at is not None and r.claimed_until is None
        assert r.attempt_count == 1 and r.last_error is None
        job = await store.get_job(job_of[r.id])
        assert job is not None and job.status == "RUNNING"
    assert_no_sent_without_message_id(rows)

    received = await drain(queues)
    assert len(received) == 23
    message_id_of = {r.id: r.queue_message_id for r in rows}
    for message_id, body in received:
        data = json.loads(body)
        # Ids only: no credentials, no payload, nothing the database does not already hold.
        assert set(data) == {"type", "jobId", "outboxId"}
        assert data["type"] == "portal_link"
        assert data["jobId"] == job_of[data["outboxId"]]
        assert message_id_of[data["outboxId"]] == message_id
        assert password not in body and "20201234" not in body
    assert sorted(json.loads(b)["outboxId"] for _, b in received) == sorted(job_of)
    assert all(password not in b for b in pub.bodies)


async def test_failed_entries_back_off_with_jitter_then_die(
    store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    clock = Clock()
    made = [await insert_portal_job(store, clock.now, keys, "pw-x") for _ in range(10)]
    failing = {outbox_id for _, outbox_id in made[:6]}
    pub = PartialFailurePublisher(
        queues, fail=lambda m: FAIL_REASON if m.entry_id in failing else None
    )
    settings = relay_settings(max_attempts=3, backoff_base_s=10.0, backoff_max_s=1000.0)
    relay = Relay(store, pub, settings, Metrics(), clock=clock)

    # Attempt 1: the four good entries are SENT, the six failed ones back off 5-10 s.
    assert await relay.relay_once() == 10
    delays: dict[int, dict[str, float]] = {}
    rows = {r.id: r for r in await all_rows(store)}
    for job_id, outbox_id in made:
        r = rows[outbox_id]
        job = await store.get_job(job_id)
        assert job is not None
        if outbox_id in failing:
            assert r.status == "RETRYABLE_FAILED"
            assert r.queue_message_id is None and r.sent_at is None
            assert r.last_error is not None and "simulated" in r.last_error
            assert r.attempt_count == 1
            assert job.status == "QUEUED"
        else:
            assert r.status == "SENT" and r.queue_message_id
            assert job.status == "RUNNING"
    delays[1] = {i: rows[i].next_attempt_at - clock.now for i in failing}
    assert all(5.0 <= d <= 10.0 for d in delays[1].values()), delays[1]
    # Jitter: rows that failed together do not all come back in the same instant.
    assert len({round(d, 3) for d in delays[1].values()}) > 1
    assert_no_sent_without_message_id(list(rows.values()))

    # Not due yet: nothing is claimed before next_attempt_at.
    clock.now += 4.9
    assert await relay.relay_once() == 0

    # Attempt 2: the step doubles (10-20 s).
    clock.now += 5.2
    assert await relay.relay_once() == 6
    rows = {r.id: r for r in await all_rows(store)}
    delays[2] = {i: rows[i].next_attempt_at - clock.now for i in failing}
    assert all(10.0 <= d <= 20.0 for d in delays[2].values()), delays[2]
    assert all(rows[i].attempt_count == 2 and rows[i].status == "RETRYABLE_FAILED" for i in failing)
    assert sum(delays[2].values()) > sum(delays[1].values())

    # Attempt 3 = relay.max_attempts: DEAD, and the job with it.
    clock.now += 20.1
    assert await relay.relay_once() == 6
    rows = {r.id: r for r in await all_rows(store)}
    for job_id, outbox_id in made:
        if outbox_id not in failing:
            continue
        r = rows[outbox_id]
        assert r.status == "DEAD" and r.attempt_count == 3 and r.queue_message_id is None
        assert r.last_error is not None and "simulated" in r.last_error
        job = await store.get_job(job_id)
        assert job is not None and job.status == "DEAD"
        assert job.error_code == "RETRIES_EXHAUSTED"
        assert job.sealed is not None  # kept for a redrive
    clock.now += 10_000
    assert await relay.relay_once() == 0
    assert_no_sent_without_message_id(list(rows.values()))
    # Only the four good rows ever reached the queue, once each.
    received = await drain(queues)
    assert sorted(json.loads(b)["outboxId"] for _, b in received) == sorted(
        o for _, o in made if o not in failing
    )


async def test_a_row_dead_at_publish_is_one_dead_letter_closed_by_redriving_its_job(
    store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    """SQS refuses the message: the relay gives up on a job's row (row and job DEAD, both
    counted where they died; an SQS that cannot be reached at all would spend no attempt,
    test_relay_outage.py). Redriving the job closes the dead letter: no DEAD row is left,
    the spent row is SUPERSEDED, and the fresh row goes out once SQS takes it."""
    job_id, outbox_id = await insert_portal_job(store, time.time(), keys, "pw-dead")
    refusing = PartialFailurePublisher(queues, fail=lambda m: FAIL_REASON)
    metrics = Metrics()
    failing = Relay(store, refusing, relay_settings(max_attempts=1), metrics)
    assert await failing.relay_once() == 1
    row = await store.get_relay_row(outbox_id)
    assert row is not None and row.status == "DEAD" and row.last_error
    job = await store.get_job(job_id)
    assert job is not None and job.status == "DEAD" and job.error_code == "RETRIES_EXHAUSTED"

    def dead(table: str) -> float | None:
        return metrics.registry.get_sample_value("outboxd_dead_total", {"table": table})

    assert (dead("relay_outbox"), dead("jobs"), dead("task_runs")) == (1, 1, 0)

    await AdminService(store).redrive_job(job_id, actor="test")
    rows = {r.id: r for r in await store.relay_rows_for_job(job_id, 10)}
    assert rows[outbox_id].status == "SUPERSEDED"
    assert rows[outbox_id].last_error == row.last_error  # kept as history
    assert [r.status for r in rows.values() if r.status == "DEAD"] == []
    fresh = next(r for r in rows.values() if r.id != outbox_id)
    assert fresh.status == "PENDING"

    working = Relay(store, queues, relay_settings(), Metrics())
    assert await working.relay_once() == 1
    assert (await store.get_relay_row(fresh.id)).status == "SENT"  # type: ignore[union-attr]
    assert (await store.get_relay_row(outbox_id)).status == "SUPERSEDED"  # type: ignore[union-attr]
    assert [json.loads(b)["outboxId"] for _, b in await drain(queues)] == [fresh.id]


async def test_sqs_outage_backs_off_and_queues_are_recreated_when_sqs_returns(
    store: SqlStore, keys: KeyRing, make_settings: SettingsFactory, tmp_path: Path
) -> None:
    """A real outage (the server process gone), then SQS back *empty* on the same port:
    the relay records the failure, backs off, and once SQS answers recreates the queues
    (sqs.create_queues) and delivers without anyone restarting anything."""
    moto = MotoServer(tmp_path / "private-moto.log")
    moto.start()
    names = {"jobs_queue": f"o{uuid.uuid4().hex[:10]}-jobs", "tasks_queue": "o-tasks.fifo"}
    sqs = make_settings(sqs={"endpoint_url": moto.endpoint_url, **names, "wait_time_s": 0}).sqs
    queues = SqsQueues(sqs, moto.endpoint_url)
    await queues.start()
    try:
        job_id, outbox_id = await insert_portal_job(store, time.time(), keys, "pw-outage")
        relay = Relay(
            store,
            queues,
            relay_settings(
                max_attempts=10, backoff_base_s=0.2, backoff_max_s=0.5, publish_timeout_s=1.0
            ),
            Metrics(),
        )
        moto.stop()
        before = time.time()
        assert await relay.relay_once() == 1
        row = await store.get_relay_row(outbox_id)
        assert row is not None and row.status == "RETRYABLE_FAILED"
        assert row.queue_message_id is None and row.last_error
        assert row.next_attempt_at > before
        job = await store.get_job(job_id)
        assert job is not None and job.status == "QUEUED"

        moto.start()  # same port, no queues any more

        async def retried() -> RelayRow | None:
            await relay.relay_once()
            row = await store.get_relay_row(outbox_id)
            assert row is not None
            return row if row.status != "RETRYABLE_FAILED" else None

        row = await eventually(retried, 20, interval=0.2)
        assert row.status == "SENT", row
        assert row.queue_message_id
        received = await drain(queues)
        assert [json.loads(b)["outboxId"] for _, b in received] == [outbox_id]
        assert received[0][0] == row.queue_message_id
    finally:
        await queues.close()
        moto.stop()


async def test_publish_now_sends_one_request_row_once(
    store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    clock = Clock()
    job_id, outbox_id = await insert_portal_job(store, clock.now, keys, "pw-now")
    pub = PartialFailurePublisher(queues)
    relay = Relay(store, pub, relay_settings(), Metrics(), clock=clock)

    assert await relay.publish_now(outbox_id) is True
    row = await store.get_relay_row(outbox_id)
    job = await store.get_job(job_id)
    assert row is not None and row.status == "SENT" and row.queue_message_id
    assert job is not None and job.status == "RUNNING"
    # Already SENT (a replayed request): reported SENT, not sent again, nor by the loop.
    assert await relay.publish_now(outbox_id) is True
    assert await relay.relay_once() == 0
    assert len(pub.batches) == 1

    # A row another holder has claimed (and never finishes: it died) is left to that
    # holder; the request waits at most one publish timeout (and a second) for it.
    _, other = await insert_portal_job(store, clock.now, keys, "pw-now")
    assert await store.claim_relay_row(other, clock.now, 30.0) is not None
    started = time.monotonic()
    quick = Relay(store, pub, relay_settings(publish_timeout_s=0.5), Metrics(), clock=clock)
    assert await quick.publish_now(other) is False
    assert time.monotonic() - started < 3.0
    held = await store.get_relay_row(other)
    assert held is not None and held.status == "PENDING" and held.queue_message_id is None

    # A failed request publish leaves the row for the relay, RETRYABLE_FAILED.
    _, failing = await insert_portal_job(store, clock.now, keys, "pw-now")
    flaky = PartialFailurePublisher(queues, fail=lambda m: FAIL_REASON)
    assert (
        await Relay(store, flaky, relay_settings(), Metrics(), clock=clock).publish_now(failing)
        is False
    )
    failed_row = await store.get_relay_row(failing)
    assert failed_row is not None and failed_row.status == "RETRYABLE_FAILED"
    assert failed_row.next_attempt_at > clock.now

    received = await drain(queues)
    assert [(json.loads(b)["outboxId"], mid) for mid, b in received] == [
        (outbox_id, row.queue_message_id)
    ]


async def test_concurrent_relays_never_claim_the_same_row(
    backend: str,
    db_url: str,
    store: SqlStore,
    keys: KeyRing,
    queues: SqsQueues,
    tmp_path: Path,
) -> None:
    """Postgres: four relays on four separate SqlStore instances (as four daemons would
    be). SQLite (one instance per file, docs/contract.md#storage): four relays sharing the store."""
    now = time.time()
    made = [await insert_portal_job(store, now, keys, "pw-many") for _ in range(47)]
    stores: list[SqlStore] = []
    if backend == "postgres":
        stores = [await open_store(db_url, tmp_path, 3, 5.0) for _ in range(4)]
    publishers = [PartialFailurePublisher(queues) for _ in range(4)]
    relays = [
        Relay(
            stores[i] if stores else store,
            publishers[i],
            relay_settings(batch_size=5),
            Metrics(),
            # One batch per round, so the four relays take turns over the 47 rows.
            batches_per_round=1,
        )
        for i in range(4)
    ]

    async def run(relay: Relay) -> None:
        while await relay.relay_once():
            pass

    try:
        await asyncio.gather(*(run(r) for r in relays))
    finally:
        for s in stores:
            await s.close()

    claimed = [m.entry_id for p in publishers for batch in p.batches for m in batch]
    assert sorted(claimed) == sorted(o for _, o in made), "a row was claimed twice or never"
    assert sum(1 for p in publishers if p.batches) >= 2, "the relays did not overlap at all"
    rows = await all_rows(store)
    assert all(r.status == "SENT" and r.attempt_count == 1 for r in rows)
    assert_no_sent_without_message_id(rows)
    received = await drain(queues)
    per_outbox: dict[str, int] = {}
    for _, body in received:
        oid = json.loads(body)["outboxId"]
        per_outbox[oid] = per_outbox.get(oid, 0) + 1
    assert per_outbox == {o: 1 for _, o in made}


class OverlapPublisher(PartialFailurePublisher):
    """Counts the sends in progress at once: each waits (bounded) until a second one is
    in progress beside it, so two lanes that truly run side by side are seen to."""

    def __init__(self, inner: SqsQueues) -> None:
        super().__init__(inner)
        self.in_progress = 0
        self.most = 0
        self.two = asyncio.Event()

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        self.in_progress += 1
        self.most = max(self.most, self.in_progress)
        if self.in_progress >= 2:
            self.two.set()
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(0.5):
                    await self.two.wait()
            return await super().send_batch(kind, messages)
        finally:
            self.in_progress -= 1


async def test_relay_lanes_side_by_side_publish_every_row_once(
    store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    """`relay_pass` runs `relay_once` in each lane at once (two on Postgres in the daemon,
    `relay_shape`): the lanes send at the same time, and their claims never take the same
    row, so each row goes out once and is SENT once."""
    now = time.time()
    made = [await insert_portal_job(store, now, keys, "pw-lanes") for _ in range(23)]
    publisher = OverlapPublisher(queues)
    # One batch of five per round: the three lanes take turns over the 23 rows.
    relay = Relay(
        store, publisher, relay_settings(batch_size=5), Metrics(), batches_per_round=1, lanes=3
    )
    total = 0
    while n := await relay.relay_pass():
        total += n
    assert total == 23
    assert publisher.most >= 2, "the lanes never sent side by side"
    claimed = [m.entry_id for batch in publisher.batches for m in batch]
    assert sorted(claimed) == sorted(o for _, o in made), "a row was claimed twice or never"
    rows = await all_rows(store)
    assert all(r.status == "SENT" and r.attempt_count == 1 for r in rows)
    received = await drain(queues)
    assert sorted(json.loads(body)["outboxId"] for _, body in received) == sorted(
        o for _, o in made
    )


def test_the_daemon_runs_two_lanes_on_postgres_and_larger_rounds_on_sqlite() -> None:
    assert relay_shape("postgres") == RelayShape(lanes=2, batches_per_round=10)
    assert relay_shape("sqlite") == RelayShape(lanes=1, batches_per_round=20)


async def test_publish_now_reports_a_publish_the_relay_loop_got_to_first(
    store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    """The relay loop can claim a request's row between the request's commit and its own
    publish. SQS is fine and the row goes out: the request must say so (SENT), not
    answer QUEUED, nor 503 C08 with `api.require_dispatch`."""
    job_id, outbox_id = await insert_portal_job(store, time.time(), keys, "pw-race")
    loop_publisher = GatedPublisher(queues)
    loop = Relay(store, loop_publisher, relay_settings(), Metrics())
    request = Relay(store, PartialFailurePublisher(queues), relay_settings(), Metrics())

    loop_pass = asyncio.create_task(loop.relay_once())
    await asyncio.wait_for(loop_publisher.entered.wait(), 10)  # the loop holds the row
    looks = Calls(store, "get_relay_row")
    published = asyncio.create_task(request.publish_now(outbox_id))
    await looks.reach(1)  # the request found the row in the loop's hands, mid-publish
    loop_publisher.gate.set()

    assert await asyncio.wait_for(published, 10) is True
    row = await store.get_relay_row(outbox_id)
    assert row is not None and row.status == "SENT" and row.queue_message_id
    assert await loop_pass == 1
    received = await drain(queues)
    assert [json.loads(b)["jobId"] for _, b in received] == [job_id]
