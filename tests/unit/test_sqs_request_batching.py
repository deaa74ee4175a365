"""How many messages a receive asks for (workers/prefetch.py), and what becomes of a batch of
deletes SQS could not take (queue/deletes.py); the calls themselves against moto are in
tests/integration/test_sqs_batches.py."""

from __future__ import annotations

from collections.abc import Sequence

from structlog.testing import capture_logs

from outboxd.queue.deletes import CoalescedDeletes
from outboxd.queue.sqs import QueueError, QueueKind
from outboxd.workers.prefetch import Prefetch
from tests.support.waits import eventually


def test_a_receive_asks_for_the_free_slots_until_the_pace_is_known() -> None:
    p = Prefetch(4)
    assert [p.ask(free) for free in (1, 4, 10)] == [1, 4, 10]


def test_ahead_by_what_the_slots_start_within_the_horizon() -> None:
    p = Prefetch(4, horizon_s=1.0)
    p.observe(0.5)  # 4 slots x 1 s / 0.5 s: 8 ahead
    assert p.ask(1) == 9
    assert p.ask(3) == 10  # never more than one receive's ten
    p = Prefetch(4, horizon_s=1.0)
    p.observe(5.0)  # a slow portal: nothing ahead
    assert p.ask(1) == 1
    assert p.ask(4) == 4


def test_the_mean_follows_the_handlers() -> None:
    p = Prefetch(1, horizon_s=1.0)
    p.observe(0.1)
    assert p.ask(1) == 10
    for _ in range(30):
        p.observe(2.0)  # the portal slowed down
    assert p.ask(1) == 1


class Failing:
    """A queue whose DeleteMessageBatch fails as a whole."""

    def __init__(self, outage: bool) -> None:
        self.outage = outage
        self.calls: list[list[str]] = []

    async def delete_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], dlq: bool = False
    ) -> dict[str, str]:
        self.calls.append(list(receipt_handles))
        raise QueueError("SQS said no", "X", outage=self.outage)


async def test_a_refused_batch_is_not_tried_again() -> None:
    sqs = Failing(outage=False)
    deletes = CoalescedDeletes(sqs, "jobs", window_s=0.0)
    with capture_logs() as logs:
        deletes.add("h1")
        await deletes.close()
    assert sqs.calls == [["h1"]]
    assert deletes.waiting == 0
    assert [(e["event"], e["retried"]) for e in logs] == [("sqs_delete_failed", False)]


async def test_an_outage_keeps_the_deletes_until_their_messages_are_back_anyway() -> None:
    now = [0.0]
    sqs = Failing(outage=True)
    deletes = CoalescedDeletes(sqs, "jobs", window_s=0.0, give_up_s=60.0, clock=lambda: now[0])
    deletes.add("h1")
    deletes.add("h2")
    await _calls(sqs, 1)
    assert deletes.waiting == 2  # back in line for the next try, a backoff later
    now[0] = 61.0  # their messages are visible again by now: dropped at the next failure
    with capture_logs() as logs:
        await deletes.close()  # (closing: tried once more, not kept)
    assert sqs.calls == [["h1", "h2"], ["h1", "h2"]]
    assert deletes.waiting == 0
    assert [(e["event"], e["retried"]) for e in logs] == [("sqs_delete_failed", False)]


async def _calls(sqs: Failing, n: int) -> None:
    await eventually(lambda: len(sqs.calls) >= n, what=f"{n} DeleteMessageBatch calls")
