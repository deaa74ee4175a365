"""Cluster pacing of the portal: one `PortalPacing` shared by every instance on the database.

`scrapers.suwon.pace_scope = "cluster"` swaps the scraper's own semaphore and
spacer for this: a portal session is a lease on one of `max_concurrency` rows of
`pace_leases` (with an expiry, renewed while the job scrapes, so a killed
instance's session comes back by itself), and each request starts at a slot of
the shared "suwon" pace row, `min_interval_s` after the one before it from any
instance. The claimer's cluster pace lives in claimer.py; both are described in
docs/pacing.md.

A slot is a window, not an instant: the request may start from the slot's time until
`late_limit` after it, never later (a holder woken later skips it), so slots are handed
out `spacing(delay)` = `delay + late_limit(delay)` apart and two requests from any
instances start at least `delay` apart however late within its window each starts. "Starts"
is the last moment before the request is sent: after every await its caller makes.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import socket
import time
import uuid
from collections.abc import AsyncIterator

import structlog

from outboxd.config import SuwonScraperSettings
from outboxd.errors import StorageError, StorageUnavailable
from outboxd.observability import OutageLog
from outboxd.scrapers.suwon import CheckHook, PortalPacing
from outboxd.scrapers.suwon_answers import PortalError
from outboxd.storage.ports import PaceLease, PaceSlot, PaceStore

log = structlog.get_logger(__name__)

PORTAL_PACE = "suwon"
# How often a job that found every session taken looks again.
_SESSION_POLL_S = 0.2

# How late after its slot a request may still start: this share of the slot, capped.
_LATE_SHARE = 0.05
_LATE_MAX_S = 0.05


def late_limit(delay_s: float) -> float:
    """How late after its slot a request may still start (`_LATE_SHARE`, `_LATE_MAX_S`)."""
    return min(_LATE_MAX_S, delay_s * _LATE_SHARE)


def spacing(delay_s: float) -> float:
    """How far apart slots are handed out so that requests started anywhere in their
    windows (up to `late_limit` after the slot) are still `delay_s` apart."""
    return delay_s + late_limit(delay_s)


def instance_holder() -> str:
    """Who holds a lease: readable in the table, unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class DbClock:
    """This host's estimate of the database clock, for turning slots into local deadlines.

    Each slot comes with the database's `now`, read somewhere between sending
    the statement and getting its answer; so the offset (database minus this
    host's wall clock) lies in [now - received, now - sent]. The intersection
    of those intervals over recent samples is tight (half the fastest round
    trip), and unlike "sleep slot - now from the answer", a late answer or a
    busy event loop does not move the deadline. Bounds are forgotten every
    minute, or when a sample disagrees with them (a clock step).
    """

    _FORGET_S = 60.0

    def __init__(self) -> None:
        self._low = -math.inf
        self._high = math.inf
        self._since = -math.inf

    def observe(self, sent_wall: float, received_wall: float, db_now: float) -> None:
        low, high = db_now - received_wall, db_now - sent_wall
        stale = time.monotonic() - self._since > self._FORGET_S
        if stale or low > self._high or high < self._low:
            self._low, self._high, self._since = low, high, time.monotonic()
        else:
            self._low, self._high = max(self._low, low), min(self._high, high)

    def deadline(self, db_time: float) -> float:
        """When `db_time` (database clock) comes, on this host's monotonic clock."""
        offset = (self._low + self._high) / 2 if math.isfinite(self._low) else 0.0
        return time.monotonic() + (db_time - offset - time.time())

    async def take(self, store: PaceStore, name: str, delay_s: float) -> tuple[PaceSlot, float]:
        """`store.pace_take`, and the slot's deadline on the monotonic clock."""
        sent = time.time()
        slot = await store.pace_take(name, delay_s, time.time)
        self.observe(sent, time.time(), slot.now)
        return slot, self.deadline(slot.slot)


class ClusterPortalPacing:
    """`PortalPacing` through the database: see the module docstring."""

    def __init__(
        self,
        store: PaceStore,
        settings: SuwonScraperSettings,
        name: str = PORTAL_PACE,
        holder: str | None = None,
    ) -> None:
        self._store = store
        self._name = name
        self._limit = settings.max_concurrency
        self._interval_s = settings.min_interval_s
        # A session outlives a stuck request by a margin; renewed while it runs.
        self.lease_s = max(3.0 * settings.timeout_s, 3.0)
        self._holder = holder or instance_holder()
        self._ensured = False
        self._clock = DbClock()
        # Renewals that cannot reach the database: one outage, not a line per renewal.
        self._outage = OutageLog("storage", "pacing")

    @contextlib.asynccontextmanager
    async def session(self) -> AsyncIterator[None]:
        lease = await self._acquire()
        renewer = asyncio.create_task(self._renew(lease))
        try:
            yield
        finally:
            renewer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await renewer
            try:
                await asyncio.shield(self._store.lease_release(lease))
            except StorageError as exc:  # it expires by itself
                log.warning("portal_session_release_failed", slot=lease.slot, error=exc)

    async def before_request(self, check: CheckHook | None = None) -> None:
        if self._interval_s <= 0:
            if check is not None:
                await check()
            return
        while True:
            try:
                _slot, deadline = await self._clock.take(
                    self._store, self._name, spacing(self._interval_s)
                )
            except StorageError:
                raise PortalError(
                    "PORTAL_UNAVAILABLE", "portal pacing: the database did not answer"
                ) from None
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            if check is not None:
                await check()
            # Past the slot's window (a descheduled process, a slow `check`): the next
            # slot's holder may already be due, so this slot is skipped rather than crowd it.
            if time.monotonic() - deadline <= late_limit(self._interval_s):
                return

    async def _acquire(self) -> PaceLease:
        try:
            if not self._ensured:
                await self._store.pace_ensure(self._name, self._limit)
                self._ensured = True
            while True:
                lease = await self._store.lease_take(
                    self._name, self._holder, self._limit, self.lease_s, time.time
                )
                if lease is not None:
                    return lease
                await asyncio.sleep(_SESSION_POLL_S * (0.5 + random.random()))
        except StorageError:
            raise PortalError(
                "PORTAL_UNAVAILABLE", "portal pacing: the database did not answer"
            ) from None

    async def _renew(self, lease: PaceLease) -> None:
        while True:
            await asyncio.sleep(self.lease_s / 3)
            try:
                if not await self._store.lease_renew(lease, self.lease_s, time.time):
                    log.warning("portal_session_lease_lost", slot=lease.slot)
                self._outage.recovered()
            except StorageUnavailable as exc:
                self._outage.failed(exc, slot=lease.slot)
            except StorageError as exc:
                log.warning("portal_session_renew_failed", slot=lease.slot, error=exc)


def portal_pacing(settings: SuwonScraperSettings, store: PaceStore) -> PortalPacing | None:
    """The shared pacing in cluster scope; None lets the scraper keep its own."""
    if settings.pace_scope == "cluster":
        return ClusterPortalPacing(store, settings)
    return None
