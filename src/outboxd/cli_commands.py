"""The one-shot commands of `outboxd` (all but `serve`, `check-config` and the key and
token tools, which `cli.py` runs itself): each opens the configured store or the queues,
does one thing through the services, prints, and returns its exit code. `cli.py` parses
the command line and picks one."""

from __future__ import annotations

import argparse
import asyncio
import getpass
import json
import os
import sys
import time
from collections.abc import Awaitable
from typing import TYPE_CHECKING, Any

from outboxd.config import Settings
from outboxd.errors import InvalidState, NotFound, OutboxdError
from outboxd.storage.ports import JobFilter, JobRecord, RelayRow

if TYPE_CHECKING:
    from outboxd.http.console_models import PaceSlot

EXIT_OK, EXIT_FAIL, EXIT_USAGE = 0, 1, 2


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


async def open_store(settings: Settings) -> Any:
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


async def migrate_command(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.storage.store import open_configured

    if args.check:
        return await check_schema(settings)
    store = await open_configured(settings)
    try:
        applied = await store.db.migrate()
    finally:
        await store.close()
    print("applied: " + ", ".join(applied) if applied else "up to date")
    return EXIT_OK


# `migrate --check`: the schema needs migrations this release carries; a newer release's
# contract migration rules this release out (storage/schema.py).
EXIT_PENDING, EXIT_TOO_NEW = 3, 4


async def check_schema(settings: Settings) -> int:
    """`migrate --check`: where the database's schema stands against this release, printed,
    and as the exit code: 0 this release runs on it as it is (its own schema, or a newer
    release's that only expanded it), EXIT_PENDING with the pending migrations one a line,
    EXIT_TOO_NEW. Reads only: a SQLite file that does not exist is not created (every
    migration is pending)."""
    from outboxd import __version__
    from outboxd.storage.db import sqlite_path
    from outboxd.storage.schema import nothing_applied, schema_status
    from outboxd.storage.store import first_step, open_configured

    url = settings.storage.url
    missing = None
    if url.startswith("sqlite:///"):
        path = sqlite_path(url, settings.base_dir)
        missing = None if path.is_file() else path
    if missing is not None:
        status = nothing_applied("sqlite")
    else:
        store = await open_configured(settings)
        status = await first_step(store, schema_status(store.db))
        await store.close()
    release = f"outboxd {__version__}"
    at = f"the database is at schema {status.database}"
    if status.too_new:
        print(
            f"too new: {at}, contracted by a newer release; {release} (schema {status.known}) "
            f"must not run on it (it needs code that knows schema {status.floor})"
        )
        return EXIT_TOO_NEW
    if status.pending:
        if missing is not None:
            at = f"no database at {missing} yet"
        elif status.database is None:
            at = "the database has no schema yet"
        print(f"{len(status.pending)} migration(s) pending: {at}, {release} needs {status.known}:")
        for name in status.pending:
            print(f"  {name}")
        return EXIT_PENDING
    if status.newer:
        print(
            f"up to date: {at}, migrated by a newer release; {release} (schema {status.known}) "
            "runs on it"
        )
    else:
        print(f"up to date: {at}, as {release} needs")
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


async def status_command(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.daemon.readiness import DependencyReadiness
    from outboxd.http.models import to_builtins
    from outboxd.http.render import stats_model
    from outboxd.queue.sqs import QueueError, SqsQueues
    from outboxd.services.admin import AdminService

    store = await open_store(settings)
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
        readiness = DependencyReadiness(store, queues) if queues else None
        stats = await AdminService(store, readiness).stats()
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


async def outbox_command(settings: Settings, args: argparse.Namespace) -> int:
    from outboxd.http.render import relay_item
    from outboxd.services.admin import AdminService

    store = await open_store(settings)
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


async def jobs_command(settings: Settings, args: argparse.Namespace) -> int:
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
    username = None
    if args.jobs_command == "list" and args.username is not None:
        username = _checked_username(args.username)
        if username is None:
            return EXIT_USAGE
    store = await open_store(settings)
    try:
        if args.jobs_command == "list":
            where = None if username is None else _username_filter(settings, store, username)
            return await _jobs_list(store, args, where)
        if args.status is not None:
            return await _jobs_redrive_all(store, args.status, args.limit)
        return await _jobs_redrive_one(store, args.id)
    finally:
        await store.close()


def _checked_username(username: str) -> str | None:
    """`jobs list --username`: the username as intake takes it, or None (said on stderr,
    without the username) when intake would refuse it."""
    from outboxd.http.checks import portal_username
    from outboxd.http.inputs import InputError

    try:
        return portal_username(username)
    except InputError as exc:
        print(f"outboxd: --username {exc.message}", file=sys.stderr)
        return None


def _username_filter(settings: Settings, store: Any, username: str) -> JobFilter:
    """The filter on the username's keyed hash, as the admin API's `username=` builds it."""
    from outboxd.daemon.startup import load_keys
    from outboxd.services.portal_logins import PortalLoginAdmin

    keys = load_keys(settings, os.environ)
    logins = PortalLoginAdmin(store, keys, settings.scrapers.suwon)
    return JobFilter(login_subject=logins.subject(username))


async def _jobs_list(store: Any, args: argparse.Namespace, where: JobFilter | None = None) -> int:
    from outboxd.http.render import job_body

    page = await store.list_jobs(args.status, args.limit, None, where)
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

    store = await open_store(settings)
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
    """Every job in `status`: listed first, then those ids sent through the service the
    admin API's bulk redrive calls, so a job that dies after the listing is not touched; a
    progress line per batch, then the count (exit 1 when any job was refused)."""
    from outboxd.services.admin import AdminService, BulkRedrive

    ids: list[str] = []
    cursor: str | None = None
    more = False
    while True:
        room = 500 if limit is None else min(500, limit - len(ids))
        if room <= 0:
            more = bool((await store.list_jobs(status, 1, cursor)).items)
            break
        page = await store.list_jobs(status, room, cursor)
        ids.extend(j.id for j in page.items)
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    total = len(ids)
    print(f"{status} jobs to redrive: {total}", flush=True)
    if not ids:
        print("redriven: 0 jobs, refused: 0")
        return EXIT_OK

    def progress(done: BulkRedrive) -> None:
        print(f"redriven {len(done.redriven)}/{total}, refused {len(done.refused)}", flush=True)

    done = await AdminService(store).redrive_jobs(
        actor=cli_actor(), job_ids=ids, on_progress=progress
    )
    for job_id, why in done.refused:
        print(f"refused {job_id}: {why}")
    left = " (more are left: run it again)" if more else ""
    print(f"redriven: {len(done.redriven)} jobs, refused: {len(done.refused)}{left}")
    return EXIT_FAIL if done.refused else EXIT_OK


async def queues_command(settings: Settings, _args: argparse.Namespace) -> int:
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
