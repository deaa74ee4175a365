"""SqsQueues at start and at readiness, against the session's moto:
- with `sqs.create_queues = false` the queues are checked, one warning per difference,
  and used anyway;
- SQS unreachable at start: every later call (readiness, sends, receives, the relay's
  stored lastError) carries the real cause, and a later start() clears it;
- ping() is a call of the message plane, so readiness fails while messages cannot go out
  even if botocore's control calls still work.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import pytest
import pytest_asyncio
from aiobotocore.session import AioSession
from aiohttp import web
from structlog.testing import capture_logs
from testkit.moto import MotoServer

from outboxd.daemon.readiness import DependencyReadiness
from outboxd.metrics import Metrics
from outboxd.queue.sqs import OutgoingMessage, QueueError, SqsQueues
from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from outboxd.workers.relay import Relay
from tests.support.ops import insert_portal_job
from tests.support.relay import relay_settings
from tests.support.sqs_proxy import forward, queue_settings, serve
from tests.support.tcp_proxy import TcpProxy


@pytest_asyncio.fixture
async def sqs(moto_server: MotoServer) -> AsyncIterator[Any]:
    """A botocore client of the test's own, to make queues the daemon did not."""
    async with AioSession().create_client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=moto_server.endpoint_url,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as client:
        yield client


async def make_queue(sqs: Any, name: str, **attributes: str) -> str:
    url = str((await sqs.create_queue(QueueName=name, Attributes=attributes))["QueueUrl"])
    return url


async def arn(sqs: Any, url: str) -> str:
    resp = await sqs.get_queue_attributes(QueueUrl=url, AttributeNames=["QueueArn"])
    return str(resp["Attributes"]["QueueArn"])


def mismatches(logs: list[dict[str, Any]]) -> set[tuple[str, str, str, str | None]]:
    return {
        (e["queue"], e["attribute"], e["expected"], e["actual"])
        for e in logs
        if e["event"] == "sqs_queue_mismatch"
    }


async def test_existing_queues_are_checked_and_each_difference_warned(
    moto_server: MotoServer, sqs: Any
) -> None:
    settings = queue_settings(
        moto_server.endpoint_url,
        create_queues=False,
        max_receive_count=2,
        visibility_timeout_s=30,
    )
    jobs, tasks = settings.jobs_queue, settings.tasks_queue
    tasks_dlq = tasks.removesuffix(".fifo") + "-dlq.fifo"
    jobs_dlq_url = await make_queue(sqs, f"{jobs}-dlq")
    tasks_dlq_url = await make_queue(sqs, tasks_dlq, FifoQueue="true")
    # Jobs: another visibility timeout and no redrive policy at all. Tasks: not FIFO, and
    # redriven to the wrong DLQ after the wrong count.
    await make_queue(sqs, jobs, VisibilityTimeout="45")
    wrong = json.dumps({"deadLetterTargetArn": await arn(sqs, jobs_dlq_url), "maxReceiveCount": 9})
    await make_queue(sqs, tasks, RedrivePolicy=wrong)

    with capture_logs() as logs:
        queues = SqsQueues(settings, moto_server.endpoint_url)
        await queues.start()
    try:
        assert all(e["log_level"] == "warning" for e in logs if e["event"] == "sqs_queue_mismatch")
        redrive = {"deadLetterTargetArn": await arn(sqs, jobs_dlq_url), "maxReceiveCount": 2}
        assert mismatches(logs) == {
            (jobs, "VisibilityTimeout", "30", "45"),
            (jobs, "RedrivePolicy", json.dumps(redrive), None),
            (tasks, "FifoQueue", "true", None),
            (
                tasks,
                "RedrivePolicy.deadLetterTargetArn",
                await arn(sqs, tasks_dlq_url),
                await arn(sqs, jobs_dlq_url),
            ),
            (tasks, "RedrivePolicy.maxReceiveCount", "2", "9"),
        }
        # It started all the same, and changed nothing.
        sent = await queues.send_batch("jobs", [OutgoingMessage("m1", "x")])
        assert set(sent.successful) == {"m1"}
        attrs = await sqs.get_queue_attributes(
            QueueUrl=queues.queue_url("jobs"), AttributeNames=["All"]
        )
        assert attrs["Attributes"]["VisibilityTimeout"] == "45"
        assert "RedrivePolicy" not in attrs["Attributes"]
    finally:
        await queues.close()


async def test_queues_as_expected_are_not_warned_about(moto_server: MotoServer) -> None:
    settings = queue_settings(moto_server.endpoint_url, max_receive_count=3)
    async with SqsQueues(settings, moto_server.endpoint_url):
        pass  # created as the daemon wants them
    with capture_logs() as logs:
        async with SqsQueues(replace(settings, create_queues=False), moto_server.endpoint_url):
            pass
    assert mismatches(logs) == set()
    assert not [e for e in logs if e["event"] == "sqs_queue_check_failed"]


@pytest_asyncio.fixture
async def gate(moto_server: MotoServer) -> AsyncIterator[TcpProxy]:
    """A TCP proxy to moto whose port is closed until the test opens it."""
    proxy = TcpProxy("127.0.0.1", moto_server.port)
    await proxy.start()
    await proxy.stop()  # the port is now known, and refuses
    try:
        yield proxy
    finally:
        await proxy.stop()


async def test_sqs_unreachable_at_start_every_later_error_names_the_cause(
    gate: TcpProxy, store: SqlStore, keys: KeyRing
) -> None:
    url = f"http://127.0.0.1:{gate.port}"
    queues = SqsQueues(queue_settings(url), url)
    with pytest.raises(QueueError) as info:
        await queues.start()
    cause = str(info.value)
    assert "EndpointConnectionError" in cause and f"127.0.0.1:{gate.port}" in cause
    try:
        later: list[str] = []
        for call in (
            queues.ping,
            lambda: queues.send_batch("jobs", [OutgoingMessage("m1", "x")]),
            lambda: queues.receive("jobs", 1),
            lambda: queues.delete("tasks", "handle"),
            lambda: queues.depth("jobs"),
        ):
            with pytest.raises(QueueError) as failed:
                await call()
            assert failed.value.outage
            later.append(str(failed.value))
        checks = await DependencyReadiness(store, queues).check()
        later.append(checks["sqs"])

        _, outbox_id = await insert_portal_job(store, time.time(), keys, "pw")
        relay = Relay(store, queues, relay_settings(publish_timeout_s=10.0), Metrics())
        assert await relay.relay_once() == 1
        row = await store.get_relay_row(outbox_id)
        assert row is not None and row.status == "RETRYABLE_FAILED" and row.last_error
        later.append(row.last_error)
        for text in later:
            assert "EndpointConnectionError" in text, later
            assert "start()" not in text, later

        # SQS comes back: start() succeeds and the old cause is gone.
        await gate.start()
        await queues.start()
        await queues.ping()
        assert (await DependencyReadiness(store, queues).check())["sqs"] == "ok"
    finally:
        await queues.close()
    with pytest.raises(QueueError, match=r"call start\(\) first"):
        queues.queue_url("jobs")  # closed on purpose: that is a caller's mistake


@pytest_asyncio.fixture
async def botocore_only(moto_server: MotoServer) -> AsyncIterator[str]:
    """An endpoint that forwards botocore's requests to moto and refuses every other
    client (the message plane), as a broken path for sends would."""
    upstream = moto_server.endpoint_url.rstrip("/")

    async def handle(request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if "botocore" not in request.headers.get("User-Agent", "").lower():
            return web.json_response(
                {"__type": "com.amazonaws.sqs#AccessDenied", "message": "not for you"},
                status=403,
                content_type="application/x-amz-json-1.0",
            )
        status, payload, headers = await forward(upstream, request, body)
        return web.Response(status=status, body=payload, headers=headers)

    async with serve(handle) as url:
        yield url


async def test_ping_fails_while_nothing_can_be_sent(botocore_only: str, store: SqlStore) -> None:
    """Queue setup and depth go through botocore and work; ping is the message plane's
    call, so readiness reports the failure that sends would meet."""
    async with SqsQueues(queue_settings(botocore_only), botocore_only) as queues:
        assert (await queues.depth("jobs")).visible == 0  # the control plane works
        with pytest.raises(QueueError) as info:
            await queues.ping()
        assert "AccessDenied" in str(info.value) and "GetQueueAttributes" in str(info.value)
        with pytest.raises(QueueError, match="AccessDenied"):
            await queues.send_batch("jobs", [OutgoingMessage(uuid.uuid4().hex, "x")])
        checks = await DependencyReadiness(store, queues).check()
        assert "AccessDenied" in checks["sqs"]
