"""outboxd: durable, rate-limited background work over HTTP, a database outbox and SQS.

Run `outboxd serve` under systemd (see systemd/outboxd.service); the other commands are
one-shot tools for an operator, against the same config file. `outboxd check-config`
validates a config the way `serve` would before starting it.

Exit codes: 0 success, 2 bad usage or configuration, 1 anything else.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import getpass
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from outboxd.cli_portal import add_portal_parser, portal_command
from outboxd.config import ConfigError, Settings
from outboxd.errors import InvalidState, NotFound, OutboxdError
from outboxd.security import generate_key, generate_token, hash_token
from outboxd.storage.ports import JOB_STATUSES, RELAY_STATUSES, JobRecord, RelayRow

if TYPE_CHECKING:
    from outboxd.http.console_models import PaceSlot

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2
LIMIT_MAX = 500

_EPILOG = """\
Config: TOML; any key can be overridden by OUTBOXD_<SECTION>__<KEY> (e.g.
OUTBOXD_SQS__REGION=eu-west-1). Without sqs.endpoint_url the daemon talks to AWS SQS
(region endpoint, standard credential chain). Logs are JSON lines on stdout; under
journald each carries a syslog priority. status, outbox list and check-config only read.
"""


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("outboxd")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        return "unknown"


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
        epilog=_EPILOG + "Exit codes: 0 success, 2 bad usage or configuration, 1 otherwise.",
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
    sub(
        "migrate",
        "apply pending database migrations (Postgres: under an advisory lock)",
        description="Apply the pending database migrations and print their names (or "
        '"up to date"). On Postgres they run under an advisory lock, so several instances '
        "may migrate at once. Needed only with storage.auto_migrate = false: serve "
        "migrates at start otherwise.",
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
    token = sub("token", "API tokens")
    tsub = commands(token, "token_command")
    tc = tsub(
        "create",
        "print a new token and the [[auth.tokens]] entry (its hash) for the config",
    )
    tc.add_argument("--user", required=True, help="the user name the token authenticates")
    tc.add_argument(
        "--role", choices=["user", "admin"], default="user", help="the token's role (user)"
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
    return Settings.from_toml(path)


def _config_error(exc: ConfigError, daemon: bool = False) -> None:
    # Under systemd the unit's stderr is the journal too: mark the refusal as an error
    # (<3>) so `journalctl -p warning` shows why the service does not start.
    prefix = "<3>" if os.environ.get("JOURNAL_STREAM") else ""
    text = str(exc)
    if daemon and not sys.stderr.isatty():
        # serve's output is JSON lines, this one too (a log reader parses every line).
        text = json.dumps(
            {
                "event": "config_invalid",
                "level": "error",
                "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "error": text,
            },
            ensure_ascii=False,
        )
    print(f"{prefix}{text}", file=sys.stderr)


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


def cli_actor() -> str:
    """Who runs this command, for the log line of an admin action: `cli:<user>`, the user
    who ran sudo when it was run through sudo."""
    user = os.environ.get("SUDO_USER", "").strip()
    if not user:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):  # no passwd entry for this uid (a container)
            user = f"uid {os.getuid()}"
    return f"cli:{user}"


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
        "migrate": _migrate,
        "status": _status,
        "outbox": _outbox,
        "jobs": _jobs,
        "queues": _queues,
        "portal": portal_command,
    }
    try:
        return asyncio.run(handlers[cmd](settings, args))
    except OutboxdError as exc:
        print(f"outboxd: {exc}", file=sys.stderr)
        return EXIT_FAIL


async def _open(settings: Settings) -> Any:
    """The store for a one-shot command: never migrates, never creates a database.

    Only `serve` (with storage.auto_migrate) and `migrate` change the schema; a
    status on a fresh config must not leave a database or a schema behind.
    """
    from outboxd.storage.db import sqlite_path
    from outboxd.storage.store import first_step, open_configured

    url = settings.storage.url
    if url.startswith("sqlite:///"):
        path = sqlite_path(url, settings.base_dir)
        if not path.is_file():
            raise OutboxdError(
                f"no database at {path}: start the daemon or run `outboxd migrate` first"
            )
    store = await open_configured(settings)
    pending = await first_step(store, store.db.pending_migrations())
    if pending:
        await store.close()
        raise OutboxdError(
            f"the database is not migrated (pending: {', '.join(pending)}): "
            "start the daemon or run `outboxd migrate` first"
        )
    return store


async def _migrate(settings: Settings, _args: argparse.Namespace) -> int:
    from outboxd.storage.store import open_configured

    store = await open_configured(settings)
    try:
        applied = await store.db.migrate()
    finally:
        await store.close()
    print("applied: " + ", ".join(applied) if applied else "up to date")
    return EXIT_OK


def _pace_line(name: str, pace: PaceSlot) -> str:
    """One cluster pace row for `status`: slot times as UTC, relative to the database's now."""

    def when(ts: float | None) -> str:
        if ts is None:
            return "-"
        return time.strftime("%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}"

    paused = pace.paused_for_seconds
    return (
        f"pace {name:<8} last slot {when(pace.last_slot_at)}  "
        f"next slot {when(pace.next_slot_at)} (in {pace.next_slot_in_seconds:.1f} s)  "
        f"paused {f'{paused:.1f} s more' if paused > 0 else 'no'}  sessions {pace.sessions}"
    )


def queue_line(name: str, visible: int, in_flight: int, dlq: int) -> str:
    """One queue's depths for `status`: messages waiting, being worked on, in its DLQ."""
    return f"queue {name:<8} visible {visible:>7}  in flight {in_flight:>7}  dlq {dlq:>7}"


async def _status(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.daemon.readiness import Readiness
    from outboxd.http.models import to_builtins
    from outboxd.http.render import stats_model
    from outboxd.queue.sqs import QueueError, SqsQueues
    from outboxd.services.admin import AdminService

    store = await _open(settings)
    queues = None
    try:
        if settings.sqs.endpoint_url != "embedded":
            # Read-only: never create queues from a status command.
            from dataclasses import replace

            queues = SqsQueues(
                replace(settings.sqs, create_queues=False), settings.sqs.endpoint_url
            )
            try:
                await asyncio.wait_for(queues.start(), 5)
            except (QueueError, TimeoutError):
                await queues.close()
                queues = None
        stats = await AdminService(store, Readiness(store, queues) if queues else None).stats()
    finally:
        if queues is not None:
            await queues.close()
        await store.close()
    body = stats_model(stats)
    if args.json:
        print(json.dumps(to_builtins(body), indent=2, sort_keys=True))
        return EXIT_OK
    print(f"{'table':<14} {'status':<18} {'count':>8}")
    for table, counts in stats.tables.items():
        for status, n in sorted(counts.items()):
            print(f"{table:<14} {status:<18} {n:>8}")
    print()
    for table, age in stats.oldest_pending_age_s.items():
        print(f"oldest pending {table:<14} {'-' if age is None else f'{age:.1f} s'}")
    running = stats.oldest_running_job_age_s
    print(f"oldest running jobs           {'-' if running is None else f'{running:.1f} s'}")
    for name, pace in body.pace.items():
        print(_pace_line(name, pace))
    if stats.queues_error is not None:
        print(f"queues: not reachable ({stats.queues_error})")
    elif stats.queues is not None:
        for name, depth in stats.queues.items():
            print(queue_line(name, depth.visible, depth.in_flight, depth.dlq_visible))
    elif settings.sqs.endpoint_url == "embedded":
        print("queues: not reachable from here (embedded SQS lives inside the daemon)")
    else:
        print("queues: not reachable (SQS did not answer)")
    return EXIT_OK


async def _outbox(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.http.render import relay_item
    from outboxd.services.admin import AdminService

    store = await _open(settings)
    try:
        if args.outbox_command == "list":
            page = await store.list_relay_rows(args.status, args.limit, None)
            items = [relay_item(r) for r in page.items]
            if args.json:
                print(json.dumps(items, indent=2))
            else:
                print(f"{'id':<36} {'kind':<4} {'status':<16} {'att':>3}  last error")
                for it in items:
                    err = (it["lastError"] or "")[:60]
                    print(
                        f"{it['id']:<36} {it['kind']:<4} {it['status']:<16} "
                        f"{it['attempts']:>3}  {err}"
                    )
            return EXIT_OK
        row = AdminService(store).redrive_outbox_row(args.id, actor=cli_actor())
        return await _redrive(row, f"outbox row {args.id}", "{} -> PENDING")
    finally:
        await store.close()


async def _jobs(settings: Settings, args: argparse.Namespace) -> int:
    if args.jobs_command == "events":
        return await _job_events(settings, args)
    if args.jobs_command == "redrive" and (args.id is None) == (args.status is None):
        print("outboxd: jobs redrive takes a job id or --status DEAD", file=sys.stderr)
        return EXIT_USAGE
    if args.jobs_command == "redrive" and args.status is not None and not args.yes:
        print(
            f"outboxd: jobs redrive --status {args.status} redrives every such job: add --yes "
            f"(see them first with `outboxd jobs list --status {args.status}`)",
            file=sys.stderr,
        )
        return EXIT_USAGE
    if args.jobs_command == "redrive" and args.limit is not None and args.limit < 1:
        print("outboxd: --limit must be at least 1", file=sys.stderr)
        return EXIT_USAGE
    store = await _open(settings)
    try:
        if args.jobs_command == "list":
            return await _jobs_list(store, args)
        if args.status is not None:
            return await _jobs_redrive_all(store, args.status, args.limit)
        return await _jobs_redrive_one(store, args.id)
    finally:
        await store.close()


async def _jobs_list(store: Any, args: argparse.Namespace) -> int:
    from outboxd.http.render import job_body

    page = await store.list_jobs(args.status, args.limit, None)
    items = [job_body(j) for j in page.items]
    if args.json:
        print(json.dumps(items, indent=2))
        return EXIT_OK
    print(f"{'id':<36} {'status':<9} {'att':>3}  {'created':<20} error")
    for it in items:
        err = it["error"] or {}
        error = f"{err.get('code', '')} {err.get('message', '')}".strip()[:60]
        created = it["createdAt"][:19].replace("T", " ")
        print(f"{it['jobId']:<36} {it['status']:<9} {it['attempts']:>3}  {created:<20} {error}")
    return EXIT_OK


async def _jobs_redrive_one(store: Any, job_id: str) -> int:
    from outboxd.services.admin import AdminService

    job = AdminService(store).redrive_job(job_id, actor=cli_actor())
    return await _redrive(job, f"job {job_id}", "job {} -> QUEUED")


async def _redrive(redrive: Awaitable[JobRecord | RelayRow], what: str, done: str) -> int:
    """A redrive of one job or outbox row: `done` names its id; exit 1 when there is no
    `what` or its state refuses it."""
    try:
        redriven = await redrive
    except NotFound:
        print(f"outboxd: no {what}", file=sys.stderr)
        return EXIT_FAIL
    except InvalidState as exc:
        print(f"outboxd: {exc}", file=sys.stderr)
        return EXIT_FAIL
    print("redriven: " + done.format(redriven.id))
    return EXIT_OK


async def _job_events(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.http.models import JobTimeline, to_builtins
    from outboxd.http.render import event_model, iso

    store = await _open(settings)
    try:
        job = await store.get_job(args.id)
        events = await store.job_events(args.id) if job is not None else []
    finally:
        await store.close()
    if job is None:
        print(f"outboxd: no job {args.id}", file=sys.stderr)
        return EXIT_FAIL
    if args.json:
        timeline = JobTimeline(job.id, [event_model(e) for e in events])
        print(json.dumps(to_builtins(timeline), indent=2))
        return EXIT_OK
    print(f"job {job.id}  {job.status}  attempts {job.attempts}")
    head = ("seq", "at", "type", "status", "att", "instance", "detail")
    print("{:>6}  {:<24}  {:<16}  {:<9}  {:>3}  {:<20}  {}".format(*head))
    for e in events:
        detail = json.dumps(dict(e.detail), separators=(",", ":")) if e.detail else ""
        print(
            f"{e.seq:>6}  {iso(e.at):<24}  {e.type:<16}  {e.status:<9}  {e.attempt:>3}  "
            f"{e.instance[:20]:<20}  {detail}"
        )
    return EXIT_OK


async def _jobs_redrive_all(store: Any, status: str, limit: int | None) -> int:
    """Every job in `status`, through the service the admin API's bulk redrive calls: a
    progress line per batch, then the count (exit 1 when any job was refused)."""
    from outboxd.services.admin import AdminService, BulkRedrive

    counts = {sc.status: sc.count for sc in await store.status_counts() if sc.table == "jobs"}
    total = counts.get(status, 0) if limit is None else min(limit, counts.get(status, 0))
    print(f"{status} jobs to redrive: {total}", flush=True)

    def progress(done: BulkRedrive) -> None:
        print(f"redriven {len(done.redriven)}/{total}, refused {len(done.refused)}", flush=True)

    done = await AdminService(store).redrive_jobs(
        actor=cli_actor(), status="DEAD", limit=limit, on_progress=progress
    )
    for job_id, why in done.refused:
        print(f"refused {job_id}: {why}")
    more = " (more are left: run it again)" if done.more else ""
    print(f"redriven: {len(done.redriven)} jobs, refused: {len(done.refused)}{more}")
    return EXIT_FAIL if done.refused else EXIT_OK


async def _queues(settings: Settings, _args: argparse.Namespace) -> int:
    from outboxd.queue.sqs import QueueError, SqsQueues

    if settings.sqs.endpoint_url == "embedded":
        print(
            "outboxd: the embedded SQS creates its queues when the daemon starts", file=sys.stderr
        )
        return EXIT_USAGE
    queues = SqsQueues(settings.sqs, settings.sqs.endpoint_url)
    try:
        await queues.start()
        await queues.ensure_queues()
        for kind in ("jobs", "tasks"):
            print(queues.queue_url(kind))
            print(queues.queue_url(kind, dlq=True))
    except QueueError as exc:
        print(f"outboxd: {exc}", file=sys.stderr)
        return EXIT_FAIL
    finally:
        await queues.close()
    return EXIT_OK
