"""`outboxd audit`, and the audit log's rows for the CLI's state-changing commands (each
writes one, done or refused, with the actor `cli:<OS user>`): the same log as the admin
routes' (services/audit.py, docs/decisions/0034-roles-and-the-audit-log.md)."""

from __future__ import annotations

import argparse
import json
import socket
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outboxd.config import Settings

# How a command's exit status reads on the audit log (as the API's status would).
OUTCOME_OF_EXIT = {0: 200, 2: 400}
REFUSED = 409


def add_audit_parser(sub: Callable[..., argparse.ArgumentParser]) -> None:
    a = sub("audit", "the audit log, newest first: every attempted change (read-only)")
    a.add_argument("--actor", help="only this actor's rows (a user, or cli:<OS user>)")
    a.add_argument("--action", help="only this action (e.g. pauseDependency, cli:jobs redrive)")
    a.add_argument("--since", help="only rows at or after this RFC 3339 time")
    a.add_argument("--limit", type=int, default=50, help="at most this many rows (50)")
    a.add_argument("--json", action="store_true", help="print JSON instead of a table")


def cli_action(args: argparse.Namespace) -> tuple[str, str | None, str | None] | None:
    """(action, target, reason) of a state-changing command; None for the others. A portal
    username is never a target (the log names no username)."""
    cmd = args.command
    sub = getattr(args, f"{cmd}_command", None)
    if cmd == "outbox" and sub == "redrive":
        return "cli:outbox redrive", args.id, None
    if cmd == "jobs" and sub == "redrive":
        return "cli:jobs redrive", args.id or f"status={args.status}", None
    if cmd == "portal" and sub == "unlock":
        return "cli:portal unlock", None, None
    if cmd in ("pause", "resume"):
        return f"cli:{cmd}", args.name, getattr(args, "reason", None)
    return None


async def record_cli(
    settings: Settings, action: tuple[str, str | None, str | None], exit_code: int
) -> None:
    from outboxd.cli_commands import cli_actor, open_store
    from outboxd.services.audit import AuditLog

    store = await open_store(settings)
    try:
        name, target, reason = action
        log = AuditLog(store, f"cli@{socket.gethostname()}")
        outcome = OUTCOME_OF_EXIT.get(exit_code, REFUSED)
        await log.record(cli_actor(), "admin", name, target, outcome, reason=reason)
    finally:
        await store.close()


async def audit_command(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.cli_commands import EXIT_OK, EXIT_USAGE, open_store
    from outboxd.http.audit import audit_model
    from outboxd.http.inputs import InputError, parse_time
    from outboxd.http.models import to_builtins
    from outboxd.services.audit import AuditLog

    since = None
    if args.since is not None:
        try:
            since = parse_time("--since", args.since)
        except InputError as exc:
            print(f"outboxd: {exc}", file=sys.stderr)
            return EXIT_USAGE
    store = await open_store(settings)
    try:
        page = await AuditLog(store, "cli").entries(
            args.actor, args.action, since, max(1, min(args.limit, 500))
        )
    finally:
        await store.close()
    if args.json:
        print(json.dumps([to_builtins(audit_model(e)) for e in page.items], indent=2))
        return EXIT_OK
    print(f"{'at':<25} {'actor':<20} {'role':<9} {'action':<24} {'outcome':>7}  target / reason")
    for e in page.items:
        m = audit_model(e)
        note = " ".join(x for x in (e.target, e.reason and f"({e.reason})") if x)
        print(f"{m.at:<25} {e.actor:<20} {e.role:<9} {e.action:<24} {e.outcome:>7}  {note}")
    return EXIT_OK
