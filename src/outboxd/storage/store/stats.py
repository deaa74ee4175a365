"""Counts for the operator (`ports.StatsStore`) and pruning of old history
(`ports.PruneStore`)."""

from __future__ import annotations

import json
import math
from collections.abc import Generator
from functools import partial
from typing import Any

from outboxd.storage.db import Op, execute, fetch
from outboxd.storage.ports import PaceState, StatusCount
from outboxd.storage.store.base import StoreBase
from outboxd.storage.store.records import pace_state_record


class SqlStats(StoreBase):
    async def status_counts(self) -> list[StatusCount]:
        def body() -> Generator[Op, Any, list[StatusCount]]:
            out: list[StatusCount] = []
            for table, qname in (
                ("jobs", "count_jobs"),
                ("relay_outbox", "count_relay"),
                ("work_outbox", "count_work"),
                ("task_runs", "count_tasks"),
            ):
                rows = yield fetch(self.q[qname], {})
                for r in rows:
                    oldest = r["oldest"]
                    out.append(
                        StatusCount(
                            table,
                            r["status"],
                            int(r["n"]),
                            float(oldest) if oldest is not None else None,
                        )
                    )
            return out

        return await self.db.read(body)

    async def pace_states(self, now: float) -> list[PaceState]:
        def body() -> Generator[Op, Any, list[PaceState]]:
            rows = yield fetch(self.q["pace_all"], {"now": now})
            return [pace_state_record(r) for r in rows]

        return await self.db.read(body)

    async def prune(self, finished_before: float, dead_before: float, batch: int) -> dict[str, int]:
        """Delete old history in batches of `batch` rows, one short transaction each."""
        if not (math.isfinite(finished_before) and math.isfinite(dead_before)):
            # NaN compares false to everything but SQL may not: never guess.
            raise ValueError("prune needs finite cut-off times")
        totals: dict[str, int] = {}
        for name, before in (
            ("prune_relay_sent", finished_before),
            ("prune_work_completed", finished_before),
            ("prune_finished_jobs", finished_before),
            ("prune_finished_tasks", finished_before),
            ("prune_login_failures", finished_before),
            ("prune_login_throttle", finished_before),
            ("prune_website_registrations", finished_before),
            ("prune_dead_credentials", dead_before),
        ):
            total = 0
            while True:
                params = {"before": before, "limit": batch}
                if name == "prune_relay_sent":
                    params["dead_before"] = dead_before
                if name == "prune_finished_jobs":
                    n = await self.db.run(partial(self._prune_jobs, params))
                else:
                    n = await self.db.run(partial(self._count, name, params))
                total += n
                if n < batch:
                    break
            totals[name.removeprefix("prune_")] = total
        return totals

    def _prune_jobs(self, params: dict[str, Any]) -> Generator[Op, Any, int]:
        """One batch of finished jobs deleted, their timelines with them (their outbox rows
        go by the foreign key's cascade)."""
        rows = yield fetch(self.q["prunable_jobs"], params)
        if not rows:
            return 0
        ids = json.dumps([r["id"] for r in rows])
        yield execute(self.q["delete_job_events_of"], {"ids": ids})
        n: int = yield execute(self.q["delete_jobs_of"], {"ids": ids})
        return n
