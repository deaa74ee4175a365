"""A peer's intake, run inside bench/.venv-peers (never in the project's virtualenv).

    python bench/peers_worker.py --lib procrastinate|pgqueuer --dsn DSN --install
    python bench/peers_worker.py --lib ... --dsn DSN --concurrency 16 --duration 5 --warmup 1

`--install` creates the peer's schema in the (fresh) database. A measuring run enqueues
jobs equivalent to a portal-link job (a JSON payload with the job's ids, user, key and a
sealed blob of the same size) from N tasks for a fixed time, through the peer's public
API: procrastinate's `Task.defer_async`, pgqueuer's `Queries.enqueue`. Each library gets
a pool of N connections, as our intake does. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import math
import os
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

SEALED = base64.b64encode(os.urandom(96)).decode()


def payload(i: int) -> dict[str, Any]:
    return {
        "jobId": str(uuid.uuid4()),
        "userId": "bench",
        "idempotencyKey": f"peer-{os.getpid()}-{i}",
        "portal": "suwon",
        "sealed": SEALED,
    }


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    s = sorted(values)
    pos = (len(s) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


async def measure(
    op: Callable[[int], Awaitable[Any]], conc: int, dur: float, warm: float
) -> dict[str, Any]:
    state = {"open": False, "closed": False, "stop": False}
    lat: list[float] = []
    counter = iter(range(10**12))

    async def worker() -> None:
        while not state["stop"]:
            t0 = time.perf_counter()
            await op(next(counter))
            if state["open"] and not state["closed"]:
                lat.append((time.perf_counter() - t0) * 1000)

    tasks = [asyncio.create_task(worker()) for _ in range(conc)]
    await asyncio.sleep(warm)
    p0, t0 = time.process_time(), time.perf_counter()
    state["open"] = True
    await asyncio.sleep(dur)
    state["closed"] = True
    wall, p1 = time.perf_counter() - t0, time.process_time()
    state["stop"] = True
    await asyncio.gather(*tasks)
    return {
        "rate": len(lat) / wall,
        "p50_ms": pct(lat, 50),
        "p99_ms": pct(lat, 99),
        "count": len(lat),
        "cpu": (p1 - p0) / wall,
    }


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

        async def op(i: int) -> None:
            await portal_link.defer_async(**payload(i))

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

        async def op(i: int) -> None:
            await queries.enqueue("portal_link", json.dumps(payload(i)).encode())

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
