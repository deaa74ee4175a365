"""The relay's test doubles and readers, for the relay and dispatch tests: a publisher in
front of SqsQueues that fails the entries it is told to, reading a queue out, the outbox
rows, and RelaySettings small enough for tests."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any

from outboxd.config import RelaySettings
from outboxd.queue.sqs import BatchResult, OutgoingMessage, QueueKind, SqsQueues
from outboxd.storage.ports import RelayRow
from outboxd.storage.store import SqlStore

FAIL_REASON = "InternalError: simulated per-entry failure"


class PartialFailurePublisher:
    """A real publisher in front of SqsQueues: records every batch it is handed and
    fails (as SQS's `Failed` entries would) the entries `fail` names a reason for."""

    def __init__(
        self, inner: SqsQueues, fail: Callable[[OutgoingMessage], str | None] | None = None
    ) -> None:
        self.inner = inner
        self.fail = fail
        self.batches: list[list[OutgoingMessage]] = []

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        self.batches.append(list(messages))
        failed: dict[str, str] = {}
        passing: list[OutgoingMessage] = []
        for m in messages:
            reason = self.fail(m) if self.fail is not None else None
            if reason:
                failed[m.entry_id] = reason
            else:
                passing.append(m)
        if not passing:
            return BatchResult(successful={}, failed=failed)
        result = await self.inner.send_batch(kind, passing)
        return BatchResult(successful=dict(result.successful), failed={**result.failed, **failed})

    @property
    def bodies(self) -> list[str]:
        return [m.body for batch in self.batches for m in batch]


class GatedPublisher(PartialFailurePublisher):
    """While `hold` is true (from the start, unless told), each batch waits for `gate`;
    `entered` is set when the first such batch arrives: a publish in flight, for as long
    as the test wants."""

    def __init__(
        self,
        inner: SqsQueues,
        fail: Callable[[OutgoingMessage], str | None] | None = None,
        hold: bool = True,
    ) -> None:
        super().__init__(inner, fail)
        self.hold = hold
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        if self.hold:
            self.entered.set()
            await self.gate.wait()
        return await super().send_batch(kind, messages)


async def drain(queues: SqsQueues, kind: QueueKind = "jobs") -> list[tuple[str, str]]:
    """Every message now in the queue as (MessageId, body), deleting them."""
    out: list[tuple[str, str]] = []
    empty = 0
    while empty < 2:
        batch = await queues.receive(kind, 10, wait_time_s=0, visibility_timeout_s=30)
        if not batch:
            empty += 1
            continue
        for m in batch:
            out.append((m.message_id, m.body))
            await queues.delete(kind, m.receipt_handle)
    return out


async def all_rows(store: SqlStore) -> list[RelayRow]:
    page = await store.list_relay_rows(None, 500, None)
    assert page.next_cursor is None
    return list(page.items)


def assert_no_sent_without_message_id(rows: Sequence[RelayRow]) -> None:
    bad = [r.id for r in rows if r.status == "SENT" and not r.queue_message_id]
    assert bad == [], f"rows SENT without a queue message id: {bad}"


def relay_settings(**overrides: Any) -> RelaySettings:
    """No backoff in a test's time (10 s and more): a failed row waits for the clock."""
    base: dict[str, Any] = {
        "interval_s": 0.1,
        "batch_size": 10,
        "max_attempts": 3,
        "backoff_base_s": 10.0,
        "backoff_max_s": 1000.0,
        "publish_timeout_s": 2.0,
    }
    base.update(overrides)
    return RelaySettings(**base)
