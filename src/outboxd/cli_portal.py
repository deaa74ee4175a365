"""`outboxd portal ...`: the operator's side of the portal login lock, beside the admin API
(`POST /v1/admin/portal-logins/unlock`, `GET /v1/admin/portal-logins`): both call
services/portal_logins.py, which logs every unlock with the acting user."""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from outboxd.config import Settings
    from outboxd.services.portal_logins import UsernameLock


def add_portal_parser(
    sub: Callable[..., argparse.ArgumentParser],
    commands: Callable[..., Callable[..., argparse.ArgumentParser]],
) -> None:
    """The `portal` command and its subcommands, on the parser `cli._parser` builds."""
    portal = sub("portal", "the portal login lock: list locked usernames, unlock one")
    psub = commands(portal, "portal_command")
    pu = psub(
        "unlock",
        "forget one portal username's failed logins and throttle",
        description="Forget the failed logins and the throttle of one portal username (all "
        "users' counts for it), as POST /v1/admin/portal-logins/unlock does. The username "
        "is normalized and hashed; it is never stored.",
    )
    pu.add_argument("username", help="the portal username (a student number)")
    pl = psub("locks", "usernames with recent failed logins, by keyed hash (read-only)")
    pl.add_argument("--all", action="store_true", help="also the usernames not locked")
    pl.add_argument("--json", action="store_true", help="print JSON instead of a table")


async def portal_command(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.cli_commands import EXIT_OK, cli_actor, open_store
    from outboxd.daemon.startup import load_keys
    from outboxd.services.portal_logins import PortalLoginAdmin

    keys = load_keys(settings, os.environ)
    store = await open_store(settings)
    try:
        logins = PortalLoginAdmin(store, keys, settings.scrapers.suwon)
        if args.portal_command == "unlock":
            subject, cleared = await logins.unlock(args.username, actor=cli_actor())
            print(f"unlocked: {subject} ({cleared} failed logins forgotten)")
            return EXIT_OK
        found = await logins.usernames(None if args.all else True, limit=500)
    finally:
        await store.close()
    if args.json:
        print(json.dumps([_lock_json(u) for u in found], indent=2))
        return EXIT_OK
    print(f"{'subject':<64}  {'fails':>5}  {'throttled':<9}  {'locked until':<24}  users")
    for u in found:
        users = ", ".join(f"{x.user_id or '-'}:{x.failures}" for x in u.users)
        print(
            f"{u.subject:<64}  {u.failures:>5}  {'yes' if u.throttled else 'no':<9}  "
            f"{_when(u.locked_until):<24}  {users}"
        )
    return EXIT_OK


def _when(ts: float | None) -> str:
    from outboxd.http.render import iso

    return iso(ts) or "-"


def _lock_json(u: UsernameLock) -> dict[str, Any]:
    from outboxd.http.logins import login_model
    from outboxd.http.models import to_builtins

    return to_builtins(login_model(u))
