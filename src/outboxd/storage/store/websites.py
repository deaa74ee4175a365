"""Websites and their work outbox (`ports.WebsiteStore`): registration, the claimer's
claims and outcomes."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from outboxd.errors import CapReached, InvalidState, NotFound
from outboxd.storage.db import Op, execute
from outboxd.storage.ports import Page
from outboxd.storage.store.base import WEBSITES_CAP, StoreBase
from outboxd.storage.store.records import website_record, work_record
from outboxd.storage.website_ports import WEBSITE_QUOTA_PERIOD_S, Website, WorkRow


class SqlWebsites(StoreBase):
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
        capped = registered_by if max_per_period else None

        def body() -> Generator[Op, Any, tuple[Website, bool] | CapReached]:
            if capped is not None:
                # The count and the insert are one step: no other registration of this
                # user commits in between (docs/decisions/0030-per-user-bounds.md).
                yield from self._cap_lock(WEBSITES_CAP, capped)
                quota = yield from self._one(
                    "website_quota",
                    {"user_id": capped, "domain": domain, "since": now - WEBSITE_QUOTA_PERIOD_S},
                )
                assert quota is not None
                if not quota["taken"] and quota["recent"] >= max_per_period:
                    oldest = quota["oldest"]
                    # Returned, not raised: nothing was written, and a member that raised
                    # would be rolled back and run again alone.
                    return CapReached(int(quota["recent"]), float(oldest))
            inserted = yield from self._one(
                "insert_website",
                {"id": website_id, "domain": domain, "favicon_url": favicon_url, "now": now},
            )
            if inserted is not None:
                yield execute(
                    self.q["insert_work_row"], {"id": work_id, "website_id": website_id, "now": now}
                )
                if registered_by is not None:
                    yield execute(
                        self.q["website_registration_insert"],
                        {"user_id": registered_by, "now": now, "website_id": website_id},
                    )
                    yield execute(
                        self.q["website_registrations_trim"],
                        {"user_id": registered_by, "before": now - WEBSITE_QUOTA_PERIOD_S},
                    )
            row = yield from self._one("select_website_by_domain", {"domain": domain})
            assert row is not None
            return website_record(row), inserted is not None

        if self.website_group is None:
            done = await self.db.run(body)
        else:
            done = await self.website_group.run(body, order=capped)
        if isinstance(done, CapReached):
            raise done
        return done

    async def get_website(self, domain: str) -> Website | None:
        return await self._record(
            "select_website_by_domain", {"domain": domain}, website_record, write=False
        )

    async def website_by_id(self, website_id: str) -> Website | None:
        return await self._record("select_website", {"id": website_id}, website_record, write=False)

    async def claim_work(
        self, now: float, retry_delay_s: float, processing_timeout_s: float
    ) -> WorkRow | None:
        params = {
            "now": now,
            "retry_before": now - retry_delay_s,
            "stale_before": now - processing_timeout_s,
        }

        def body() -> Generator[Op, Any, WorkRow | None]:
            # Three scans in priority order, each one small partial index:
            # never tried, then retries that waited long enough, then rows
            # whose holder died.
            for name in ("claim_work_fresh", "claim_work_retry", "claim_work_stale"):
                row = yield from self._one(name, params)
                if row is not None:
                    return work_record(row)
            return None

        return await self.db.run(body)

    async def complete_work(self, row: WorkRow, category: str | None, now: float) -> bool:
        def body() -> Generator[Op, Any, bool]:
            n = yield from self._count("work_completed", {"id": row.id, "version": row.version})
            if n != 1:
                return False  # a newer holder owns the row: its result will win
            if category is not None:
                yield execute(
                    self.q["set_website_category"],
                    {"id": row.website_id, "category": category, "now": now},
                )
            return True

        return await self.db.run(body)

    async def fail_work(self, row: WorkRow, error: str, final: bool, now: float) -> bool:
        return await self._changed(
            "work_failed",
            {
                "id": row.id,
                "version": row.version,
                "status": "FAILED" if final else "PENDING",
                "last_error": error[:1000],
                "now": now,
            },
        )

    async def give_back_work(self, row: WorkRow) -> bool:
        return await self._changed("work_give_back", {"id": row.id, "version": row.version})

    async def list_websites(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[Website]:
        return await self._page("list_websites", {"status": status}, limit, cursor, website_record)

    async def retry_failed_website(self, domain: str) -> Website:
        def body() -> Generator[Op, Any, Website]:
            before = yield from self._one("select_website_by_domain", {"domain": domain})
            if before is None:
                raise NotFound(f"no website {domain}")
            n = yield from self._count("work_retry_failed", {"website_id": before["id"]})
            if n != 1:
                raise InvalidState(
                    f"classification is {before['work_status'] or 'missing'}, not FAILED"
                )
            row = yield from self._one("select_website_by_domain", {"domain": domain})
            assert row is not None
            return website_record(row)

        return await self.db.run(body)
