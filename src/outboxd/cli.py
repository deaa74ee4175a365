"""outboxd: durable, rate-limited background work over HTTP, a database outbox and SQS.

Run `outboxd serve` under systemd (see systemd/outboxd.service); the other commands are
one-shot tools for an operator, against the same config file. `outboxd check-config`
validates a config the way `serve` would before starting it.

Exit codes: 0 success, 2 bad usage or configuration (and `serve` on a schema it must not
run on), 1 anything else; `migrate --check`: 3 migrations pending, 4 schema too new.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outboxd import __version__
from outboxd.cli_audit import add_audit_parser, audit_command, cli_action, record_cli
from outboxd.cli_commands import (
    EXIT_FAIL,
    EXIT_OK,
    EXIT_USAGE,
    jobs_command,
    migrate_command,
    outbox_command,
    queues_command,
    status_command,
)
from outboxd.cli_deps import add_deps_parsers, deps_command
from outboxd.cli_portal import add_portal_parser, portal_command
from outboxd.config import ConfigError, Settings
from outboxd.config_file import load_settings
from outboxd.errors import OutboxdError
from outboxd.security import generate_key, generate_token, hash_token
from outboxd.storage.ports import JOB_STATUSES, RELAY_STATUSES

if TYPE_CHECKING:
    pass

LIMIT_MAX = 500

_EPILOG = """\
Config: TOML; any key can be overridden by OUTBOXD_<SECTION>__<KEY> (e.g.
OUTBOXD_SQS__REGION=eu-west-1). Without sqs.endpoint_url the daemon talks to AWS SQS
(region endpoint, standard credential chain). Logs are JSON lines on stdout; under
journald each carries a syslog priority. status, outbox list and check-config only read.
"""


def version() -> str:
    """The release number (`outboxd.__version__`), as `outboxd_build_info{version}` says it."""
    return __version__


def _listing_options(p: argparse.ArgumentParser, statuses: Sequence[str], rows: str) -> None:
    """--status, --limit and --json of a `list` subcommand that lists `rows`."""
    p.add_argument("--status", choices=statuses, help=f"only {rows} in this status (default: all)")
    p.add_argument(
        "--limit", type=_limit, default=50, help=f"at most this many {rows}, 1-{LIMIT_MAX} (50)"
    )
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _limit(text: str) -> int:
    """--limit: an integer 1-500 (argparse exits 2 with the message otherwise)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer 1-{LIMIT_MAX}, got {text!r}"
        ) from None
    if not 1 <= value <= LIMIT_MAX:
        raise argparse.ArgumentTypeError(f"must be 1-{LIMIT_MAX}, got {value}")
    return value


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        default=None,
        metavar="PATH",
        help="config file (default: $OUTBOXD_CONFIG, else ./config.toml)",
    )

    def commands(
        parent: argparse.ArgumentParser, dest: str, metavar: str = "SUBCOMMAND"
    ) -> Callable[..., argparse.ArgumentParser]:
        """`parent`'s subcommands: each added with its name and help, and --config."""
        subs = parent.add_subparsers(dest=dest, required=True, metavar=metavar)

        def add(name: str, help: str, **kwargs: Any) -> argparse.ArgumentParser:
            return subs.add_parser(name, parents=[common], help=help, **kwargs)

        return add

    p = argparse.ArgumentParser(
        prog="outboxd",
        description=__doc__.split("\n\nExit codes")[0],
        epilog=_EPILOG + "Exit codes: 0 success, 2 bad usage or configuration, 1 otherwise "
        "(migrate --check: 3 migrations pending, 4 schema too new).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        parents=[common],
    )
    p.add_argument("--version", action="version", version=f"outboxd {version()}")
    sub = commands(p, "command", "COMMAND")
    sub(
        "serve",
        "run the daemon (API, relay, consumer, claimer, scheduler) until SIGTERM",
        description="Run the daemon until SIGTERM/SIGINT. Applies migrations first when "
        "storage.auto_migrate is true; notifies systemd (READY=1, STOPPING=1, WATCHDOG=1).",
    )
    mg = sub(
        "migrate",
        "apply pending database migrations (Postgres: under an advisory lock)",
        description="Apply the pending database migrations and print their names (or "
        '"up to date"). On Postgres they run under an advisory lock, so several instances '
        "may migrate at once. Needed only with storage.auto_migrate = false: serve "
        "migrates at start otherwise.",
    )
    mg.add_argument(
        "--check",
        action="store_true",
        help="change nothing: exit 0 when this release runs on the schema as it is (also one "
        "a newer release migrated), 3 listing the pending migrations, 4 when a newer "
        "release contracted it past this one",
    )
    st = sub(
        "status",
        "row counts per table and status, oldest pending age, SQS and DLQ depth (read-only)",
    )
    st.add_argument("--json", action="store_true", help="print JSON instead of a table")
    outbox = sub("outbox", "inspect or redrive relay outbox rows")
    osub = commands(outbox, "outbox_command")
    ol = osub("list", "list relay outbox rows (read-only)")
    _listing_options(ol, RELAY_STATUSES, "rows")
    orr = osub("redrive", "put a DEAD outbox row back to PENDING")
    orr.add_argument("id", help="the outbox row id (from `outboxd outbox list --status DEAD`)")
    jobs = sub("jobs", "list or redrive portal jobs")
    jsub = commands(jobs, "jobs_command")
    jl = jsub("list", "list portal jobs, newest first (read-only)")
    _listing_options(jl, JOB_STATUSES, "jobs")
    jl.add_argument(
        "--username",
        help="only the jobs for this portal username (a student number), exactly as it was "
        "submitted; found by its keyed hash, so jobs accepted before migration 0010 are not",
    )
    jr = jsub(
        "redrive",
        "put a DEAD job (or, with --status DEAD --yes, every DEAD job) back to QUEUED "
        "with a fresh outbox row",
    )
    jr.add_argument("id", nargs="?", help="the job id (leave it out with --status)")
    jr.add_argument(
        "--status", choices=("DEAD",), help="redrive every job in this status instead of one"
    )
    jr.add_argument(
        "--limit", type=int, default=None, help="with --status: at most this many jobs (all)"
    )
    jr.add_argument("--yes", action="store_true", help="confirm a redrive with --status")
    je = jsub("events", "a job's timeline, oldest first (read-only)")
    je.add_argument("id", help="the job id")
    je.add_argument(
        "--json", action="store_true", help="print the API's JSON (GET /v1/jobs/{id}/events)"
    )
    queues = sub("queues", "SQS queues")
    qsub = commands(queues, "queues_command")
    qsub(
        "create",
        "create queues, DLQs and redrive policies",
        description="Create the jobs and tasks queues and their dead-letter queues with the "
        "redrive policy (sqs.max_receive_count), as serve does with sqs.create_queues = "
        "true, and print the four queue URLs. Idempotent. Needs sqs:CreateQueue and "
        "sqs:SetQueueAttributes; not for the embedded SQS.",
    )
    add_portal_parser(sub, commands)
    add_deps_parsers(sub)
    add_audit_parser(sub)
    token = sub("token", "API tokens")
    tsub = commands(token, "token_command")
    tc = tsub(
        "create",
        "print a new token and the [[auth.tokens]] entry (its hash) for the config",
    )
    tc.add_argument("--user", required=True, help="the user name the token authenticates")
    tc.add_argument(
        "--role",
        choices=["user", "viewer", "operator", "admin"],
        default="user",
        help="the token's role (user)",
    )
    sub(
        "keygen",
        "print a new encryption key (one line of security.keys_file)",
        description="Print a new random encryption key, alone on one line, in the format of "
        "security.keys_file. Put it first in the file to encrypt with it; keep the older "
        "keys below it so what they sealed can still be read. Reads no config.",
    )
    cc = sub(
        "check-config",
        "validate the config as serve would, without reaching the database or SQS",
    )
    cc.add_argument(
        "--json",
        action="store_true",
        help="print the resolved settings as JSON (TOML key names, absent = null, "
        "secrets redacted)",
    )
    return p


def resolved_settings(settings: Settings) -> dict[str, Any]:
    """The settings as check-config --json prints them: TOML keys, secrets redacted."""
    from outboxd.observability import REDACTED, scrub_url

    def plain(value: Any) -> Any:
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
        if isinstance(value, Mapping):
            return {str(k): plain(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [plain(v) for v in value]
        return value

    out: dict[str, Any] = plain(settings)
    out.pop("base_dir", None)
    out["storage"]["url"] = scrub_url(settings.storage.url)
    for entry in out["auth"]["tokens"]:
        entry["sha256"] = REDACTED
    return out


def _load(args: argparse.Namespace) -> Settings:
    path = args.config or Path(os.environ.get("OUTBOXD_CONFIG", "config.toml"))
    return load_settings(path)


def _config_error(exc: ConfigError, daemon: bool = False) -> None:
    from outboxd.observability import print_refusal

    print_refusal("config_invalid", str(exc), daemon)


def main(argv: Sequence[str] | None = None) -> None:
    try:
        code = run(argv)
        sys.stdout.flush()
    except BrokenPipeError:
        # The reader went away (`outboxd outbox list | head -1`): stop quietly, and keep
        # the interpreter's last flush from complaining about the closed pipe.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        code = EXIT_FAIL
    sys.exit(code)


def run(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    cmd = args.command
    if cmd == "keygen":
        print(generate_key())
        return EXIT_OK
    if cmd == "token":
        if not args.user.strip():
            print("outboxd: --user must not be empty", file=sys.stderr)
            return EXIT_USAGE
        tok = generate_token()
        print(tok)
        print(
            f'[[auth.tokens]]\nsha256 = "{hash_token(tok)}"\nuser = {json.dumps(args.user)}\n'
            f'role = "{args.role}"'
        )
        return EXIT_OK
    try:
        settings = _load(args)
    except ConfigError as exc:
        _config_error(exc, daemon=cmd == "serve")
        return EXIT_USAGE
    if cmd in ("check-config", "serve"):
        from outboxd.daemon.preflight import preflight

        try:
            preflight(settings, os.environ)
        except ConfigError as exc:
            _config_error(exc, daemon=cmd == "serve")
            return EXIT_USAGE
    if cmd == "check-config":
        if args.json:
            print(json.dumps(resolved_settings(settings), indent=2, sort_keys=True))
        else:
            print("config OK")
        return EXIT_OK
    if cmd == "serve":
        from outboxd.daemon import app

        return asyncio.run(app.run(settings))
    from outboxd.observability import configure_logging

    # A one-shot command's log lines go to stderr as JSON (stdout is its output: a table, or
    # JSON for a pipe), at info at least: the line naming who took an admin action stays.
    level = "debug" if settings.logging.level == "debug" else "info"
    configure_logging(level, "json", stream=sys.stderr)
    handlers: dict[str, Callable[[Settings, argparse.Namespace], Coroutine[Any, Any, int]]] = {
        "migrate": migrate_command,
        "status": status_command,
        "outbox": outbox_command,
        "jobs": jobs_command,
        "queues": queues_command,
        "portal": portal_command,
        "deps": deps_command,
        "pause": deps_command,
        "resume": deps_command,
        "audit": audit_command,
    }
    action = cli_action(args)
    code = EXIT_FAIL
    try:
        code = asyncio.run(handlers[cmd](settings, args))
    except OutboxdError as exc:
        print(f"outboxd: {exc}", file=sys.stderr)
    finally:
        if action is not None:  # done or refused, the attempt is on the audit log
            with contextlib.suppress(OutboxdError):
                asyncio.run(record_cli(settings, action, code))
    return code
