"""Readiness: whether the database and SQS answer, and starting the queues while SQS is down.

`/readyz`, the console's runtime view, the /metrics gauges and `outboxd status` read
`Readiness`; `QueueReadiness` keeps trying to start the queues in the background so a
daemon that started while SQS was unreachable recovers without a restart.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import structlog

from outboxd.queue.sqs import KINDS, QueueDepth, QueueError, QueueKind, SqsQueues
from outboxd.storage.store import SqlStore
from outboxd.workers.loops import LoopFailures, sleep_or_stop

log = structlog.get_logger(__name__)

READY_CHECK_TIMEOUT_S = 2.0


class QueueReadiness:
    """Starts the queues, retrying in the background while SQS is unreachable.

    Until they are up, every queue call raises QueueError, which the API and the
    relay already treat as "SQS is down": jobs are accepted and wait in the outbox.
    """

    def __init__(self, queues: SqsQueues) -> None:
        self.queues = queues
        self.up = asyncio.Event()
        # No jitter: one probe per daemon, nothing to spread.
        self._failures = LoopFailures("sqs_connect", "sqs_start_failed", base_s=1.0, cap_s=30.0)
        self._delay = 1.0

    async def start_once(self) -> bool:
        try:
            await self.queues.start()
        except QueueError as exc:
            self._delay = self._failures.failed(exc)
            return False
        self._failures.ok()
        self.up.set()
        return True

    async def run(self, stop: asyncio.Event) -> None:
        while not self.up.is_set() and not stop.is_set():
            await sleep_or_stop(stop, self._delay)
            if not stop.is_set():
                await self.start_once()


@dataclass
class DependencyReadiness:
    store: SqlStore
    queues: SqsQueues | None

    async def check(self) -> dict[str, str]:
        checks: dict[str, str] = {}
        checks["database"] = await _probe(self.store.db.ping)
        if self.queues is not None:
            checks["sqs"] = await _probe(self.queues.ping)
        return checks

    async def queue_stats(self) -> dict[QueueKind, QueueDepth]:
        out: dict[QueueKind, QueueDepth] = {}
        if self.queues is None:
            return out
        for kind in KINDS:
            out[kind] = await asyncio.wait_for(self.queues.depth(kind), READY_CHECK_TIMEOUT_S)
        return out


async def _probe(fn: Callable[[], Awaitable[None]]) -> str:
    try:
        await asyncio.wait_for(fn(), READY_CHECK_TIMEOUT_S)
    except TimeoutError:
        return f"timeout: no answer within {READY_CHECK_TIMEOUT_S:g} s"
    except Exception as exc:
        return f"{type(exc).__name__}: {str(exc)[:120]}"
    return "ok"
