"""send_batch splits a batch by size; when a later request fails, the earlier one's
messages are still reported as sent (the relay must not publish them a second time).

SQS is the session's moto behind a small HTTP proxy of our own that forwards every call
and answers one chosen SendMessageBatch call with an error, as an SQS hiccup would.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from testkit.moto import MotoServer

from outboxd.queue.sqs import MAX_MESSAGE_BYTES, OutgoingMessage, QueueError, SqsQueues
from tests.support.sqs_proxy import forward


@dataclass
class FailingProxy:
    """Forwards to moto; SendMessageBatch calls numbered in `fail_batches` (1-based) get a
    400 InternalFailure-style error instead and never reach moto."""

    upstream: str
    fail_batches: frozenset[int] = frozenset()
    # SendMessageBatch calls (1-based) whose first Successful entry comes back with
    # another body's MD5, as if SQS had stored something else than was sent.
    corrupt_batches: frozenset[int] = frozenset()
    # SendMessageBatch calls (1-based) answered with (status, JSON body) instead of moto.
    answers: dict[int, tuple[int, dict[str, Any]]] = field(default_factory=dict)
    batches: int = 0
    url: str = ""

    async def handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        if request.headers.get("X-Amz-Target", "").endswith(".SendMessageBatch"):
            self.batches += 1
            if self.batches in self.answers:
                status, answer = self.answers[self.batches]
                return web.json_response(
                    answer, status=status, content_type="application/x-amz-json-1.0"
                )
            if self.batches in self.fail_batches:
                return web.Response(
                    status=400,
                    body=json.dumps(
                        {"__type": "com.amazonaws.sqs#InvalidAddress", "message": "injected"}
                    ).encode(),
                    content_type="application/x-amz-json-1.0",
                )
        status, payload, out = await forward(self.upstream, request, body)
        if self.batches in self.corrupt_batches and status == 200:
            answer = json.loads(payload)
            answer["Successful"][0]["MD5OfMessageBody"] = "0" * 32
            payload = json.dumps(answer).encode()
        return web.Response(status=status, body=payload, headers=out)


@pytest.fixture
def proxy(moto_server: MotoServer) -> FailingProxy:
    """In front of the session's moto; `proxied_queues` serves it."""
    return FailingProxy(upstream=moto_server.endpoint_url.rstrip("/"))


def big(entry_id: str) -> OutgoingMessage:
    """A body so large that two do not fit one request: one request per message."""
    return OutgoingMessage(entry_id, entry_id + ":" + "x" * (MAX_MESSAGE_BYTES // 2 + 10))


async def test_a_failing_second_request_still_reports_the_first_as_sent(
    proxy: FailingProxy, proxied_queues: SqsQueues
) -> None:
    """An oversized body is failed before sending; of the three requests the second fails:
    the first and third messages are reported successful, with their MessageIds."""
    proxy.fail_batches = frozenset({2})
    huge = OutgoingMessage("huge", "y" * (MAX_MESSAGE_BYTES + 1))

    result = await proxied_queues.send_batch("jobs", [big("a"), huge, big("b"), big("c")])

    assert proxy.batches == 3  # one request per message that fits; the second was failed
    assert set(result.successful) == {"a", "c"}
    assert len(set(result.successful.values())) == 2
    assert set(result.failed) == {"huge", "b"}
    assert result.failed["huge"].startswith("MessageTooLong:")
    assert "InvalidAddress" in result.failed["b"]
    depth = await proxied_queues.depth("jobs")
    assert depth.visible == 2  # what is reported sent is what is on the queue


async def test_a_failing_first_request_fails_the_whole_call(
    proxy: FailingProxy, proxied_queues: SqsQueues
) -> None:
    """Nothing was sent yet: the caller sees the error itself, not per-entry failures."""
    proxy.fail_batches = frozenset({1})
    with pytest.raises(QueueError, match="InvalidAddress"):
        await proxied_queues.send_batch("jobs", [big("a"), big("b")])
    assert proxy.batches == 1
    assert (await proxied_queues.depth("jobs")).visible == 0


async def test_an_entry_whose_md5_does_not_match_is_reported_failed(
    proxy: FailingProxy, proxied_queues: SqsQueues
) -> None:
    """SQS's MD5 of a body is checked: an entry whose digest differs from what was sent
    is failed (the relay publishes it again), the others in its batch are sent."""
    proxy.corrupt_batches = frozenset({1})
    result = await proxied_queues.send_batch(
        "jobs", [OutgoingMessage(f"m{i}", f"body {i}") for i in range(3)]
    )
    assert proxy.batches == 1
    assert len(result.successful) == 2
    [(entry_id, reason)] = result.failed.items()
    assert entry_id not in result.successful
    assert "MD5OfMessageBody" in reason


async def test_failures_say_whether_the_message_or_the_request_failed(
    proxy: FailingProxy, proxied_queues: SqsQueues
) -> None:
    """Per entry: SQS's SenderFault is kept, our own size check is the message's fault, and
    an entry of a later request that failed as an outage (credentials refused) is marked
    an outage; a refused request (400 naming what it carried) is not."""
    entries = {
        "Failed": [
            {"Id": "m0", "SenderFault": True, "Code": "InvalidParameterValue", "Message": "x"},
            {"Id": "m1", "SenderFault": False, "Code": "InternalError", "Message": "y"},
        ],
        "Successful": [],
    }
    denied = {"__type": "com.amazonaws.sqs#AccessDenied", "message": "not yours"}
    proxy.answers = {1: (200, entries), 3: (403, denied)}
    huge = OutgoingMessage("huge", "y" * (MAX_MESSAGE_BYTES + 1))
    small = [OutgoingMessage(f"m{i}", f"body {i}") for i in range(2)]
    result = await proxied_queues.send_batch("jobs", [*small, huge])
    assert result.successful == {}
    assert result.sender_fault == {"m0": True, "m1": False, "huge": True}
    assert result.outage == frozenset()

    result = await proxied_queues.send_batch("jobs", [big("a"), big("b")])  # batches 2 and 3
    assert set(result.successful) == {"a"}
    assert "AccessDenied" in result.failed["b"]
    assert (result.sender_fault, result.outage) == ({"b": False}, frozenset({"b"}))

    too_long = {"__type": "com.amazonaws.sqs#BatchRequestTooLong", "message": "too long"}
    proxy.answers[5] = (400, too_long)  # refused for what it carried
    result = await proxied_queues.send_batch("jobs", [big("c"), big("d")])
    assert set(result.successful) == {"c"}
    assert (result.sender_fault, result.outage) == ({"d": True}, frozenset())
