"""Synchronous dispatch: the row a request just committed, published before the request is
answered (docs/architecture.md, "Coalesced dispatch").

Requests do not publish one message each: concurrent calls join shared SendMessageBatch
calls, and each request is answered with its own entry's outcome. Rows that are not
SENT when the request is answered stay for the relay loop (workers/relay.py).
"""

from __future__ import annotations

import asyncio
import time
from typing import Literal

from outboxd.crashpoints import crash_point
from outboxd.queue.sqs import MAX_BATCH_ENTRIES
from outboxd.storage.ports import RelayRow
from outboxd.workers.publishing import Publishing

# Coalesced batches in flight at once. Full batches leave at once while fewer than this
# are out. A partial batch leaves when no other batch is out: a request that finds
# batches out waits for them to return (or for its own batch to fill) and leaves with
# every request that arrived meanwhile, so the busier the API, the fuller the batches.
# When nothing is out a request does not wait at all (it leaves at the end of the event
# loop's turn): a lone request adds no delay.
DISPATCH_BATCHES_IN_FLIGHT = 4
# The longest a partial batch waits for the batches out before it leaves beside them:
# with a slow SQS (tens of milliseconds a call) waiting out a whole call would add that
# much to a request's answer.
DISPATCH_MAX_WAIT_S = 0.010

# A request's outcome: its row as marked SENT, False when not (the row stays for the
# loop), None when the row was not ours to publish (SENT already, or another holder's lease).
_Outcome = RelayRow | Literal[False] | None
# The request's outbox id, its row when the intake inserted it claimed, and its future.
_Waiter = tuple[str, RelayRow | None, "asyncio.Future[_Outcome]"]


class Dispatch:
    """Coalesces the requests' publishes into batches of at most `relay.batch_size`."""

    def __init__(
        self,
        send: Publishing,
        stop: asyncio.Event | None = None,
        batches_in_flight: int = DISPATCH_BATCHES_IN_FLIGHT,
        max_wait_s: float = DISPATCH_MAX_WAIT_S,
    ) -> None:
        self._send = send
        self._stop = stop
        self._dispatch_size = min(send.settings.batch_size, MAX_BATCH_ENTRIES)
        self._max_in_flight = max(1, batches_in_flight)
        self._max_wait_s = max_wait_s
        self._waiting: list[_Waiter] = []
        self._open: set[asyncio.Future[_Outcome]] = set()
        self._in_flight = 0
        self._timer: asyncio.Handle | None = None
        self._stop_watch: asyncio.Future[None] | None = None

    @property
    def max_in_flight(self) -> int:
        return self._max_in_flight

    async def publish_now(self, outbox_id: str) -> bool:
        """Publish one row for the request that created it; True when it is SENT.

        The row joins the next coalesced batch. True only once SQS acknowledged this
        row's own entry and the row is marked SENT; False when that entry failed, or
        the daemon is stopping (the row then stays for the relay loop).
        """
        return await self.dispatch(outbox_id) is not None

    def intake_claim_until(self, now: float) -> float | None:
        """The lease a request's intake gives its new outbox row, so that `dispatch` needs
        no claim transaction; None while stopping (the row is then left to the loop)."""
        return None if self._stopping() else now + self._send.lease_s

    async def dispatch(self, outbox_id: str, claimed: RelayRow | None = None) -> RelayRow | None:
        """`publish_now` with the row as it was committed SENT (None when it is not SENT),
        so the request can answer from what its batch wrote instead of reading it back.

        `claimed`: the row as the request's own intake inserted it, claimed with
        `intake_claim_until`; it is published without claiming it again.
        """
        crash_point("after_commit_before_publish")
        if self._stopping():
            return None
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[_Outcome] = loop.create_future()
        self._waiting.append((outbox_id, claimed, fut))
        self._open.add(fut)
        fut.add_done_callback(self._open.discard)
        self._watch_stop()
        self._schedule(loop)
        try:
            outcome = await fut
        except asyncio.CancelledError:
            self._forget(fut)
            raise
        if outcome is None:
            # SENT already, or another holder has it: most often the relay loop, which
            # can claim the row between the request's commit and this call.
            return await self._outcome_of_other_holder(outbox_id)
        return outcome or None

    def _stopping(self) -> bool:
        return self._stop is not None and self._stop.is_set()

    def _watch_stop(self) -> None:
        """Once per relay: when the stop event is set, every request still waiting is
        answered "not dispatched" at once, whatever its batch is doing."""
        if self._stop is not None and self._stop_watch is None:
            self._stop_watch = asyncio.ensure_future(self._release_on_stop(self._stop))

    async def _release_on_stop(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._waiting.clear()
        for fut in list(self._open):
            if not fut.done():
                fut.set_result(False)

    def _forget(self, fut: asyncio.Future[_Outcome]) -> None:
        self._waiting = [w for w in self._waiting if w[2] is not fut]

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        if len(self._waiting) >= self._dispatch_size:
            self._flush()  # a full batch leaves now if a slot is free
        elif self._in_flight == 0 and self._timer is None:
            # Nothing is out: no one is about to return with company for this request.
            # It leaves at the end of this turn of the loop, with the requests that
            # became ready in the same turn.
            self._timer = loop.call_soon(self._timer_over)
        self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        # A batch is out: the waiting requests leave when it returns, with a batch that
        # fills up before then, or after DISPATCH_MAX_WAIT_S, whichever comes first.
        if self._waiting and self._timer is None:
            self._timer = loop.call_later(self._max_wait_s, self._timer_over)

    def _timer_over(self) -> None:
        self._timer = None
        self._flush(partial=True)

    def _flush(self, partial: bool = False) -> None:
        """Start batches from the waiting requests while fewer than the bound are out:
        full ones, and a partial one when no other batch is out (or `partial`)."""
        while self._waiting and self._in_flight < self._max_in_flight:
            if len(self._waiting) < self._dispatch_size and self._in_flight > 0 and not partial:
                break
            batch = self._waiting[: self._dispatch_size]
            del self._waiting[: self._dispatch_size]
            self._in_flight += 1
            self._send.in_background(self._dispatch(batch))
        if not self._waiting and self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._arm(asyncio.get_running_loop())

    async def _dispatch(self, batch: list[_Waiter]) -> None:
        """One coalesced batch: claim the rows its intakes did not claim already in one
        transaction, send them in one SendMessageBatch, record the outcome in one, and
        answer each request with its own entry's outcome."""
        # The batch runs in a task of its own with an empty context (`in_background`): its
        # lines name no request; its rows name their own traces.
        try:
            # A lease taken at intake that is still good (it runs for seconds, a request
            # gets here within milliseconds) is ours; otherwise the row is claimed now.
            now = self._send.clock()
            rows = [c for _, c, _ in batch if c is not None and (c.claimed_until or 0) > now]
            held = {r.id for r in rows}
            unclaimed = [oid for oid, _, _ in batch if oid not in held]
            if unclaimed:
                rows += await self._send.store.claim_relay_rows(unclaimed, now, self._send.lease_s)
            claimed = {r.id for r in rows}
            sent = {r.id: r for r in await self._send.publish(rows)} if rows else {}
            for oid, _, fut in batch:
                if not fut.done():
                    fut.set_result(sent.get(oid, False) if oid in claimed else None)
        except Exception as exc:  # a database failure: each request sees it
            for _, _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc)
        finally:
            for _, _, fut in batch:
                if not fut.done():  # the batch was cancelled: nobody may hang on it
                    fut.set_result(False)
            self._in_flight -= 1
            if self._waiting:
                self._flush()

    async def _outcome_of_other_holder(self, outbox_id: str) -> RelayRow | None:
        """The row once it is SENT. Waits for a holder that is publishing it now (at
        most one publish timeout, plus a second for the holder to record the outcome),
        so the request's answer, and `api.require_dispatch`, reflect that publish
        rather than a moment in the middle of it."""
        deadline = time.monotonic() + self._send.settings.publish_timeout_s + 1.0
        while True:
            row = await self._send.store.get_relay_row(outbox_id)
            if row is None or row.status == "SENT":
                return row
            in_flight = row.claimed_until is not None and row.claimed_until > self._send.clock()
            if not in_flight or time.monotonic() >= deadline or self._stopping():
                return None
            await asyncio.sleep(0.05)
