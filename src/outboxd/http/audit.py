"""The audit log's admin route: newest first, filtered by actor, action and time, keyset
pages (the rows are written by the edge, http/app.py, and by the CLI)."""

from __future__ import annotations

from aiohttp import web

from outboxd.http import audit_models, inputs
from outboxd.http.deps import deps_of
from outboxd.http.render import iso
from outboxd.http.responses import json_response
from outboxd.storage.audit_ports import AuditEntry


def audit_model(e: AuditEntry) -> audit_models.AuditEntry:
    return audit_models.AuditEntry(
        id=e.id,
        at=iso(e.at) or "",
        actor=e.actor,
        role=e.role,
        action=e.action,
        target=e.target,
        reason=e.reason,
        outcome=e.outcome,
        request_id=e.request_id,
        instance=e.instance,
    )


async def list_audit(request: web.Request) -> web.Response:
    inputs.only_query(request, {"actor", "action", "since", "limit", "cursor"})
    deps = deps_of(request)
    assert deps.audit is not None  # build_api_deps always sets it
    page = await deps.audit.entries(
        actor=inputs.query_text(request, "actor", 128),
        action=inputs.query_text(request, "action", 64),
        since=inputs.query_time(request, "since"),
        limit=inputs.query_limit(request),
        cursor=inputs.query_cursor(request),
    )
    items = [audit_model(e) for e in page.items]
    return json_response(audit_models.AuditPage(items, page.next_cursor))
