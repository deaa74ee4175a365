"""A peer's intake, run inside bench/.venv-peers (never in the project's virtualenv).

    python -m bench.peers_worker --lib procrastinate|pgqueuer --dsn DSN --install
    python -m bench.peers_worker --lib ... --dsn DSN --concurrency 16 --duration 5 --warmup 1

`--install` creates the peer's schema in the (fresh) database. A measuring run enqueues
jobs equivalent to a portal-link job (a JSON payload with the job's ids, user, key and a
sealed blob of the same size) from N tasks for a fixed time, through the peer's public
API: procrastinate's `Task.defer_async`, pgqueuer's `Queries.enqueue`. Each library gets
a pool of N connections, as our intake does; the clock is bench.measure's, as for ours.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import itertools
import json
import os
import sys
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from bench.measure import measure

SEALED = base64.b64encode(os.urandom(96)).decode()


def payload(i: int) -> dict[str, Any]:
    return {
        "jobId": str(uuid.uuid4()),
        "userId": "bench",
        "idempotencyKey": f"peer-{os.getpid()}-{i}",
        "portal": "suwon",
        "sealed": SEALED,
    }


def job_op(enqueue: Callable[[dict[str, Any]], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """One enqueue per call, each with a payload of its own."""
    counter = itertools.count()

    async def op() -> None:
        await enqueue(payload(next(counter)))

    return op


async def run_procrastinate(args: argparse.Namespace) -> dict[str, Any]:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=args.dsn, min_size=args.concurrency, max_size=args.concurrency
        )
    )

    @app.task(name="portal_link", queue="portal")
    async def portal_link(**kwargs: Any) -> None:  # never run here: intake only
        return None

    async with app.open_async():
        if args.install:
            await app.schema_manager.apply_schema_async()
            return {"installed": True}

        op = job_op(lambda p: portal_link.defer_async(**p))
        return await measure(op, args.concurrency, args.duration, args.warmup)


async def run_pgqueuer(args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg
    from pgqueuer.queries import Queries

    pool = await asyncpg.create_pool(args.dsn, min_size=args.concurrency, max_size=args.concurrency)
    try:
        queries = Queries.from_asyncpg_pool(pool)
        if args.install:
            await queries.install()
            return {"installed": True}

        op = job_op(lambda p: queries.enqueue("portal_link", json.dumps(p).encode()))
        return await measure(op, args.concurrency, args.duration, args.warmup)
    finally:
        await pool.close()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--lib", choices=("procrastinate", "pgqueuer"), required=True)
    p.add_argument("--dsn", required=True)
    p.add_argument("--install", action="store_true")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    args = p.parse_args()
    fn = run_procrastinate if args.lib == "procrastinate" else run_pgqueuer
    result = asyncio.run(fn(args))
    import importlib.metadata

    result["version"] = importlib.metadata.version(args.lib)
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
