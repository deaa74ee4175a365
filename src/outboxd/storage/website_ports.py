"""What the websites' classification asks of storage: its records and its Protocol.

Beside storage/ports.py (one concern per Protocol, as there): a registered website and
its work row, the claimer's unit of work (workers/claimer.py), with the registration
quota's period.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Protocol

from outboxd.storage.ports import Page, WorkStatus

# api.max_websites_per_user_per_hour counts registrations over this period.
WEBSITE_QUOTA_PERIOD_S: Final = 3600.0


@dataclass(frozen=True)
class Website:
    id: str
    domain: str
    favicon_url: str | None
    category: str | None
    created_at: float
    work_status: WorkStatus | None
    work_attempts: int
    work_last_error: str | None


@dataclass(frozen=True)
class WorkRow:
    id: str
    website_id: str
    status: WorkStatus
    attempt_count: int
    attempted_at: float | None
    last_error: str | None
    created_at: float
    version: int


class WebsiteStore(Protocol):
    async def register_website(
        self,
        website_id: str,
        work_id: str,
        domain: str,
        favicon_url: str | None,
        now: float,
        registered_by: str | None = None,
        max_per_period: int = 0,
    ) -> tuple[Website, bool]:
        """Upsert by domain; with `registered_by`, a new website is also counted for that
        user (and the user's counts older than an hour dropped) in the same transaction.
        `max_per_period` > 0: CapReached, writing nothing, when `registered_by` counted that
        many in the last WEBSITE_QUOTA_PERIOD_S (a known domain never is)."""
        ...

    async def get_website(self, domain: str) -> Website | None: ...
    async def claim_work(
        self, now: float, retry_delay_s: float, processing_timeout_s: float
    ) -> WorkRow | None: ...
    async def website_by_id(self, website_id: str) -> Website | None: ...
    async def complete_work(self, row: WorkRow, category: str | None, now: float) -> bool: ...
    async def fail_work(self, row: WorkRow, error: str, final: bool, now: float) -> bool: ...
    async def give_back_work(self, row: WorkRow) -> bool: ...
    async def list_websites(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[Website]: ...
    async def retry_failed_website(self, domain: str) -> Website:
        """A FAILED classification back to PENDING; NotFound, or InvalidState if not FAILED."""
        ...
