"""The audit log (`audit_ports.AuditStore`): appended to, listed, and pruned only here."""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import asdict
from typing import Any

from outboxd.storage.audit_ports import AuditEntry
from outboxd.storage.db import Op, Row, execute
from outboxd.storage.ports import Page
from outboxd.storage.store.base import StoreBase


def audit_record(r: Row) -> AuditEntry:
    return AuditEntry(
        id=r["id"],
        at=float(r["at"]),
        actor=r["actor"],
        role=r["role"],
        action=r["action"],
        target=r["target"],
        reason=r["reason"],
        outcome=int(r["outcome"]),
        request_id=r["request_id"],
        instance=r["instance"],
    )


class SqlAudit(StoreBase):
    async def append_audit(self, entry: AuditEntry) -> None:
        params = asdict(entry)

        def body() -> Generator[Op, Any, None]:
            yield execute(self.q["insert_audit"], params)

        await self.db.run(body)

    async def list_audit(
        self,
        actor: str | None,
        action: str | None,
        since: float | None,
        limit: int,
        cursor: str | None,
    ) -> Page[AuditEntry]:
        params = {"actor": actor, "action": action, "since": since}
        return await self._page("list_audit", params, limit, cursor, audit_record, "at")

    async def prune_audit(self, before: float, limit: int) -> int:
        def body() -> Generator[Op, Any, int]:
            yield execute(self.q["audit_prune_open"], {})
            n: int = yield execute(self.q["prune_audit"], {"before": before, "limit": limit})
            yield execute(self.q["audit_prune_close"], {})
            return n

        return await self.db.run(body)
