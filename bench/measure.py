"""In-process measurement: N tasks repeating one async operation for a fixed time.

Also the storage-layer intake operations shared by `intake.py` and `peers.py`: our
`SqlStore.create_portal_job` and the bare loops committing the same two inserts.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import sqlite3
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.common import machine_jiffies, percentile

Op = Callable[[], Awaitable[Any]]


@dataclass
class Result:
    rate: float
    p50_ms: float
    p99_ms: float
    count: int
    cpu: float  # this process, share of one core
    machine_busy: float

    def as_dict(self) -> dict[str, float]:
        return {
            "rate": self.rate,
            "p50_ms": self.p50_ms,
            "p99_ms": self.p99_ms,
            "count": self.count,
            "cpu": self.cpu,
            "machine_busy": self.machine_busy,
        }


async def measure(op: Op, concurrency: int, duration_s: float, warmup_s: float) -> Result:
    """Operations completed inside the window after `warmup_s`, and their latencies."""
    state = {"open": False, "closed": False, "stop": False}
    latencies: list[float] = []

    async def worker() -> None:
        while not state["stop"]:
            t0 = time.perf_counter()
            await op()
            if state["open"] and not state["closed"]:
                latencies.append(time.perf_counter() - t0)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    try:
        await asyncio.sleep(warmup_s)
        p0, m0, t0 = time.process_time(), machine_jiffies(), time.perf_counter()
        state["open"] = True
        await asyncio.sleep(duration_s)
        state["closed"] = True
        wall = time.perf_counter() - t0
        p1, m1 = time.process_time(), machine_jiffies()
    finally:
        state["stop"] = True
        await asyncio.gather(*tasks, return_exceptions=False)
    ms = [x * 1000 for x in latencies]
    total = m1[1] - m0[1]
    return Result(
        rate=len(ms) / wall,
        p50_ms=percentile(ms, 50),
        p99_ms=percentile(ms, 99),
        count=len(ms),
        cpu=(p1 - p0) / wall,
        machine_busy=(m1[0] - m0[0]) / total if total else math.nan,
    )


# ---------------------------------------------------------------------------- intake ops

SEALED = os.urandom(96)  # about the size of a sealed {"username","password"}
FINGERPRINT = "k1:" + "ab" * 32


class JobParams:
    """The values of one job, the same for our intake and the bare loops."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.n = 0

    def next(self) -> dict[str, Any]:
        self.n += 1
        job_id = str(uuid.uuid4())
        return {
            "id": job_id,
            "kind": "portal_link",
            "portal": "suwon",
            "user_id": "bench",
            "idempotency_key": f"{self.prefix}-{self.n}",
            "fingerprint": FINGERPRINT,
            "key_id": "k1",
            "sealed": SEALED,
            "now": time.time(),
            "outbox_id": str(uuid.uuid4()),
        }


def ours_op(store: Any, prefix: str) -> Op:
    """`SqlStore.create_portal_job`: what the service calls inside `submit`."""
    from outboxd.storage.ports import NewPortalJob

    params = JobParams(prefix)

    async def op() -> None:
        p = params.next()
        await store.create_portal_job(
            NewPortalJob(
                job_id=p["id"],
                outbox_id=p["outbox_id"],
                user_id=p["user_id"],
                idempotency_key=p["idempotency_key"],
                fingerprint=p["fingerprint"],
                portal=p["portal"],
                key_id=p["key_id"],
                sealed=p["sealed"],
            ),
            now=p["now"],
        )

    return op


def _relay_params(p: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": p["outbox_id"],
        "kind": "job",
        "job_id": p["id"],
        "task_id": None,
        "dedup_id": p["id"],
        "now": p["now"],
    }


@contextlib.asynccontextmanager
async def bare_pg(dsn: str, pool_size: int, prefix: str) -> AsyncIterator[Op]:
    """BEGIN; the same two INSERTs; COMMIT: asyncpg, pool acquire per transaction."""
    import asyncpg

    from outboxd.storage.db import load_queries

    q = load_queries("postgres")
    ins_job, ins_relay = q["insert_job"], q["insert_relay_row"]
    pool = await asyncpg.create_pool(dsn, min_size=pool_size, max_size=pool_size)
    params = JobParams(prefix)

    async def op() -> None:
        p = params.next()
        async with pool.acquire() as conn, conn.transaction():
            await conn.fetchrow(ins_job.sql, *ins_job.positional(p))
            await conn.fetchrow(ins_relay.sql, *ins_relay.positional(_relay_params(p)))

    try:
        yield op
    finally:
        await pool.close()


_SQLITE_PRAGMAS = (
    "PRAGMA journal_mode=WAL",
    "PRAGMA busy_timeout=10000",
    "PRAGMA synchronous=FULL",
    "PRAGMA foreign_keys=ON",
)


@contextlib.asynccontextmanager
async def bare_sqlite_aiosqlite(path: Path, prefix: str) -> AsyncIterator[Op]:
    """The same driver and pragmas as ours: BEGIN IMMEDIATE, two INSERTs, COMMIT (4 hops)."""
    import aiosqlite

    from outboxd.storage.db import load_queries

    q = load_queries("sqlite")
    ins_job, ins_relay = q["insert_job"].sql, q["insert_relay_row"].sql
    conn = await aiosqlite.connect(str(path), isolation_level=None)
    for pragma in _SQLITE_PRAGMAS:
        await conn.execute(pragma)
    lock = asyncio.Lock()
    params = JobParams(prefix)

    async def op() -> None:
        p = params.next()
        async with lock:
            await conn.execute("BEGIN IMMEDIATE")
            await conn.execute_fetchall(ins_job, p)
            await conn.execute_fetchall(ins_relay, _relay_params(p))
            await conn.execute("COMMIT")

    try:
        yield op
    finally:
        await conn.close()


async def one_hop(
    loop: asyncio.AbstractEventLoop, pool: ThreadPoolExecutor, fn: Callable[[Any], Any], arg: Any
) -> Any:
    """One hop to the bare loop's SQLite thread (a function of its own so it can be counted)."""
    return await loop.run_in_executor(pool, fn, arg)


@contextlib.asynccontextmanager
async def bare_sqlite_one_hop(path: Path, prefix: str) -> AsyncIterator[Op]:
    """The whole transaction as one function on a one-thread executor (plain sqlite3)."""
    from outboxd.storage.db import load_queries

    q = load_queries("sqlite")
    ins_job, ins_relay = q["insert_job"].sql, q["insert_relay_row"].sql
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-bench")
    loop = asyncio.get_running_loop()
    conn: sqlite3.Connection = await loop.run_in_executor(
        pool, lambda: sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
    )
    for pragma in _SQLITE_PRAGMAS:
        await loop.run_in_executor(pool, conn.execute, pragma)
    params = JobParams(prefix)

    def tx(p: dict[str, Any]) -> None:
        conn.execute("BEGIN IMMEDIATE")
        try:
            conn.execute(ins_job, p).fetchall()
            conn.execute(ins_relay, _relay_params(p)).fetchall()
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")

    async def op() -> None:
        await one_hop(loop, pool, tx, params.next())

    try:
        yield op
    finally:
        await loop.run_in_executor(pool, conn.close)
        pool.shutdown()
