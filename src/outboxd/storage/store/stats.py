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

    async def prune(
        self,
        finished_before: float,
        dead_before: float,
        credentials_before: float,
        batch: int,
    ) -> dict[str, int]:
        """Delete old history, one short transaction of at most `batch` rows at a time."""
        if not all(math.isfinite(t) for t in (finished_before, dead_before, credentials_before)):
            # NaN compares false to everything but SQL may not: never guess.
            raise ValueError("prune needs finite cut-off times")
        totals: dict[str, int] = {}
        # A DEAD job's SENT relay row goes with its credentials: it is history the moment
        # the job died, kept only as long as the job can be redriven from it.
        for name, before, dead in (
            ("prune_relay_sent", finished_before, credentials_before),
            ("prune_work_completed", finished_before, dead_before),
            ("prune_finished_jobs", finished_before, dead_before),
            ("prune_finished_tasks", finished_before, dead_before),
            ("prune_login_failures", finished_before, dead_before),
            ("prune_login_throttle", finished_before, dead_before),
            ("prune_website_registrations", finished_before, dead_before),
            ("prune_dead_credentials", credentials_before, dead_before),
        ):
            total = 0
            while True:
                params = {"before": before, "limit": batch, "dead_before": dead}
                # Jobs weigh about ten rows each: a fifth of the batch is candidates enough.
                params["candidates"] = max(1, batch // 5)
                if name == "prune_finished_jobs":
                    n, more = await self.db.run(partial(self._prune_jobs, params))
                else:
                    n = await self.db.run(partial(self._count, name, params))
                    more = n >= batch
                total += n
                if not more:
                    break
            totals[name.removeprefix("prune_")] = total
        return totals

    def _prune_jobs(self, params: dict[str, Any]) -> Generator[Op, Any, tuple[int, bool]]:
        """One batch of jobs past retention deleted with their timelines (their outbox rows
        go by the foreign key's cascade): as many as keep the transaction within `limit`
        rows, one at least. (jobs deleted, whether more may be left)."""
        rows = yield fetch(self.q["prunable_jobs"], params)
        ids: list[str] = []
        taken = 0
        for r in rows:
            cost = 1 + int(r["attached"])
            if ids and taken + cost > params["limit"]:
                break
            ids.append(r["id"])
            taken += cost
        if not ids:
            return 0, False
        packed = json.dumps(ids)
        yield execute(self.q["delete_job_events_of"], {"ids": packed})
        n: int = yield execute(self.q["delete_jobs_of"], {"ids": packed})
        return n, len(rows) > len(ids) or len(rows) >= params["candidates"]

    async def give_back_space(self) -> int:
        return await self.db.give_back_space()
