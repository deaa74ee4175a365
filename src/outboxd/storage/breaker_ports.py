"""What the dependency breakers ask of storage: their records and their Protocol.

Beside storage/ports.py (one concern per Protocol, as there): one row per outside system
(`portal`, `ai`, `sqs`) shared by every instance, holding the breaker (outage failures in
a row, open since when, the cluster's one probe) and an operator's pause; and the jobs
that wait for a dependency, each with a relay row that is not published until the
dependency is back (docs/decisions/0033-dependency-breakers.md).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from outboxd.storage.ports import JobRecord


@dataclass(frozen=True)
class DependencyRow:
    """A dependency's stored state. `down_since` set: the breaker is open; `pause_reason`
    set: an operator paused it (until `paused_until`, None = until resumed)."""

    name: str
    failures_in_a_row: int = 0
    down_since: float | None = None
    last_error: str | None = None
    last_failure_at: float | None = None
    last_probe_at: float | None = None
    probe_job: str | None = None
    probe_until: float | None = None
    paused_at: float | None = None
    paused_until: float | None = None
    pause_reason: str | None = None
    paused_by: str | None = None
    updated_at: float = 0.0

    def paused(self, now: float) -> bool:
        return self.pause_reason is not None and (
            self.paused_until is None or self.paused_until > now
        )


@dataclass(frozen=True)
class OutageCounted:
    """A counted outage failure: the row after it, and whether it opened the breaker."""

    row: DependencyRow
    opened: bool


@dataclass(frozen=True)
class Closed:
    """A breaker that closed: how long it was open, and how many rows it released."""

    down_since: float | None
    released: int


class BreakerStore(Protocol):
    async def dependency_rows(self) -> list[DependencyRow]:
        """Every dependency's row, by name."""
        ...

    async def count_outage(
        self, name: str, error: str, open_after: int, now: float, job: str | None = None
    ) -> OutageCounted:
        """One more outage failure in a row (`job`: the run's probe id, whose place it frees)."""
        ...

    async def count_through(self, name: str, now: float) -> Closed | None:
        """A run got an answer: the count is reset; when the breaker was open it closes and
        its waiting rows are released (None: nothing had to change)."""
        ...

    async def take_probe(
        self, name: str, holder: str | None, now: float, probe_s: float, hold_s: float
    ) -> str | None:
        """The cluster's one probe, if it is this caller's turn: with `holder` None the
        oldest waiting job is chosen and its row released (its id returned); else `holder`
        is recorded as the probe (and returned). None: not this caller's turn."""
        ...

    async def pause_dependency(
        self, name: str, reason: str, until: float | None, actor: str, now: float
    ) -> DependencyRow: ...

    async def resume_dependency(
        self, name: str, now: float, ended_before: float | None = None
    ) -> DependencyRow | None:
        """The pause lifted (None: there was none, or, with `ended_before`, none ended by then)."""
        ...

    async def release_waiting(self, name: str, now: float) -> int:
        """Every row that waits for `name` is due now; how many."""
        ...

    async def waiting_jobs(self, name: str) -> int: ...

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
        """A RUNNING job the caller holds waits for a dependency: no lease, the run's attempt
        given back (`give_back`), and a relay row (`outbox_id`) that waits for the
        dependency (due at `until` when the end is known). `new_wait`: its timeline gains a
        `waiting` event. None: no longer the caller's."""
        ...

    async def resume_job(self, job: JobRecord, now: float) -> JobRecord | None:
        """A waiting job's run goes ahead: no longer waiting, a `resumed` event."""
        ...
