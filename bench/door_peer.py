"""The door a user would build instead of outboxd: an aiohttp handler that enqueues with
pgqueuer or defers with procrastinate. Run by bench/door.py in `.venv-peers` (standard
library, aiohttp and the peer only; nothing of outboxd is imported).

    .venv-peers/bin/python -m bench.door_peer pgqueuer|procrastinate --dsn DSN --port-file F

`POST /v1/portal-link-jobs` takes outboxd's intake body and answers as outboxd does, 202
with the job id and a Location; minimal, but what a user would have to write:

- the body: a JSON object with exactly `portal`, `username` and `password`, each a string
  within outboxd's limits (a portal it knows, a username of printable ASCII without capital
  letters, a password without control characters); 400 otherwise;
- `Idempotency-Key` required (1-255 visible ASCII, outboxd's rule); the key, scoped by the
  caller (everyone is `local` here, as outboxd with auth off), goes to what the library
  offers for duplicates: pgqueuer's `dedupe_key` (unique among the jobs queued or picked)
  and procrastinate's `queueing_lock` (unique among the jobs waiting to start). On a
  duplicate the handler looks the job up by the key and answers with it
  (`Idempotent-Replayed: true`). Both forget a key once its job has moved on, where
  outboxd keeps it for the job's whole life; every key in the benchmark is new, so the
  lookup never runs and only the unique index is paid;
- one enqueue through the library's public API, a pool of 16 connections (outboxd's
  storage.pool_size in the benchmark).

Left out, each in the peers' favour: sealing the password (it goes into the payload as
sent), log lines, metrics and tracing, which outboxd's API does on every request. The
garbage collector is set as outboxd sets it after start (gc.freeze and a young generation
of 20,000), so the two differ by the work, not by that setting.

Writes `{"base_url", "pid"}` to the port file once listening (what testkit's FakeProcess
waits for) and serves until SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

POOL = 16
USER = "local"
KEY_RE = re.compile(r"^[!-~]{1,255}$")
USERNAME_RE = re.compile(r"^[!-@\[-~]{1,64}$")  # printable ASCII, no capital letters
CONTROL_RE = re.compile("[\x00-\x1f\x7f-\x9f]")
PORTALS = frozenset({"suwon"})
# Enqueue a job of these fields under `dedupe` (the caller's key): its id, and whether it was
# there already.
Enqueue = Callable[[dict[str, str], str], Awaitable[tuple[str, bool]]]


def problem(status: int, detail: str) -> web.Response:
    return web.json_response({"status": status, "detail": detail}, status=status)


def checked(body: Any) -> dict[str, str] | None:
    """The body's fields, or None when they are not what intake takes."""
    if not isinstance(body, dict) or set(body) != {"portal", "username", "password"}:
        return None
    portal, username, password = body["portal"], body["username"], body["password"]
    if not all(isinstance(v, str) for v in (portal, username, password)):
        return None
    if portal not in PORTALS or not USERNAME_RE.match(username):
        return None
    if not 0 < len(password) <= 256 or CONTROL_RE.search(password) or not password.strip():
        return None
    return {"portal": portal, "username": username, "password": password}


def intake(enqueue: Enqueue) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(request: web.Request) -> web.Response:
        key = request.headers.get("Idempotency-Key")
        if key is None or not KEY_RE.match(key):
            return problem(400, "Idempotency-Key must be 1-255 visible ASCII characters")
        try:
            fields = checked(json.loads(await request.read()))
        except ValueError:
            fields = None
        if fields is None:
            return problem(400, "the body must be {portal, username, password}")
        job_id, replayed = await enqueue(fields, f"{USER}:{key}")
        headers = {"Location": f"/v1/jobs/{job_id}"}
        if replayed:
            headers["Idempotent-Replayed"] = "true"
        answer = {"jobId": job_id, "status": "QUEUED"}
        return web.json_response(answer, status=202, headers=headers)

    return handler


async def pgqueuer_enqueue(dsn: str, cleanups: list[Any]) -> Enqueue:
    import asyncpg
    from pgqueuer.errors import DuplicateJobError
    from pgqueuer.queries import Queries

    pool = await asyncpg.create_pool(dsn, min_size=POOL, max_size=POOL)
    cleanups.append(pool.close)
    queries = Queries.from_asyncpg_pool(pool)

    async def enqueue(fields: dict[str, str], dedupe: str) -> tuple[str, bool]:
        payload = json.dumps(fields).encode()
        try:
            ids = await queries.enqueue("portal_link", payload, dedupe_key=dedupe)
        except DuplicateJobError:
            found = await pool.fetchval("SELECT id FROM pgqueuer WHERE dedupe_key = $1", dedupe)
            if found is None:  # it finished meanwhile: the key is free again
                return await enqueue(fields, dedupe)
            return str(found), True
        return str(ids[0]), False

    return enqueue


async def procrastinate_enqueue(dsn: str, cleanups: list[Any]) -> Enqueue:
    import procrastinate
    from procrastinate.exceptions import AlreadyEnqueued

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=dsn, min_size=POOL, max_size=POOL)
    )

    @app.task(name="portal_link", queue="portal")
    async def portal_link(**fields: Any) -> None:  # run by a worker elsewhere; not here
        return None

    await app.open_async()
    cleanups.append(app.close_async)

    async def enqueue(fields: dict[str, str], dedupe: str) -> tuple[str, bool]:
        try:
            job_id = await portal_link.configure(queueing_lock=dedupe).defer_async(**fields)
        except AlreadyEnqueued:
            row = await app.connector.execute_query_one_async(
                "SELECT id FROM procrastinate_jobs WHERE queueing_lock = %(lock)s "
                "AND status = 'todo'",
                lock=dedupe,
            )
            if row is None:  # it started meanwhile: the lock is free again
                return await enqueue(fields, dedupe)
            return str(row["id"]), True
        return str(job_id), False

    return enqueue


async def main(args: argparse.Namespace) -> None:
    cleanups: list[Any] = []
    try:
        make = pgqueuer_enqueue if args.peer == "pgqueuer" else procrastinate_enqueue
        app = web.Application()
        app.router.add_post("/v1/portal-link-jobs", intake(await make(args.dsn, cleanups)))
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        cleanups.append(runner.cleanup)
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        gc.collect()
        gc.freeze()
        _, older, oldest = gc.get_threshold()
        gc.set_threshold(20_000, older, oldest)
        info = {"pid": os.getpid(), "base_url": f"http://127.0.0.1:{port}"}
        port_file = Path(args.port_file)
        tmp = port_file.with_name(port_file.name + ".tmp")
        tmp.write_text(json.dumps(info))
        tmp.replace(port_file)
        stop = asyncio.Event()
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, stop.set)
        await stop.wait()
    finally:
        for fn in reversed(cleanups):
            await fn()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("peer", choices=("pgqueuer", "procrastinate"))
    p.add_argument("--dsn", required=True)
    p.add_argument("--port-file", required=True)
    asyncio.run(main(p.parse_args()))
