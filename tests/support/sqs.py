"""Reading a whole SQS queue, for tests only (to count messages or grep them for secrets)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from outboxd.config import SqsSettings
from outboxd.queue.sqs import MAX_BATCH_ENTRIES, QueueKind, ReceivedMessage, SqsQueues


@asynccontextmanager
async def queues_named(
    endpoint_url: str, queue_names: Mapping[str, str]
) -> AsyncIterator[SqsQueues]:
    """A client of the test's own on the queues `queue_names` (as a daemon made them at
    `endpoint_url`), never creating any."""
    settings = SqsSettings(endpoint_url=endpoint_url, create_queues=False, **queue_names)
    async with SqsQueues(settings, endpoint_url) as queues:
        yield queues


async def read_all(
    queues: SqsQueues,
    kind: QueueKind,
    dlq: bool = False,
    *,
    delete: bool = False,
    wait_time_s: int = 1,
    hold_s: int = 30,
    limit: int = 10_000,
) -> list[str]:
    """Every message body currently in a queue. Not for the hot path.

    Receives 10 at a time until a receive brings nothing new, holding what it saw
    invisible for `hold_s` so no message is returned twice. Then, with `delete=False`
    (default), makes them visible again at once (visibility 0); with `delete=True` it
    drains the queue. Caveats, by SQS's design:
    - each read counts as a receive: on a main queue, repeated reads push messages
      toward the DLQ (maxReceiveCount), so prefer `dlq=True` or a drained queue;
    - messages already in flight (held by a consumer) are not seen;
    - FIFO hides a group's later messages while earlier ones are in flight, so
      without `delete` only the first batch of each message group is seen;
    - `wait_time_s=0` is exact on moto; on AWS a short poll samples only some
      servers, and a 1 s long poll queries them all.
    """
    url = queues.queue_url(kind, dlq)
    bodies: list[str] = []
    held: list[ReceivedMessage] = []
    seen: set[str] = set()
    try:
        while len(bodies) < limit:
            batch = await queues._receive(
                url, min(MAX_BATCH_ENTRIES, limit - len(bodies)), wait_time_s, hold_s
            )
            fresh = [m for m in batch if m.message_id not in seen]
            if delete:
                await _batch_call(queues, url, "DeleteMessageBatch", batch)
            else:
                held.extend(batch)
            if not fresh:
                break
            for m in fresh:
                seen.add(m.message_id)
                bodies.append(m.body)
    finally:
        # Released even when a receive failed half-way, so a failed scan does not
        # leave messages hidden for hold_s seconds.
        for start in range(0, len(held), MAX_BATCH_ENTRIES):
            await _batch_call(
                queues,
                url,
                "ChangeMessageVisibilityBatch",
                held[start : start + MAX_BATCH_ENTRIES],
            )
    return bodies


async def _batch_call(
    queues: SqsQueues, url: str, operation: str, batch: Sequence[ReceivedMessage]
) -> None:
    if not batch:
        return
    entries: list[dict[str, Any]] = []
    for i, m in enumerate(batch):
        entry: dict[str, Any] = {"Id": str(i), "ReceiptHandle": m.receipt_handle}
        if operation == "ChangeMessageVisibilityBatch":
            entry["VisibilityTimeout"] = 0
        entries.append(entry)
    # Batch deletes are a test's need only: botocore's client serves them.
    await queues._control.call(operation, QueueUrl=url, Entries=entries)


async def send_to_dlq(queues: SqsQueues, kind: QueueKind, bodies: Sequence[str]) -> None:
    """Put messages straight into a DLQ, as SQS does with one past maxReceiveCount."""
    url = queues.queue_url(kind, dlq=True)
    for body in bodies:
        extra: dict[str, Any] = {}
        if kind == "tasks":  # a FIFO queue: one group, as the relay's per task type
            extra = {"MessageGroupId": "noop", "MessageDeduplicationId": uuid.uuid4().hex}
        await queues._control.call("SendMessage", QueueUrl=url, MessageBody=body, **extra)
