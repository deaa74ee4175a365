"""Cluster pacing (`ports.PaceStore`): slots and session leases shared by every instance.

The writes take the caller's clock and read it inside their transaction, so on SQLite (one
host: its clock) the time is read with the write lock held; the Postgres blocks ignore it
and read clock_timestamp() instead.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from outboxd.storage.db import Op, execute
from outboxd.storage.ports import Clock, PaceLease, PaceSlot, PaceState
from outboxd.storage.store.base import StoreBase
from outboxd.storage.store.records import pace_state_record


class SqlPace(StoreBase):
    async def pace_ensure(self, name: str, lease_slots: int = 0) -> None:
        def body() -> Generator[Op, Any, None]:
            yield execute(self.q["pace_ensure"], {"name": name})
            for slot in range(lease_slots):
                yield execute(self.q["lease_ensure"], {"name": name, "slot": slot})

        await self.db.run(body)

    async def pace_take(self, name: str, delay_s: float, clock: Clock) -> PaceSlot:
        def body() -> Generator[Op, Any, PaceSlot]:
            params = {"name": name, "delay": float(delay_s), "now": clock()}
            row = yield from self._one("pace_take", params)
            if row is None:  # first use on a database that has not seen this resource
                yield execute(self.q["pace_ensure"], {"name": name})
                row = yield from self._one("pace_take", params)
            assert row is not None
            return PaceSlot(
                slot=float(row["slot"]),
                now=float(row["now"]),
                paused_until=float(row["paused_until"]),
            )

        return await self.db.run(body)

    async def pace_pause(self, name: str, pause_s: float, clock: Clock) -> PaceState:
        def body() -> Generator[Op, Any, PaceState]:
            params = {"name": name, "pause_s": float(pause_s), "now": clock()}
            row = yield from self._one("pace_pause", params)
            if row is None:
                yield execute(self.q["pace_ensure"], {"name": name})
                row = yield from self._one("pace_pause", params)
            assert row is not None
            state = yield from self._one("pace_read", {"name": name, "now": row["now"]})
            assert state is not None
            return pace_state_record(state)

        return await self.db.run(body)

    async def pace_state(self, name: str, now: float) -> PaceState | None:
        def body() -> Generator[Op, Any, PaceState | None]:
            row = yield from self._one("pace_read", {"name": name, "now": now})
            return pace_state_record(row) if row else None

        return await self.db.read(body)

    async def lease_take(
        self, name: str, holder: str, limit: int, lease_s: float, clock: Clock
    ) -> PaceLease | None:
        def body() -> Generator[Op, Any, PaceLease | None]:
            row = yield from self._one(
                "lease_take",
                {
                    "name": name,
                    "holder": holder,
                    "limit": int(limit),
                    "lease_s": float(lease_s),
                    "now": clock(),
                },
            )
            if row is None:
                return None
            return PaceLease(name, int(row["slot"]), holder, float(row["expires_at"]))

        return await self.db.run(body)

    async def lease_renew(self, lease: PaceLease, lease_s: float, clock: Clock) -> bool:
        def body() -> Generator[Op, Any, bool]:
            params = {
                "name": lease.name,
                "slot": lease.slot,
                "holder": lease.holder,
                "lease_s": float(lease_s),
                "now": clock(),
            }
            n = yield from self._count("lease_renew", params)
            return n == 1

        return await self.db.run(body)

    async def lease_release(self, lease: PaceLease) -> bool:
        return await self._changed(
            "lease_release", {"name": lease.name, "slot": lease.slot, "holder": lease.holder}
        )
