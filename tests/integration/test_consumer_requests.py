"""The consumer's SQS requests per job (docs/decisions/0036-fewer-sqs-requests-per-job.md),
on both backends, against moto through a counting proxy on loopback.

What it must show: job messages finishing together are deleted ten to a DeleteMessageBatch
(no DeleteMessage at all); a receive takes messages ahead once the consumer's pace is
known; a refused entry of a batch leaves its message to a redelivery that is deleted
unrun, without a second portal run; a batch that fails as an outage is tried again; a
stopping consumer sends the deletes still waiting.
"""

from __future__ import annotations

import functools
import math
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from aiohttp import web
from structlog.testing import capture_logs
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO
from testkit.moto import MotoServer

from outboxd.queue.sqs import QueueDepth
from outboxd.workers.prefetch import Prefetch
from tests.support.consumer_rig import Rig, RigFactory
from tests.support.sqs_proxy import CountingProxy, serve, sqs_json

# Jobs of one student from one user, many at once: the login lock would make all but a
# few wait (tries under way count), and the portal's pace would queue them.
OPEN_PORTAL = {
    "suwon": {"max_concurrency": 10, "max_auth_failures": 0, "max_auth_failures_total": 0}
}


@pytest_asyncio.fixture
async def proxy(moto_server: MotoServer) -> AsyncIterator[CountingProxy]:
    counting = CountingProxy(moto_server.endpoint_url)
    async with serve(counting.handle) as counting.url:
        yield counting


async def rig_through(make_rig: RigFactory, proxy: CountingProxy, **sections: Any) -> Rig:
    sqs = {"endpoint_url": proxy.url, **sections.pop("sqs", {})}
    return await make_rig(sqs=sqs, scrapers=OPEN_PORTAL, **sections)


async def test_jobs_finishing_together_share_delete_batches(
    make_rig: RigFactory, proxy: CountingProxy
) -> None:
    n = 20
    rig = await rig_through(
        make_rig, proxy, sqs={"visibility_timeout_s": 30}, consumer={"max_concurrency": 10}
    )
    ids = [await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD) for _ in range(n)]
    rig.start_consumer()
    for job_id in ids:
        assert (await rig.wait_status(job_id, "SUCCEEDED", "FAILED", "DEAD")).status == "SUCCEEDED"
    await rig.wait_queue_empty()

    assert proxy.calls["DeleteMessage"] == 0
    assert 1 <= proxy.calls["DeleteMessageBatch"] <= math.ceil(n / 10) + 2, proxy.calls
    assert sorted(rig.receiver.deleted) == sorted(m.receipt_handle for m in rig.receiver.received)
    assert rig.portal.login_attempts == {SAMPLE_SNO: n}
    assert all(len(rig.receiver.receives_of(job_id)) == 1 for job_id in ids)


async def test_a_receive_takes_messages_ahead_once_the_pace_is_known(
    make_rig: RigFactory, proxy: CountingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot, five jobs queued: the first receive asks for the one free slot (the pace
    unknown); once that job has finished, a receive takes the other four, and they run one
    after another, each received once."""
    # Whatever this machine's pace: four jobs start within the horizon.
    monkeypatch.setattr(
        "outboxd.workers.consumer.Prefetch", functools.partial(Prefetch, horizon_s=3600.0)
    )
    rig = await rig_through(
        make_rig, proxy, sqs={"visibility_timeout_s": 30}, consumer={"max_concurrency": 1}
    )
    ids = [await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD) for _ in range(5)]
    rig.start_consumer()
    for job_id in ids:
        assert (await rig.wait_status(job_id, "SUCCEEDED", "FAILED", "DEAD")).status == "SUCCEEDED"
    await rig.wait_queue_empty()

    got = [n for n in proxy.received() if n]
    assert got[0] == 1, got
    assert got[1:] == [4], got
    assert rig.portal.login_attempts == {SAMPLE_SNO: 5}
    assert all(len(rig.receiver.receives_of(job_id)) == 1 for job_id in ids)


class RefusesTheFirstDelete(CountingProxy):
    """Fails the first DeleteMessageBatch's entries (SenderFault, as SQS answers a receipt
    handle it no longer takes), without passing them on."""

    refused: list[str]

    def __init__(self, upstream: str) -> None:
        super().__init__(upstream)
        self.refused = []

    async def answer(self, action: str, body: dict[str, Any]) -> web.StreamResponse | None:
        if action != "DeleteMessageBatch" or self.refused:
            return None
        self.refused = [e["ReceiptHandle"] for e in body["Entries"]]
        failed = [
            {"Id": e["Id"], "SenderFault": True, "Code": "ReceiptHandleIsInvalid", "Message": "x"}
            for e in body["Entries"]
        ]
        return sqs_json({"Successful": [], "Failed": failed})


@pytest.mark.real_clock  # the refused message must come back after its visibility timeout
async def test_a_refused_delete_leaves_the_message_to_a_redelivery_deleted_unrun(
    make_rig: RigFactory, moto_server: MotoServer
) -> None:
    proxy = RefusesTheFirstDelete(moto_server.endpoint_url)
    async with serve(proxy.handle) as proxy.url:
        rig = await rig_through(make_rig, proxy)  # visibility 3 s
        rig.start_consumer()
        with capture_logs() as logs:
            job_id, job = await rig.run_sample_job()
            assert job.status == "SUCCEEDED"
            await rig.wait_queue_empty()

    receives = rig.receiver.receives_of(job_id)
    assert len(receives) == 2  # the refused delete's message came back once
    assert proxy.refused == [receives[0].receipt_handle]
    assert receives[1].receipt_handle in rig.receiver.deleted
    assert rig.portal.login_attempts == {SAMPLE_SNO: 1}  # not run again
    assert await rig.job(job_id) == job
    refused = [e for e in logs if e["event"] == "sqs_delete_failed"]
    assert refused and refused[0]["retried"] is False
    assert any(e["event"] == "message_for_finished_job" for e in logs)


class DeletesDownAWhile(CountingProxy):
    """Answers 503 to the first `n` DeleteMessageBatch requests (SQS unavailable)."""

    def __init__(self, upstream: str, n: int) -> None:
        super().__init__(upstream)
        self.left = n

    async def answer(self, action: str, body: dict[str, Any]) -> web.StreamResponse | None:
        if action != "DeleteMessageBatch" or self.left <= 0:
            return None
        self.left -= 1
        fault = {"__type": "com.amazonaws.sqs#ServiceUnavailable", "message": "down"}
        return sqs_json(fault, status=503)


@pytest.mark.real_clock  # the delete is tried again after a backoff
async def test_a_delete_batch_failing_as_an_outage_is_tried_again(
    make_rig: RigFactory, moto_server: MotoServer
) -> None:
    # Three 503s: the whole request fails once the message plane's three attempts are spent.
    proxy = DeletesDownAWhile(moto_server.endpoint_url, 3)
    async with serve(proxy.handle) as proxy.url:
        rig = await rig_through(make_rig, proxy, sqs={"visibility_timeout_s": 30})
        rig.start_consumer()
        with capture_logs() as logs:
            job_id, job = await rig.run_sample_job()
            assert job.status == "SUCCEEDED"
            await rig.wait_queue_empty()

    assert proxy.calls["DeleteMessageBatch"] == 4
    assert len(rig.receiver.receives_of(job_id)) == 1  # deleted before it came back
    events = [e["event"] for e in logs]
    assert "sqs_delete_failed" in events and "sqs_deletes_resumed" in events
    failed = next(e for e in logs if e["event"] == "sqs_delete_failed")
    assert failed["retried"] is True


async def test_a_stopping_consumer_sends_the_deletes_still_waiting(
    make_rig: RigFactory, proxy: CountingProxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A delete would wait a quarter of the 60 s visibility for others: only the stop sends it.
    monkeypatch.setattr("outboxd.queue.deletes.DELETE_WINDOW_S", 3600.0)
    rig = await rig_through(make_rig, proxy, sqs={"visibility_timeout_s": 60})
    rig.start_consumer()
    job_id, job = await rig.run_sample_job()
    assert job.status == "SUCCEEDED"
    assert proxy.calls["DeleteMessageBatch"] == 0

    await rig.stop_consumers()

    assert proxy.calls["DeleteMessageBatch"] == 1
    assert await rig.queues.depth("jobs") == QueueDepth(visible=0, in_flight=0, dlq_visible=0)
    assert rig.receiver.receives_of(job_id)[0].receipt_handle in rig.receiver.deleted
