"""The bodies of the audit log's admin route (services/audit.py)."""

from __future__ import annotations

from typing import Annotated, Final

from msgspec import Meta, Struct

from outboxd.http.models import RFC3339, DateTime


class AuditEntry(Struct, rename="camel"):
    """One attempted change, done or refused."""

    id: str
    at: Annotated[DateTime, Meta(description="When" + RFC3339)]
    actor: Annotated[str, Meta(description="The token's user, or cli:<OS user> for the CLI.")]
    role: Annotated[str, Meta(description="The actor's role: user, viewer, operator, admin.")]
    action: Annotated[str, Meta(description="The operation (its operationId, or the CLI's).")]
    target: Annotated[str | None, Meta(description="What it acted on (ids, a name, a hash).")]
    reason: Annotated[str | None, Meta(description="The reason given (a pause's).")]
    outcome: Annotated[int, Meta(description="The HTTP status it ended with (the CLI's too).")]
    request_id: Annotated[str | None, Meta(description="The request's X-Request-Id.")]
    instance: Annotated[str, Meta(description="The daemon (daemon.instance_id) or host.")]


class AuditPage(Struct, rename="camel"):
    """Audit rows, newest first."""

    items: list[AuditEntry]
    next_cursor: Annotated[str | None, Meta(description="Pass as `cursor` for the next page.")]


MODELS: Final = (AuditEntry, AuditPage)
