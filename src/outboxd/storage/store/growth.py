"""The database's growth (`growth_ports.GrowthStore`): the room each table takes, its dead
rows, and the oldest open transaction, in one read for the /metrics gauges (and a
benchmark's before and after)."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Final

from outboxd.storage.db import Op, fetch
from outboxd.storage.growth_ports import OUTBOXD_TABLES, Growth
from outboxd.storage.store.base import StoreBase

# SQLite: a file up to this size is split table by table (`dbstat` reads each of its pages,
# on the reader thread the API's reads share); a larger one is reported whole.
SPLIT_MAX_BYTES: Final = 256 * 1024 * 1024


class SqlGrowth(StoreBase):
    async def growth(self) -> Growth:
        def body() -> Generator[Op, Any, Growth]:
            file = yield from self._one("growth_file", {"split_max": SPLIT_MAX_BYTES})
            assert file is not None  # one row, always
            tables = "growth_tables" if file["split"] else "growth_tables_whole_file"
            params = {
                "tables": list(OUTBOXD_TABLES),
                "bytes": file["bytes"],
                "free_bytes": file["free_bytes"],
            }
            rows = yield fetch(self.q[tables], params)
            oldest = yield from self._one("growth_oldest_transaction", {})
            age = oldest["age_s"] if oldest is not None else None
            return Growth(
                table_bytes={r["name"]: int(r["bytes"]) for r in rows},
                dead_rows={r["name"]: int(r["dead"]) for r in rows if r["dead"] is not None},
                live_rows={r["name"]: int(r["live"]) for r in rows if r["live"] is not None},
                oldest_transaction_age_s=max(0.0, float(age)) if age is not None else None,
            )

        return await self.db.read(body)
