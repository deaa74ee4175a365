"""`api.require_dispatch`: a job that could not be put on the queue answers 503 C08.

The job and its outbox row are committed either way (the relay delivers them later);
with `require_dispatch` the client is told it was not queued yet and retries with the
same Idempotency-Key. On both backends; SQS is a real (embedded moto) server stopped
for the outage.
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from aiohttp.test_utils import TestClient, TestServer

from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.queue.embedded import EmbeddedSqs
from outboxd.queue.sqs import SqsQueues
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from outboxd.workers.relay import Relay
from tests.conftest import SettingsFactory
from tests.support.clock import Clock
from tests.support.relay import GatedPublisher, drain, relay_settings
from tests.support.waits import Calls

URL = "/v1/portal-link-jobs"
BODY = {"portal": "suwon", "username": "20201234", "password": "pw-dispatch"}

Client = TestClient[Any, Any]


async def client_for(deps: Any) -> Client:
    client: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await client.start_server()
    return client


async def post(client: Client, key: str) -> tuple[int, dict[str, Any], dict[str, str]]:
    resp = await client.post(URL, json=BODY, headers={"Idempotency-Key": key})
    return resp.status, await resp.json(content_type=None), dict(resp.headers)


async def test_without_a_queue_require_dispatch_answers_503_c08_and_keeps_the_job(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    strict = await client_for(
        build_api_deps(
            make_settings(api={"require_dispatch": True}),
            store,
            keys,
            Metrics(),
            queues=None,
            dispatcher=None,
        )
    )
    lenient = await client_for(
        build_api_deps(make_settings(), store, keys, Metrics(), queues=None, dispatcher=None)
    )
    try:
        status, body, headers = await post(strict, "k-strict")
        assert status == 503, body
        assert body["code"] == "C08" and headers.get("Retry-After") == "1"
        [row] = (await store.list_relay_rows(None, 10, None)).items
        assert row.status == "PENDING" and row.job_id is not None
        assert row.job_id in body["detail"]  # the job was stored: the client may retry
        job = await store.get_job(row.job_id)
        assert job is not None and job.status == "QUEUED"

        # The retry with the same key finds the same job, still not queued: 503 again.
        status, again, _ = await post(strict, "k-strict")
        assert status == 503 and again["code"] == "C08"
        assert row.job_id in again["detail"]
        assert len((await store.list_relay_rows(None, 10, None)).items) == 1

        # Without require_dispatch the same situation is a 202 QUEUED.
        status, body, _ = await post(lenient, "k-lenient")
        assert status == 202, body
        assert body["status"] == "QUEUED" and body["dispatch"]["status"] == "PENDING"
    finally:
        await strict.close()
        await lenient.close()


async def test_with_sqs_down_require_dispatch_answers_503_c08_and_202_once_it_is_back(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> None:
    tag = uuid.uuid4().hex[:12]
    async with EmbeddedSqs() as sqs:
        settings = make_settings(
            api={"require_dispatch": True},
            sqs={
                "endpoint_url": sqs.endpoint_url,
                "jobs_queue": f"t{tag}-jobs",
                "tasks_queue": f"t{tag}-tasks.fifo",
            },
            relay={"publish_timeout_s": 3.0},
        )
        async with SqsQueues(settings.sqs, sqs.endpoint_url) as queues:
            relay = Relay(store, queues, settings.relay, Metrics())
            client = await client_for(
                build_api_deps(settings, store, keys, Metrics(), queues, relay)
            )
            try:
                status, body, _ = await post(client, "k-up")
                assert status == 202, body
                assert body["dispatch"]["status"] == "SENT" and body["status"] == "RUNNING"

                await sqs.stop()
                status, body, headers = await post(client, "k-down")
                assert status == 503, body
                assert body["code"] == "C08" and headers.get("Retry-After") == "1"
                rows = (await store.list_relay_rows("RETRYABLE_FAILED", 10, None)).items
                assert len(rows) == 1 and rows[0].job_id in body["detail"]
            finally:
                await client.close()


async def test_a_replay_while_the_relay_loop_fails_its_publish_is_503_c08(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    """A replay finds the row held by the relay loop, whose publish then fails: the
    request waits for that outcome and is told the truth, 503 C08 (the row is
    RETRYABLE_FAILED), not "dispatched"."""
    settings = make_settings(api={"require_dispatch": True})
    clock = Clock()
    # Fails every entry; once `hold` is set, the relay loop's publish waits in flight.
    pub = GatedPublisher(queues, fail=lambda _m: "ServiceUnavailable", hold=False)
    relay = Relay(store, pub, relay_settings(), Metrics(), clock=clock)
    client = await client_for(build_api_deps(settings, store, keys, Metrics(), queues, relay))
    try:
        status, body, _ = await post(client, "k-held")
        assert status == 503 and body["code"] == "C08", body  # its own publish failed
        (row,) = (await store.list_relay_rows("RETRYABLE_FAILED", 10, None)).items

        clock.now = row.next_attempt_at + 0.001  # due: the loop takes it
        pub.hold = True
        loop_round = asyncio.create_task(relay.relay_once())
        await asyncio.wait_for(pub.entered.wait(), 10)
        held = await store.get_relay_row(row.id)
        assert held is not None and (held.claimed_until or 0) > clock.now

        looks = Calls(store, "get_relay_row")
        replay = asyncio.create_task(post(client, "k-held"))
        # Ordering only (the replay meets the row while it is held); the answer below
        # must be the same if the loop's outcome lands first.
        await looks.reach(1)
        pub.gate.set()
        status, body, headers = await asyncio.wait_for(replay, 10)
        await loop_round
        assert status == 503, body
        assert body["code"] == "C08" and headers.get("Retry-After") == "1"
        after = await store.get_relay_row(row.id)
        assert after is not None and after.status == "RETRYABLE_FAILED"
    finally:
        await client.close()


async def test_a_replay_while_the_first_publish_is_out_sends_no_second_copy(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing, queues: SqsQueues
) -> None:
    """The first request's publish is still out (its SendMessageBatch in flight) when a
    replay of it arrives: the replay waits for that publish and answers what it sent; it
    does not send the job again (one entry handed to SQS, one message on the queue)."""
    pub = GatedPublisher(queues)  # every batch waits for the gate
    relay = Relay(store, pub, relay_settings(), Metrics())
    client = await client_for(
        build_api_deps(make_settings(), store, keys, Metrics(), queues, relay)
    )
    try:
        intakes = Calls(store, "create_portal_job")
        first = asyncio.create_task(post(client, "k-out"))
        await asyncio.wait_for(pub.entered.wait(), 10)  # its publish is out
        replay = asyncio.create_task(post(client, "k-out"))
        await intakes.reach(2)  # the replay read the row while that publish was out
        pub.gate.set()
        (status, body, _), (again, replayed, headers) = await asyncio.wait_for(
            asyncio.gather(first, replay), 15
        )
        assert (status, again) == (202, 202), (body, replayed)
        assert headers["Idempotent-Replayed"] == "true"
        assert replayed["jobId"] == body["jobId"]
        assert body["dispatch"]["status"] == "SENT"
        assert [len(b) for b in pub.batches] == [1]
        assert len(await drain(queues)) == 1
    finally:
        await client.close()
