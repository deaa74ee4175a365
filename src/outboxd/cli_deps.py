"""`outboxd deps`, `outboxd pause`, `outboxd resume`: the operator's side of the outside
systems' breakers, beside the admin API (`GET /v1/admin/dependencies`, `POST
/v1/admin/dependencies/{name}/pause|resume`): both call services/breakers.py, which logs
every pause and resume with the acting user and the reason."""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from outboxd.config import Settings

NAMES = ("portal", "ai", "sqs")
_DURATION = re.compile(r"^([0-9]+(?:\.[0-9]+)?)([smhd]?)$")
_UNIT_S = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}


def duration_s(text: str) -> float:
    """`30m`, `2h`, `90s`, `1d` or plain seconds, as seconds."""
    m = _DURATION.fullmatch(text.strip())
    if m is None or float(m.group(1)) <= 0:
        raise argparse.ArgumentTypeError("a duration such as 30m, 2h, 90s or 1d")
    return float(m.group(1)) * _UNIT_S[m.group(2)]


def add_deps_parsers(sub: Callable[..., argparse.ArgumentParser]) -> None:
    """The `deps`, `pause` and `resume` commands, on the parser `cli._parser` builds."""
    d = sub("deps", "each outside system's state: up, down, maintenance, paused (read-only)")
    d.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p = sub(
        "pause",
        "stop calling an outside system on every instance, with a reason",
        description="Pause calls to the portal, the AI provider or SQS on every instance "
        "sharing the database (within a second, and across restarts), as POST "
        "/v1/admin/dependencies/{name}/pause does. Work waits, unspent.",
    )
    p.add_argument("name", choices=NAMES, help="the outside system: portal, ai or sqs")
    p.add_argument("--reason", required=True, help="why (1-500 characters, required)")
    end = p.add_mutually_exclusive_group()
    end.add_argument("--for", dest="for_s", type=duration_s, help="for 30m, 2h, 1d, ...")
    end.add_argument("--until", help="until an RFC 3339 time, e.g. 2026-12-07T06:00:00Z")
    r = sub("resume", "lift an operator's pause: waiting work goes out at the configured pace")
    r.add_argument("name", choices=NAMES, help="the outside system: portal, ai or sqs")


async def deps_command(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.cli_commands import EXIT_OK, EXIT_USAGE, cli_actor, open_store
    from outboxd.http.dependencies import dependency_model
    from outboxd.http.inputs import InputError, parse_time
    from outboxd.http.models import to_builtins
    from outboxd.services.breakers import Breakers

    store = await open_store(settings)
    try:
        breakers = Breakers(settings, store)
        if args.command == "pause":
            reason = args.reason.strip()
            if not 1 <= len(reason) <= 500:
                print("outboxd: --reason must be 1-500 characters", file=sys.stderr)
                return EXIT_USAGE
            until = None
            if args.for_s is not None:
                until = time.time() + args.for_s
            elif args.until is not None:
                try:
                    until = parse_time("--until", args.until)
                except InputError as exc:
                    print(f"outboxd: {exc}", file=sys.stderr)
                    return EXIT_USAGE
                if until <= time.time():
                    print("outboxd: --until must be in the future", file=sys.stderr)
                    return EXIT_USAGE
            views = [await breakers.pause(args.name, reason, until, cli_actor())]
        elif args.command == "resume":
            views = [await breakers.resume(args.name, cli_actor())]
        else:
            views = await breakers.views()
    finally:
        await store.close()
    if getattr(args, "json", False):
        print(json.dumps([to_builtins(dependency_model(v)) for v in views], indent=2))
        return EXIT_OK
    print(f"{'name':<7} {'state':<12} {'since':<25} {'until':<25} {'waiting':>8}  reason / error")
    for v in views:
        note = v.reason if v.state == "paused" else (v.last_error or "")
        by = f" (by {v.paused_by})" if v.paused_by else ""
        print(
            f"{v.name:<7} {v.state:<12} {_when(v.since):<25} {_when(v.until):<25} "
            f"{v.waiting:>8}  {note}{by}"
        )
    return EXIT_OK


def _when(ts: float | None) -> str:
    from outboxd.http.render import iso

    return iso(ts) or "-"
