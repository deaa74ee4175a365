"""The dependency breakers (`breaker_ports.BreakerStore`): one row per outside system, the
jobs held while it is away, and their release."""

from __future__ import annotations

from collections.abc import Generator, Mapping
from typing import Any

from outboxd.storage.breaker_ports import Closed, DependencyRow, OutageCounted
from outboxd.storage.db import Op, Row, execute, fetch
from outboxd.storage.ports import JobRecord, NewEvent
from outboxd.storage.store.base import StoreBase
from outboxd.storage.store.records import dump, job_record

# The due time of a held job's row while nobody knows when its dependency is back: never,
# until the breaker releases it.
NOT_BEFORE_RELEASE = 32503680000.0


def _float(v: Any) -> float | None:
    return None if v is None else float(v)


def dependency_record(r: Row) -> DependencyRow:
    return DependencyRow(
        name=r["name"],
        failures_in_a_row=int(r["failures_in_a_row"]),
        down_since=_float(r["down_since"]),
        last_error=r["last_error"],
        last_failure_at=_float(r["last_failure_at"]),
        last_probe_at=_float(r["last_probe_at"]),
        probe_job=r["probe_job"],
        probe_until=_float(r["probe_until"]),
        paused_at=_float(r["paused_at"]),
        paused_until=_float(r["paused_until"]),
        pause_reason=r["pause_reason"],
        paused_by=r["paused_by"],
        updated_at=float(r["updated_at"]),
    )


class SqlBreakers(StoreBase):
    async def dependency_rows(self) -> list[DependencyRow]:
        def body() -> Generator[Op, Any, list[DependencyRow]]:
            rows = yield fetch(self.q["dependency_rows"], {})
            return [dependency_record(r) for r in rows]

        return await self.db.read(body)

    async def count_outage(
        self, name: str, error: str, open_after: int, now: float, job: str | None = None
    ) -> OutageCounted:
        params = {"name": name, "error": error[:500], "open_after": open_after, "now": now}

        def body() -> Generator[Op, Any, OutageCounted]:
            row = yield from self._one("dependency_outage", {**params, "job": job})
            if row is None:
                raise LookupError(f"no dependency {name}")
            got = dependency_record(row)
            return OutageCounted(got, got.down_since == now)

        return await self.db.run(body)

    async def count_through(self, name: str, now: float) -> Closed | None:
        def body() -> Generator[Op, Any, Closed | None]:
            before = yield from self._one("select_dependency", {"name": name})
            row = yield from self._one("dependency_through", {"name": name, "now": now})
            if row is None or before is None:
                return None
            down_since = _float(before["down_since"])
            released = 0
            if down_since is not None:
                released = yield from self._count(
                    "dependency_release_waiting", {"name": name, "now": now}
                )
            return Closed(down_since, released)

        return await self.db.run(body)

    async def take_probe(
        self, name: str, holder: str | None, now: float, probe_s: float, hold_s: float
    ) -> str | None:
        def body() -> Generator[Op, Any, str | None]:
            waiting = None
            if holder is None:
                waiting = yield from self._one("dependency_oldest_waiting", {"name": name})
                if waiting is None:
                    return None
            probe = holder if waiting is None else str(waiting["job_id"])
            taken = yield from self._one(
                "dependency_probe_take",
                {
                    "name": name,
                    "job": probe,
                    "now": now,
                    "until": now + hold_s,
                    "probe_before": now - probe_s,
                },
            )
            if taken is None:
                return None
            if waiting is not None:
                yield execute(self.q["dependency_release_one"], {"id": waiting["id"], "now": now})
            return probe

        return await self.db.run(body)

    async def pause_dependency(
        self, name: str, reason: str, until: float | None, actor: str, now: float
    ) -> DependencyRow:
        params = {"name": name, "reason": reason, "until": until, "actor": actor, "now": now}
        got = await self._record("dependency_pause", params, dependency_record)
        if got is None:
            raise LookupError(f"no dependency {name}")
        return got

    async def resume_dependency(
        self, name: str, now: float, ended_before: float | None = None
    ) -> DependencyRow | None:
        params = {"name": name, "now": now, "ended_before": ended_before}
        return await self._record("dependency_resume", params, dependency_record)

    async def release_waiting(self, name: str, now: float) -> int:
        def body() -> Generator[Op, Any, int]:
            n = yield from self._count("dependency_release_waiting", {"name": name, "now": now})
            return n

        return await self.db.run(body)

    async def waiting_jobs(self, name: str) -> int:
        def body() -> Generator[Op, Any, int]:
            row = yield from self._one("dependency_waiting_jobs", {"name": name})
            return int(row["n"]) if row is not None else 0

        return await self.db.read(body)

    async def hold_job(
        self,
        job: JobRecord,
        outbox_id: str,
        wait_for: Mapping[str, Any],
        until: float | None,
        now: float,
        *,
        give_back: bool,
        new_wait: bool,
    ) -> JobRecord | None:
        params = {
            "id": job.id,
            "version": job.version,
            "now": now,
            "give_back": 1 if give_back else 0,
            "wait_until": until,
            "wait_for": dump(wait_for),
            "wait_outbox_id": outbox_id,
        }
        relay = {
            "id": outbox_id,
            "job_id": job.id,
            "now": now,
            "due": NOT_BEFORE_RELEASE if until is None else max(until, now),
            "traceparent": job.traceparent,
            "waits_for": wait_for["dependency"],
        }

        def body() -> Generator[Op, Any, JobRecord | None]:
            if new_wait:
                event = NewEvent("waiting", now, {**wait_for, "outboxId": outbox_id})
                row = yield from self._job_change("hold_job", params, event)
            else:
                row = yield from self._one("hold_job", params)
            if row is None:
                return None
            yield execute(self.q["insert_waiting_relay_row"], relay)
            return job_record(row)

        held = await self.db.run(body)
        if held is not None:
            self.changes.committed((held.id,))
        return held

    async def resume_job(self, job: JobRecord, now: float) -> JobRecord | None:
        params = {"id": job.id, "version": job.version, "now": now}
        event = NewEvent("resumed", now, dict(job.wait_for or {}))
        return await self._job_write("resume_job", params, event)
