"""What the audit log asks of storage: its record and its Protocol.

Beside storage/ports.py (one concern per Protocol): one row for every attempted change
through an admin route, a cancel of another user's job, or a state-changing CLI command,
whether done or refused; append-only in the database itself (a trigger refuses UPDATE and
DELETE), removed only by the built-in prune (docs/decisions/0034-roles-and-the-audit-log.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from outboxd.storage.ports import Page


@dataclass(frozen=True)
class AuditEntry:
    """One attempted change: who (`actor`, `role`), what (`action`, `target`), why
    (`reason`), how it ended (`outcome`: the HTTP status, or the CLI's equivalent), and
    where it came from (`request_id`, `instance`)."""

    id: str
    at: float
    actor: str
    role: str
    action: str
    target: str | None
    reason: str | None
    outcome: int
    request_id: str | None
    instance: str


class AuditStore(Protocol):
    async def append_audit(self, entry: AuditEntry) -> None: ...

    async def list_audit(
        self,
        actor: str | None,
        action: str | None,
        since: float | None,
        limit: int,
        cursor: str | None,
    ) -> Page[AuditEntry]:
        """Newest first, keyset pages; each filter applies when given."""
        ...

    async def prune_audit(self, before: float, limit: int) -> int:
        """Rows older than `before` removed (at most `limit`), in a transaction of its own
        that opens the append-only gate for itself only; how many."""
        ...
