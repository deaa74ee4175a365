"""Starting a job's run when its message arrives before the publisher's SENT mark.

SQS hands a message out as soon as it has it; the publisher marks the outbox row SENT (and
records `dispatched`) only after SQS answered. A run that started in between would put
`started` before `dispatched` in the job's timeline. `start_job_run` refuses a QUEUED job
whose outbox row a publisher holds, and the consumer waits here for the mark, in the
process: a bounce through SQS would spend a receive on the way to the DLQ
(docs/decisions/0031-timeline-in-causal-order.md).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Protocol

from outboxd.queue.sqs import QueueKind, ReceivedMessage
from outboxd.services.parking import parked_for_another_message
from outboxd.storage.ports import RELAY_UNSENT_STATUSES, JobRecord, JobStore

# A SENT mark normally commits within milliseconds of SQS's answer: look again soon, then
# less often.
FIRST_PAUSE_S = 0.005
LONGEST_PAUSE_S = 0.2


class VisibilityKeeper(Protocol):
    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None: ...


async def start_when_marked(
    store: JobStore,
    queues: VisibilityKeeper,
    msg: ReceivedMessage,
    job_id: str,
    outbox_id: str | None,
    visibility_s: int,
    clock: Callable[[], float],
) -> tuple[JobRecord | None, JobRecord | None]:
    """The run, started (with a lease of `visibility_s`); or None and the job as read when it
    did not start: finished, cancelled, held by another run, parked for another message, or
    refused with nothing holding it (the caller bounces the message as it sees fit).

    While a publisher holds the job's outbox row the start is tried again after FIRST_PAUSE_S,
    the pause doubling up to LONGEST_PAUSE_S, never past the publisher's lease; the message's
    visibility is renewed every half `visibility_s`, as a run's heartbeat does."""
    pause, kept, again = FIRST_PAUSE_S, time.monotonic(), True
    while True:
        running = await store.start_job_run(
            job_id, clock(), visibility_s, msg.receive_count, outbox_id
        )
        if running is not None:
            return running, None
        held = await store.get_job(job_id)
        now = clock()
        if (
            held is None
            or held.terminal
            or held.cancel_requested
            or (held.lease_until or 0) >= now  # another run holds it
            or parked_for_another_message(held, outbox_id)
        ):
            return None, held
        row = await store.latest_relay_row_for_job(job_id)
        until = row.claimed_until if row is not None else None
        if row is None or row.status not in RELAY_UNSENT_STATUSES or until is None or until < now:
            # The mark (or the end of the publisher's lease) came between the start and these
            # reads: start again, once; refused with nothing holding it, the caller bounces.
            if not again:
                return None, held
            again = False
            continue
        if time.monotonic() - kept >= visibility_s / 2:
            await queues.change_visibility("jobs", msg.receipt_handle, visibility_s)
            kept = time.monotonic()
        await asyncio.sleep(min(pause, until - now))
        pause = min(2 * pause, LONGEST_PAUSE_S)
