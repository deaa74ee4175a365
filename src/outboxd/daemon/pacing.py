"""Cluster pacing of the portal: one `PortalPacing` shared by every instance on the database.

`scrapers.suwon.pace_scope = "cluster"` swaps the scraper's own semaphore and
spacer for this: a portal session is a lease on one of `max_concurrency` rows of
`pace_leases` (with an expiry, renewed while the job scrapes, so a killed
instance's session comes back by itself), and each request starts at a slot of
the shared "suwon" pace row, `min_interval_s` after the one before it from any
instance. The claimer's cluster pace lives in claimer.py; both are described in
docs/pacing.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import socket
import uuid
from collections.abc import AsyncIterator

import structlog

from outboxd.config import SuwonScraperSettings
from outboxd.errors import StorageError
from outboxd.scrapers.suwon import PortalError, PortalPacing
from outboxd.storage.ports import PaceLease, PaceStore

log = structlog.get_logger(__name__)

PORTAL_PACE = "suwon"
# How often a job that found every session taken looks again.
_SESSION_POLL_S = 0.2


def instance_holder() -> str:
    """Who holds a lease: readable in the table, unique per process start."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


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

    async def before_request(self) -> None:
        if self._interval_s <= 0:
            return
        try:
            slot = await self._store.pace_take(self._name, self._interval_s)
        except StorageError:
            raise PortalError(
                "PORTAL_UNAVAILABLE", "portal pacing: the database did not answer"
            ) from None
        if slot.wait_s > 0:
            await asyncio.sleep(slot.wait_s)

    async def _acquire(self) -> PaceLease:
        try:
            if not self._ensured:
                await self._store.pace_ensure(self._name, self._limit)
                self._ensured = True
            while True:
                lease = await self._store.lease_take(
                    self._name, self._holder, self._limit, self.lease_s
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
                if not await self._store.lease_renew(lease, self.lease_s):
                    log.warning("portal_session_lease_lost", slot=lease.slot)
            except StorageError as exc:
                log.warning("portal_session_renew_failed", slot=lease.slot, error=exc)


def portal_pacing(settings: SuwonScraperSettings, store: PaceStore) -> PortalPacing | None:
    """The shared pacing in cluster scope; None lets the scraper keep its own."""
    if settings.pace_scope == "cluster":
        return ClusterPortalPacing(store, settings)
    return None
