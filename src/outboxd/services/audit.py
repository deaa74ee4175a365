"""The audit log: one row for every attempted change through an admin route, a cancel of
another user's job, or a state-changing CLI command, done or refused, with who, what,
why, how it ended, the request id and the instance. Written after the outcome is known;
a database that cannot take the row loses it with an `audit_write_failed` line, never
the request (docs/decisions/0034-roles-and-the-audit-log.md)."""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog

from outboxd.errors import StorageError
from outboxd.ids import new_id
from outboxd.storage.audit_ports import AuditEntry, AuditStore
from outboxd.storage.ports import Page

log = structlog.get_logger(__name__)

MAX_TEXT = 500


def _short(text: str | None) -> str | None:
    """At most MAX_TEXT characters, each one a database stores: a control character or a
    lone surrogate (a path may carry either) is written as its escape."""
    if text is None:
        return None
    return "".join(ch if ch.isprintable() else f"\\u{ord(ch):04x}" for ch in text[:MAX_TEXT])


class AuditLog:
    def __init__(
        self, store: AuditStore, instance: str, clock: Callable[[], float] = time.time
    ) -> None:
        self.store = store
        self.instance = instance
        self.clock = clock

    async def record(
        self,
        actor: str,
        role: str,
        action: str,
        target: str | None,
        outcome: int,
        reason: str | None = None,
        request_id: str | None = None,
    ) -> AuditEntry:
        entry = AuditEntry(
            id=new_id(),
            at=self.clock(),
            actor=actor[:128],
            role=role,
            action=action,
            target=_short(target),
            reason=_short(reason),
            outcome=outcome,
            request_id=request_id,
            instance=self.instance,
        )
        try:
            await self.store.append_audit(entry)
        except StorageError as exc:
            log.error("audit_write_failed", action=action, actor=actor, outcome=outcome, error=exc)
        return entry

    async def entries(
        self,
        actor: str | None = None,
        action: str | None = None,
        since: float | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> Page[AuditEntry]:
        return await self.store.list_audit(actor, action, since, limit, cursor)
