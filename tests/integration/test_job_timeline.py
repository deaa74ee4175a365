"""A job's timeline (GET /v1/jobs/{id}/events, `job_events`) on both backends: every change
of a job records its event with it, in order, with the job's status after it; events go
with the job when it is pruned; the admin job list's filters.

The whole life of one job runs for real: the consumer in-process against moto and the
strict fake portal (failing, then answering), a redrive, the relay.
"""

from __future__ import annotations

import time
import uuid

from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.metrics import Metrics
from outboxd.queue.messages import encode_job
from outboxd.queue.sqs import OutgoingMessage
from outboxd.services.admin import AdminService
from outboxd.storage.ports import JobEvent, JobFilter, RelayFailure
from outboxd.storage.store import SqlStore
from outboxd.workers.relay import Relay
from tests.integration.conftest import Client

# The consumer's rig and fake portal, as fixtures of this module too.
from tests.support.consumer_rig import RigFactory
from tests.support.db import raw_rows
from tests.support.ops import placeholder_job
from tests.support.waits import eventually


def types(events: list[JobEvent]) -> list[str]:
    return [e.type for e in events]


def assert_agrees(events: list[JobEvent], status: str, attempts: int) -> None:
    """What every timeline must hold: increasing seqs, and the last event is the job."""
    seqs = [e.seq for e in events]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs), seqs
    assert (events[-1].status, events[-1].attempt) == (status, attempts), events[-1]


async def test_a_retried_dead_and_redriven_job_has_its_whole_timeline(
    make_rig: RigFactory,
    store: SqlStore,
    db_url: str,
) -> None:
    rig = await make_rig()
    rig.portal.always_fail_503 = True
    rig.start_consumer()
    job_id = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD)
    dead = await rig.wait_status(job_id, "DEAD")

    rig.portal.always_fail_503 = False
    redriven = await AdminService(store).redrive_job(job_id, actor="test")
    assert redriven.status == "QUEUED"
    fresh = await store.latest_relay_row_for_job(job_id)
    assert fresh is not None
    relay = Relay(store, rig.publisher, rig.settings.relay, Metrics())
    assert await relay.publish_now(fresh.id)
    done = await rig.wait_status(job_id, "SUCCEEDED")

    events = await store.job_events(job_id)
    # In causal order: a run starts only once its publish's SENT mark (`dispatched`) committed.
    lived = [e for e in events if e.type != "progress"]
    assert [(e.type, e.status) for e in lived] == [
        ("accepted", "QUEUED"),
        ("dispatched", "RUNNING"),
        # max_receive_count 3: two retries, then DEAD at the third receive
        ("started", "RUNNING"),
        ("retry_scheduled", "RUNNING"),
        ("started", "RUNNING"),
        ("retry_scheduled", "RUNNING"),
        ("started", "RUNNING"),
        ("dead", "DEAD"),
        ("redriven", "QUEUED"),
        ("dispatched", "RUNNING"),
        ("started", "RUNNING"),
        ("succeeded", "SUCCEEDED"),
    ]
    assert_agrees(events, "SUCCEEDED", done.attempts)
    assert done.attempts == 4 and dead.attempts == 3
    by_type: dict[str, list[JobEvent]] = {}
    for e in events:
        by_type.setdefault(e.type, []).append(e)
    assert [e.attempt for e in by_type["started"]] == [1, 2, 3, 4]
    assert [(e.detail or {}).get("receiveCount") for e in by_type["started"]] == [1, 2, 3, 1]
    for e in by_type["retry_scheduled"]:
        assert e.detail == {"code": "PORTAL_UNAVAILABLE", "delayS": 0}
    assert by_type["dead"][0].detail == {"code": "RETRIES_EXHAUSTED"}
    rows = await store.relay_rows_for_job(job_id, 10)
    sent = {r.id: r.queue_message_id for r in rows}
    assert len(sent) == 2
    assert {
        ((e.detail or {})["outboxId"], (e.detail or {})["messageId"]) for e in by_type["dispatched"]
    } == set(sent.items())
    assert by_type["redriven"][0].detail == {"outboxId": fresh.id, "by": "test"}
    assert [e.detail for e in by_type["progress"]][-1] == {"step": "GRADES", "done": 3, "total": 3}
    assert {e.instance for e in events} == {store.instance}
    assert all(0 < e.at <= time.time() for e in events)
    # As stored: nothing beyond what the records say.
    raw = await raw_rows(db_url, "SELECT COUNT(*) AS n FROM job_events WHERE job_id = ?", job_id)
    assert raw == [{"n": len(events)}]


async def test_a_message_that_arrives_before_its_sent_mark_starts_after_the_mark(
    make_rig: RigFactory, store: SqlStore
) -> None:
    """SQS hands the message out as soon as it has it, and the publisher's SENT mark (with the
    `dispatched` event) commits only after SQS's answer: a consumer can hold the message of a
    job still QUEUED. The run waits for the mark, so the timeline reads in causal order, and
    the wait spends no receive."""
    rig = await make_rig()
    rig.start_consumer()
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD)
    claimed = await store.claim_relay_row(outbox_id, time.time(), 30)
    assert claimed is not None
    sent = await rig.queues.send_batch(
        "jobs", [OutgoingMessage(outbox_id, encode_job(job_id, outbox_id))]
    )
    await eventually(lambda: rig.receiver.receives_of(job_id), 10, what="the consumer's receive")
    assert (await rig.job(job_id)).status == "QUEUED"  # held for the mark, not started
    await store.mark_relay_sent([(claimed, sent.successful[outbox_id])], time.time())
    await rig.wait_status(job_id, "SUCCEEDED")

    events = await store.job_events(job_id)
    assert types(events)[:3] == ["accepted", "dispatched", "started"], types(events)
    assert types(events)[-1] == "succeeded"
    assert len(rig.receiver.receives_of(job_id)) == 1
    # No bounce: a wait longer than half the visibility only renews it, for the whole timeout.
    visibility = rig.settings.sqs.visibility_timeout_s
    assert all(seconds == visibility for _, seconds in rig.receiver.visibility_changes)


async def test_a_failed_publish_is_an_event_that_leaves_the_job_as_it_was(
    store: SqlStore,
) -> None:
    job_id, outbox_id = await _job(store, "pub-fail")
    row = await store.claim_relay_row(outbox_id, time.time(), 5)
    assert row is not None
    now = time.time()
    failure = RelayFailure(row, "Throttled: slow down", now + 1, False)
    await store.record_relay_outcome([], [failure], now)
    events = await store.job_events(job_id)
    assert types(events) == ["accepted", "dispatch_failed"]
    assert events[-1].detail == {"error": "Throttled: slow down"}
    assert_agrees(events, "QUEUED", 0)
    # after: only what came since
    assert types(await store.job_events(job_id, after=events[0].seq)) == ["dispatch_failed"]
    assert await store.job_events(job_id, after=events[-1].seq) == []


async def test_a_refused_change_records_nothing(store: SqlStore) -> None:
    """A guarded update that changes nothing writes no event (no event without its change)."""
    job_id, _ = await _job(store, "stale")
    run = await store.start_job_run(job_id, 100.0, 10.0)
    assert run is not None
    assert await store.finish_job(run, "SUCCEEDED", 101.0, result={"ok": 1}) is not None
    before = await store.job_events(job_id)
    assert await store.finish_job(run, "FAILED", 102.0, error=("X", "y")) is None
    assert await store.start_job_run(job_id, 200.0, 10.0) is None
    assert await store.mark_job_dead(job_id, ("X", "y"), 103.0) is None
    assert await store.update_job_progress(run, {"step": "LOGIN"}, 104.0) is None
    assert await store.job_events(job_id) == before
    assert types(before) == ["accepted", "started", "succeeded"]
    assert_agrees(before, "SUCCEEDED", 1)


async def test_pruning_a_job_takes_its_events_and_only_its(store: SqlStore, db_url: str) -> None:
    old_id, _ = await _job(store, "old")
    kept_id, _ = await _job(store, "kept")
    for job_id, at in ((old_id, 1000.0), (kept_id, time.time())):
        run = await store.start_job_run(job_id, at, 10.0)
        assert run is not None
        assert await store.finish_job(run, "SUCCEEDED", at + 1, result={}) is not None
    totals = await store.prune(time.time() - 3600, 0.0, 0.0, batch=1)
    assert totals["finished_jobs"] == 1
    assert await store.get_job(old_id) is None
    q = "SELECT job_id, COUNT(*) AS n FROM job_events GROUP BY job_id"
    assert await raw_rows(db_url, q) == [{"job_id": kept_id, "n": 3}]


async def test_the_api_shows_the_timeline_to_its_owner_and_admins_only(
    two_role_api: tuple[Client, str, str], store: SqlStore
) -> None:
    client, user, admin = two_role_api
    resp = await client.post(
        "/v1/portal-link-jobs",
        json={"portal": "suwon", "username": "u", "password": "p-secret-1"},
        headers={"Authorization": f"Bearer {user}", "Idempotency-Key": "tl-1"},
    )
    assert resp.status == 202
    job_id = (await resp.json())["jobId"]
    for token in (user, admin):
        got = await client.get(
            f"/v1/jobs/{job_id}/events", headers={"Authorization": f"Bearer {token}"}
        )
        assert got.status == 200
        body = await got.json()
        assert body["jobId"] == job_id
        [event] = body["events"]
        assert set(event) == {"seq", "at", "type", "status", "attempt", "instance", "detail"}
        assert (event["type"], event["status"], event["attempt"]) == ("accepted", "QUEUED", 0)
        assert event["instance"] == store.instance
        assert event["at"].endswith("Z")
    after = await client.get(
        f"/v1/jobs/{job_id}/events?after={event['seq']}",
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert (await after.json())["events"] == []
    # Another user's job, a missing one, a bad `after`.
    other = await _job(store, "theirs", user="carol")
    for path, status, code in (
        (f"/v1/jobs/{other[0]}/events", 404, "C04"),
        (f"/v1/jobs/{uuid.uuid4()}/events", 404, "C04"),
        (f"/v1/jobs/{job_id}/events?after=-1", 400, "C01"),
        (f"/v1/jobs/{job_id}/events?after=x", 400, "C01"),
    ):
        got = await client.get(path, headers={"Authorization": f"Bearer {user}"})
        assert (got.status, (await got.json())["code"]) == (status, code), path


async def test_the_admin_job_list_filters_by_user_status_error_and_time(
    two_role_api: tuple[Client, str, str], store: SqlStore
) -> None:
    client, user, admin = two_role_api
    t0 = 1_700_000_000.0
    made: dict[str, str] = {}
    for i, (who, at) in enumerate(
        [("ann", t0), ("ann", t0 + 10), ("ben", t0 + 20), ("ann", t0 + 30), ("ben", t0 + 40)]
    ):
        made[f"{who}{i}"], _ = await _job(store, f"f{i}", user=who, now=at)
    dead = made["ann3"]
    assert await store.mark_job_dead(dead, ("RETRIES_EXHAUSTED", "x"), t0 + 31) is not None
    auth = {"Authorization": f"Bearer {admin}"}

    async def ids(query: str) -> list[str]:
        got = await client.get(f"/v1/admin/jobs?{query}", headers=auth)
        assert got.status == 200, await got.text()
        return [j["jobId"] for j in (await got.json())["items"]]

    assert await ids("user=ann") == [made["ann3"], made["ann1"], made["ann0"]]
    assert await ids("user=ann&status=DEAD") == [dead]
    assert await ids("errorCode=RETRIES_EXHAUSTED") == [dead]
    assert await ids("status=QUEUED&user=ben") == [made["ben4"], made["ben2"]]
    assert await ids("from=2023-11-14T22:13:30Z&to=2023-11-14T22:13:45Z") == [
        made["ben2"],
        made["ann1"],
    ]
    # The same instant with an offset, and an empty range.
    assert await ids("from=2023-11-14T23:13:30%2B01:00&to=2023-11-14T23:13:45%2B01:00") == [
        made["ben2"],
        made["ann1"],
    ]
    assert await ids("from=2030-01-01T00:00:00Z&to=2020-01-01T00:00:00Z") == []
    # Keyset pages with the filters kept.
    page = await client.get("/v1/admin/jobs?user=ann&limit=2", headers=auth)
    first = await page.json()
    assert [j["jobId"] for j in first["items"]] == [made["ann3"], made["ann1"]]
    query = f"user=ann&limit=2&cursor={first['nextCursor']}"
    nxt = await client.get(f"/v1/admin/jobs?{query}", headers=auth)
    assert [j["jobId"] for j in (await nxt.json())["items"]] == [made["ann0"]]
    # Refused, naming the field; a user token may not list.
    for query, field in (
        ("from=yesterday", "from"),
        ("to=2024-13-01T00:00:00Z", "to"),
        ("from=2024-01-01", "from"),
        ("errorCode=lower", "errorCode"),
        ("user=", "user"),
        ("status=DONE", "status"),
        ("usr=ann", "usr"),
    ):
        got = await client.get(f"/v1/admin/jobs?{query}", headers=auth)
        body = await got.json()
        assert got.status == 400 and body["code"] == "C01", query
        assert body["errors"][0]["field"] == field, (query, body)
    got = await client.get("/v1/admin/jobs?user=ann", headers={"Authorization": f"Bearer {user}"})
    assert got.status == 403
    # The store's own filter, as the console's search uses it.
    page2 = await store.list_jobs(None, 10, None, JobFilter(user_id="ben", created_to=t0 + 40))
    assert [j.id for j in page2.items] == [made["ben2"]]


async def _job(
    store: SqlStore, key: str, user: str = "alice", now: float | None = None
) -> tuple[str, str]:
    job_id, outbox_id = str(uuid.uuid4()), str(uuid.uuid4())
    intake = await store.create_portal_job(
        placeholder_job(job_id, outbox_id, key, user), now=time.time() if now is None else now
    )
    assert intake.created
    return job_id, outbox_id
