"""SqsQueues against a real moto server run by EmbeddedSqs (a child process on 127.0.0.1)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from dataclasses import replace

import pytest
import pytest_asyncio
from aiobotocore.session import AioSession

from outboxd.queue.control_plane import SqsControlPlane
from outboxd.queue.embedded import EmbeddedSqs
from outboxd.queue.sqs import (
    KINDS,
    MAX_MESSAGE_BYTES,
    OutgoingMessage,
    QueueDepth,
    QueueError,
    SqsQueues,
)
from tests.support.sqs import read_all
from tests.support.sqs_proxy import queue_settings as make_settings
from tests.support.waits import consistently

pytestmark = pytest.mark.asyncio(loop_scope="module")

# An outage must surface within this bound (retries + backoff), not hang the relay.
OUTAGE_BOUND_S = 6.0


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def server() -> AsyncIterator[EmbeddedSqs]:
    async with EmbeddedSqs() as sqs:
        yield sqs


@pytest_asyncio.fixture(loop_scope="module")
async def queues(server: EmbeddedSqs) -> AsyncIterator[SqsQueues]:
    q = SqsQueues(make_settings(server.endpoint_url), server.endpoint_url)
    await q.start()
    try:
        yield q
    finally:
        await q.close()


async def raw_attributes(endpoint_url: str, queue_url: str) -> dict[str, str]:
    """Attributes read with a client of our own, so assertions do not trust the adapter."""
    session = AioSession()
    async with session.create_client(
        "sqs",
        region_name="us-east-1",
        endpoint_url=endpoint_url,
        aws_access_key_id="test",
        aws_secret_access_key="test",
    ) as client:
        resp = await client.get_queue_attributes(QueueUrl=queue_url, AttributeNames=["All"])
    attrs: dict[str, str] = resp["Attributes"]
    return attrs


def msgs(n: int, prefix: str = "m") -> list[OutgoingMessage]:
    return [OutgoingMessage(entry_id=f"{prefix}{i}", body=f"body-{prefix}{i}") for i in range(n)]


async def test_ensure_queues_creates_dlqs_redrive_and_fifo(server: EmbeddedSqs) -> None:
    """Four queues exist after start; main queues redrive to their DLQ; tasks are FIFO."""
    settings = make_settings(server.endpoint_url, max_receive_count=3, visibility_timeout_s=45)
    async with SqsQueues(settings, server.endpoint_url) as q:
        urls = {(k, d): q.queue_url(k, d) for k in KINDS for d in (False, True)}
        assert urls[("jobs", False)].endswith(f"/{settings.jobs_queue}")
        assert urls[("jobs", True)].endswith(f"/{settings.jobs_queue}-dlq")
        base = settings.tasks_queue.removesuffix(".fifo")
        assert urls[("tasks", True)].endswith(f"/{base}-dlq.fifo")

        for kind in KINDS:
            main = await raw_attributes(server.endpoint_url, urls[(kind, False)])
            dlq = await raw_attributes(server.endpoint_url, urls[(kind, True)])
            policy = json.loads(main["RedrivePolicy"])
            assert policy["deadLetterTargetArn"] == dlq["QueueArn"]
            assert int(policy["maxReceiveCount"]) == 3
            assert main["VisibilityTimeout"] == "45"
            assert "RedrivePolicy" not in dlq
            if kind == "tasks":
                for attrs in (main, dlq):
                    assert attrs["FifoQueue"] == "true"
                    assert attrs["ContentBasedDeduplication"] == "false"
            else:
                assert "FifoQueue" not in main

        await q.ensure_queues()  # idempotent: same URLs, no error
        assert {(k, d): q.queue_url(k, d) for (k, d) in urls} == urls


async def test_ensure_queues_converges_changed_attributes(server: EmbeddedSqs) -> None:
    """A queue that exists with another redrive count / visibility is updated in place."""
    settings = make_settings(server.endpoint_url, max_receive_count=2, visibility_timeout_s=30)
    async with SqsQueues(settings, server.endpoint_url):
        pass
    changed = replace(settings, max_receive_count=7, visibility_timeout_s=90)
    async with SqsQueues(changed, server.endpoint_url) as q:
        for kind in KINDS:
            main = await raw_attributes(server.endpoint_url, q.queue_url(kind))
            assert json.loads(main["RedrivePolicy"])["maxReceiveCount"] == 7
            assert main["VisibilityTimeout"] == "90"


async def test_start_without_create_resolves_existing_or_fails(server: EmbeddedSqs) -> None:
    """create_queues=false only looks queues up: found if present, QueueError if not."""
    settings = make_settings(server.endpoint_url)
    async with SqsQueues(settings, server.endpoint_url) as created:
        expected = created.queue_url("tasks", dlq=True)
    async with SqsQueues(replace(settings, create_queues=False), server.endpoint_url) as q:
        assert q.queue_url("tasks", dlq=True) == expected

    missing = SqsQueues(
        make_settings(server.endpoint_url, create_queues=False), server.endpoint_url
    )
    with pytest.raises(QueueError):
        await missing.start()
    with pytest.raises(QueueError):
        missing.queue_url("jobs")
    await missing.close()  # closing after a failed start is harmless


async def test_send_batch_of_ten_succeeds(queues: SqsQueues) -> None:
    """Ten messages in one batch: every entry successful with its own MessageId."""
    result = await queues.send_batch("jobs", msgs(10))
    assert result.failed == {}
    assert set(result.successful) == {f"m{i}" for i in range(10)}
    assert len(set(result.successful.values())) == 10
    assert await queues.depth("jobs") == QueueDepth(visible=10, in_flight=0, dlq_visible=0)


async def test_send_batch_rejects_caller_bugs_before_sending(queues: SqsQueues) -> None:
    """More than 10 entries, duplicate ids or a FIFO message without dedup id: ValueError."""
    with pytest.raises(ValueError, match="at most 10"):
        await queues.send_batch("jobs", msgs(11))
    with pytest.raises(ValueError, match="duplicate"):
        await queues.send_batch("jobs", [OutgoingMessage("a", "x"), OutgoingMessage("a", "y")])
    with pytest.raises(ValueError, match="group_id and dedup_id"):
        await queues.send_batch("tasks", [OutgoingMessage("a", "x", group_id="g")])
    assert (await queues.depth("jobs")).visible == 0
    assert (await queues.send_batch("jobs", [])).successful == {}


async def test_oversized_body_fails_without_sending(queues: SqsQueues) -> None:
    """A body over 256 KiB in UTF-8 (fewer characters than bytes) is failed, not sent."""
    too_big = "é" * (MAX_MESSAGE_BYTES // 2 + 1)  # 2 bytes each: 256 KiB + 2 bytes
    assert len(too_big) < MAX_MESSAGE_BYTES
    at_limit = "a" * MAX_MESSAGE_BYTES
    result = await queues.send_batch(
        "jobs",
        [OutgoingMessage("big", too_big), OutgoingMessage("limit", at_limit)],
    )
    assert set(result.failed) == {"big"}
    assert result.failed["big"].startswith("MessageTooLong:")
    assert set(result.successful) == {"limit"}
    assert (await queues.depth("jobs")).visible == 1


async def test_fifo_dedup_id_sent_twice_is_received_once(queues: SqsQueues) -> None:
    """Same MessageDeduplicationId twice (two batches) → one message in the FIFO queue."""
    for entry in ("first", "second"):
        msg = OutgoingMessage(entry, '{"task":"noop"}', group_id="noop", dedup_id="sched-1")
        result = await queues.send_batch("tasks", [msg])
        assert set(result.successful) == {entry}  # SQS accepts the duplicate silently
    received = await queues.receive("tasks", 10)
    assert [m.body for m in received] == ['{"task":"noop"}']
    await queues.delete("tasks", received[0].receipt_handle)
    assert await queues.receive("tasks", 10) == []


async def test_redelivery_counts_and_change_visibility_zero(queues: SqsQueues) -> None:
    """change_visibility(0) makes a message visible at once; receive_count goes 1, 2."""
    await queues.send_batch("jobs", msgs(1))
    first = await queues.receive("jobs", 10)
    assert [m.receive_count for m in first] == [1]
    assert await queues.receive("jobs", 10) == []  # in flight for visibility_timeout_s
    await queues.change_visibility("jobs", first[0].receipt_handle, 0)
    second = await queues.receive("jobs", 10)
    assert [(m.message_id, m.receive_count) for m in second] == [(first[0].message_id, 2)]


async def test_after_max_receive_count_message_moves_to_dlq(queues: SqsQueues) -> None:
    """With maxReceiveCount 2, the receive after the second delivery moves it to the DLQ."""
    await queues.send_batch("jobs", [OutgoingMessage("x", "poison")])
    for expected_count in (1, 2):
        got = await queues.receive("jobs", 1)
        assert [m.receive_count for m in got] == [expected_count]
        await queues.change_visibility("jobs", got[0].receipt_handle, 0)
    # moto (like SQS) redrives on the receive that would exceed the count.
    assert await queues.receive("jobs", 1) == []
    assert await queues.depth("jobs") == QueueDepth(visible=0, in_flight=0, dlq_visible=1)
    assert await read_all(queues, "jobs", dlq=True, wait_time_s=0) == ["poison"]


async def test_delete_removes_and_depth_counts(queues: SqsQueues) -> None:
    """depth() separates visible from in-flight messages; delete() removes for good."""
    await queues.send_batch("jobs", msgs(3))
    got = await queues.receive("jobs", 2)
    assert len(got) == 2
    assert await queues.depth("jobs") == QueueDepth(visible=1, in_flight=2, dlq_visible=0)
    for m in got:
        await queues.delete("jobs", m.receipt_handle)
    assert await queues.depth("jobs") == QueueDepth(visible=1, in_flight=0, dlq_visible=0)
    with pytest.raises(QueueError) as excinfo:
        await queues.delete("jobs", "not-a-receipt-handle")
    assert excinfo.value.code is not None


async def test_read_all_leaves_messages_or_drains(queues: SqsQueues) -> None:
    """read_all returns every body; by default messages stay, with delete=True they go."""
    await queues.send_batch("jobs", msgs(10, "a"))
    await queues.send_batch("jobs", msgs(5, "b"))
    expected = sorted([f"body-a{i}" for i in range(10)] + [f"body-b{i}" for i in range(5)])
    assert sorted(await read_all(queues, "jobs", wait_time_s=0)) == expected
    assert await queues.depth("jobs") == QueueDepth(visible=15, in_flight=0, dlq_visible=0)
    assert sorted(await read_all(queues, "jobs", delete=True, wait_time_s=0)) == expected
    assert await queues.depth("jobs") == QueueDepth(visible=0, in_flight=0, dlq_visible=0)


@pytest.mark.real_clock  # a long poll in flight: nothing signals that moto holds it
async def test_long_poll_returns_when_a_message_arrives(queues: SqsQueues) -> None:
    """A long poll waits for a message rather than returning empty at once."""
    poll = asyncio.create_task(queues.receive("jobs", 1, wait_time_s=5))
    # Meanwhile the poll reaches moto, and an empty queue does not answer it.
    await consistently(lambda: not poll.done(), 0.3)
    await queues.send_batch("jobs", msgs(1))
    got = await asyncio.wait_for(poll, 5)
    assert [m.body for m in got] == ["body-m0"]


@pytest.mark.real_clock
async def test_cancelled_long_poll_stays_cancelled(queues: SqsQueues) -> None:
    """Cancelling a receive (shutdown) raises CancelledError, not QueueError."""
    poll = asyncio.create_task(queues.receive("jobs", 1, wait_time_s=10))
    await consistently(lambda: not poll.done(), 0.2)  # in flight at moto, most likely
    poll.cancel()
    with pytest.raises(asyncio.CancelledError):
        await poll
    await queues.ping()  # the client is still usable


async def test_ping_and_close_idempotent(server: EmbeddedSqs) -> None:
    """ping() answers on a started adapter; after close() it raises QueueError."""
    q = SqsQueues(make_settings(server.endpoint_url), server.endpoint_url)
    with pytest.raises(QueueError):
        await q.ping()
    await q.start()
    await q.ping()
    await q.close()
    await q.close()
    with pytest.raises(QueueError):
        await q.ping()


async def test_outage_raises_queue_error_quickly_then_recovers() -> None:
    """SQS killed: send_batch and ping fail with QueueError within a bound; after a
    restart on the same port and ensure_queues, the same adapter works again."""
    async with EmbeddedSqs() as sqs:
        settings = make_settings(sqs.endpoint_url)
        async with SqsQueues(settings, sqs.endpoint_url) as q:
            await q.send_batch("jobs", msgs(1))
            await sqs.stop()

            for call in (lambda: q.send_batch("jobs", msgs(1)), q.ping):
                started = time.monotonic()
                with pytest.raises(QueueError) as excinfo:
                    await call()
                elapsed = time.monotonic() - started
                assert elapsed < OUTAGE_BOUND_S, elapsed
                assert "aws_secret" not in str(excinfo.value).lower()
                assert len(str(excinfo.value)) <= 300

            endpoint = sqs.endpoint_url
            assert await sqs.restart() == endpoint
            with pytest.raises(QueueError):  # moto forgot the queues
                await q.ping()
            await q.ensure_queues()
            await q.ping()
            result = await q.send_batch("jobs", msgs(2))
            assert len(result.successful) == 2
            assert (await q.depth("jobs")).visible == 2


async def test_dummy_credentials_only_when_none_configured(
    server: EmbeddedSqs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loopback without credentials gets dummy keys; configured keys are never replaced."""
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent/credentials")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    q = SqsControlPlane(make_settings(server.endpoint_url), server.endpoint_url, max_connections=1)
    dummy = await q._credential_overrides(AioSession())
    assert dummy == {"aws_access_key_id": "outboxd", "aws_secret_access_key": "outboxd"}

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "AKIAREALKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "real-secret")
    assert await q._credential_overrides(AioSession()) == {}
    # And a non-loopback endpoint never gets dummies, whatever the environment.
    aws = SqsControlPlane(
        make_settings("https://sqs.eu-west-1.amazonaws.com"), None, max_connections=1
    )
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    assert await aws._credential_overrides(AioSession()) == {}


async def test_aws_without_region_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """No sqs.region and no region in the AWS chain: QueueError naming sqs.region."""
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent/config")
    for var in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    q = SqsQueues(replace(make_settings("unused"), endpoint_url=None), None)
    with pytest.raises(QueueError, match=r"sqs\.region"):
        await q.start()
