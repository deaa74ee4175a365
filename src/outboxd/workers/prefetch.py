"""Receiving ahead: how many job messages one receive may take beyond the free handler slots,
and how those wait for a slot.

With a backlog, handler slots free one at a time, and a receive for the free slots alone
takes one message: a ReceiveMessage per job. A receive may take up to ten instead: the free
slots, plus as many as the consumer's own pace starts within PREFETCH_HORIZON_S (its slots times
the horizon, over the mean time of a handler). Until a handler has finished, the pace is
unknown and nothing is taken ahead. The messages taken ahead wait here, in the order SQS
gave them, each started as a slot frees, and the receive loop receives again only once they
all started: one receive's surplus at most waits, about a horizon long.

While they wait, their visibility is renewed every half visibility timeout (as a run's
heartbeat does), so a slow stretch of the portal spends no receive on a message that only
waited. At a stop, the ones still waiting are made visible again at once, for another
consumer (docs/decisions/0036-fewer-sqs-requests-per-job.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Coroutine, Sequence
from typing import Any, Final, Protocol

import structlog

from outboxd.queue.sqs import MAX_BATCH_ENTRIES, QueueError, QueueKind, ReceivedMessage
from outboxd.workers.handler_slots import HandlerSlots

log = structlog.get_logger(__name__)

# How far ahead a receive takes messages, in the consumer's own time: what its slots start
# in this long wait here at most (about).
PREFETCH_HORIZON_S: Final = 1.0
# The weight of the newest handler time in the running mean.
_SMOOTHING: Final = 0.2


class Prefetch:
    """The number of messages a receive asks for, from the handlers' running mean time."""

    def __init__(self, capacity: int, horizon_s: float = PREFETCH_HORIZON_S) -> None:
        self._capacity = capacity
        self._horizon_s = horizon_s
        self._mean_s: float | None = None

    def observe(self, seconds: float) -> None:
        """One handler's time, from its start to its end."""
        if self._mean_s is None:
            self._mean_s = seconds
        else:
            self._mean_s += _SMOOTHING * (seconds - self._mean_s)

    def ask(self, free: int) -> int:
        """How many messages a receive asks for with `free` slots free."""
        if self._mean_s is None:
            return free
        ahead = int(self._capacity * self._horizon_s / max(self._mean_s, 0.001))
        return max(free, min(MAX_BATCH_ENTRIES, free + ahead))


class VisibilityBatches(Protocol):
    async def change_visibility_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], timeout_s: int, dlq: bool = False
    ) -> dict[str, str]: ...


async def hand_out(
    queues: VisibilityBatches,
    kind: QueueKind,
    ahead: Sequence[ReceivedMessage],
    slots: HandlerSlots,
    stop: asyncio.Event,
    start: Callable[[ReceivedMessage], object],
    visibility_s: int,
) -> None:
    """Start each message of `ahead` (received beyond the free slots) once a slot is free,
    in order; their visibility renewed every half `visibility_s` while they wait, and the
    ones still waiting at a stop made visible again."""
    waiting = deque(ahead)
    kept = time.monotonic()
    try:
        while waiting and not stop.is_set():
            keep_in_s = kept + visibility_s / 2 - time.monotonic()
            if keep_in_s <= 0:
                await _set_visibility(queues, kind, waiting, visibility_s)
                kept = time.monotonic()
            elif await _slot_or_stop(slots, stop, keep_in_s):
                start(waiting.popleft())
    finally:
        if waiting:
            await asyncio.shield(_set_visibility(queues, kind, waiting, 0))


def spawner(
    tg: asyncio.TaskGroup, handle: Callable[[ReceivedMessage], Coroutine[Any, Any, None]]
) -> Callable[[ReceivedMessage], None]:
    """What starts a message's handler in `tg`."""

    def start(msg: ReceivedMessage) -> None:
        tg.create_task(handle(msg))

    return start


async def _slot_or_stop(slots: HandlerSlots, stop: asyncio.Event, timeout_s: float) -> bool:
    """True with one slot reserved; False (none reserved) at a stop or after `timeout_s`."""
    reserve = asyncio.ensure_future(slots.reserve_one())
    stopped = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait(
            {reserve, stopped}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stopped.cancel()
        reserve.cancel()  # nothing when it has a slot already
    with contextlib.suppress(asyncio.CancelledError):
        await reserve
    if reserve.cancelled():
        return False
    if stop.is_set():
        await slots.release(1)
        return False
    return True


async def _set_visibility(
    queues: VisibilityBatches, kind: QueueKind, messages: Sequence[ReceivedMessage], timeout_s: int
) -> None:
    """A visibility for the waiting messages, ten to a request. A failure is logged: a
    message whose visibility runs out comes back, to this consumer or another."""
    handles = [m.receipt_handle for m in messages]
    for i in range(0, len(handles), MAX_BATCH_ENTRIES):
        chunk = handles[i : i + MAX_BATCH_ENTRIES]
        try:
            failed = await queues.change_visibility_batch(kind, chunk, timeout_s)
        except QueueError as exc:
            failed = dict.fromkeys(chunk, str(exc))
        if failed:
            log.warning(
                "prefetched_visibility_failed",
                queue=kind,
                messages=len(failed),
                timeout_s=timeout_s,
                error=next(iter(failed.values())),
            )
