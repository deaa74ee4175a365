"""In-process measurement: N tasks repeating one async operation for a fixed time.

Also the storage-layer intake operations shared by `intake.py` and `peers.py`: our
`SqlStore.create_portal_job` and the bare loops committing the same two inserts. Only the
standard library at import time: the peers' worker measures with it in .venv-peers.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import sqlite3
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.common import CpuWindow, Results, percentile

if TYPE_CHECKING:  # outboxd is absent from .venv-peers, where the peers' worker runs
    from outboxd.storage.db import Backend, Query

Op = Callable[[], Awaitable[Any]]


async def measure(op: Op, concurrency: int, duration_s: float, warmup_s: float) -> Results:
    """Operations completed inside the window after `warmup_s`, and their latencies."""
    state = {"open": False, "closed": False, "stop": False}
    latencies: list[float] = []

    async def worker() -> None:
        while not state["stop"]:
            t0 = time.perf_counter()
            await op()
            if state["open"] and not state["closed"]:
                latencies.append((time.perf_counter() - t0) * 1000)

    tasks = [asyncio.create_task(worker()) for _ in range(concurrency)]
    cpu = CpuWindow({"self": os.getpid()})
    try:
        await asyncio.sleep(warmup_s)
        cpu.start()
        state["open"] = True
        await asyncio.sleep(duration_s)
        state["closed"] = True
        cpu.stop()
    finally:
        state["stop"] = True
        await asyncio.gather(*tasks)
    return {
        "rate": len(latencies) / cpu.wall_s,
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "count": len(latencies),
        "cpu": cpu.pct("self"),
        "machine_busy": cpu.machine_busy,
    }


# ---------------------------------------------------------------------------- intake ops

SEALED = os.urandom(96)  # about the size of a sealed {"username","password"}
FINGERPRINT = "k1:" + "ab" * 32
LOGIN_SUBJECT = "cd" * 32  # the username's keyed hash, which every job keeps (migration 0010)
SQLITE_PRAGMAS = ("journal_mode=WAL", "busy_timeout=10000", "synchronous=FULL", "foreign_keys=ON")
Rows = Iterator[tuple[dict[str, Any], dict[str, Any]]]


def job_rows(prefix: str) -> Rows:
    """Each next job's values and its relay row's, the same for ours and the bare loops
    (ids as the service makes them: time-ordered)."""
    from outboxd.ids import new_id

    for n in itertools.count(1):
        job_id, now = new_id(), time.time()
        job: dict[str, Any] = {"id": job_id, "kind": "portal_link", "portal": "suwon"}
        job["user_id"] = "bench"
        job.update(idempotency_key=f"{prefix}-{n}", fingerprint=FINGERPRINT, key_id="k1")
        job.update(sealed=SEALED, now=now, traceparent=None, login_subject=LOGIN_SUBJECT)
        relay: dict[str, Any] = {"id": new_id(), "kind": "job", "job_id": job_id}
        relay["task_id"] = None
        # Unclaimed, as an intake with dispatch off inserts it.
        relay.update(dedup_id=job_id, now=now, next_attempt_at=now, claimed_until=None)
        relay["attempt_count"] = 0
        relay["traceparent"] = None
        yield job, relay


def new_portal_job(job_id: str, outbox_id: str, key: str) -> Any:
    """The `NewPortalJob` the benchmarks write: user "bench", fixed sealed bytes and
    fingerprint (the storage-layer loop and the bare handler over the storage layer)."""
    from outboxd.storage.ports import NewPortalJob

    return NewPortalJob(
        job_id=job_id,
        outbox_id=outbox_id,
        user_id="bench",
        idempotency_key=key,
        fingerprint=FINGERPRINT,
        portal="suwon",
        key_id="k1",
        sealed=SEALED,
        login_subject=LOGIN_SUBJECT,
    )


def ours_op(store: Any, prefix: str) -> Op:
    """`SqlStore.create_portal_job`: what the service calls inside `submit`."""
    rows = job_rows(prefix)

    async def op() -> None:
        job, relay = next(rows)
        new = new_portal_job(job["id"], relay["id"], job["idempotency_key"])
        await store.create_portal_job(new, now=job["now"])

    return op


def _inserts(backend: Backend) -> tuple[Query, Query]:
    from outboxd.storage.db import load_queries

    q = load_queries(backend)
    return q["insert_job"], q["insert_relay_row"]


@contextlib.asynccontextmanager
async def bare_pg(dsn: str, pool_size: int, prefix: str) -> AsyncIterator[Op]:
    """BEGIN; the same two INSERTs; COMMIT: asyncpg, pool acquire per transaction."""
    import asyncpg

    ins_job, ins_relay = _inserts("postgres")
    rows = job_rows(prefix)
    async with asyncpg.create_pool(dsn, min_size=pool_size, max_size=pool_size) as pool:

        async def op() -> None:
            job, relay = next(rows)
            async with pool.acquire() as conn, conn.transaction():
                await conn.fetchrow(ins_job.sql, *ins_job.positional(job))
                await conn.fetchrow(ins_relay.sql, *ins_relay.positional(relay))

        yield op


@contextlib.asynccontextmanager
async def bare_sqlite_aiosqlite(path: Path, prefix: str) -> AsyncIterator[Op]:
    """The same pragmas as ours through aiosqlite: BEGIN IMMEDIATE, two INSERTs, COMMIT,
    one hop to its thread per call."""
    import aiosqlite

    ins_job, ins_relay = _inserts("sqlite")
    lock, rows = asyncio.Lock(), job_rows(prefix)
    async with aiosqlite.connect(str(path), isolation_level=None) as conn:
        for pragma in SQLITE_PRAGMAS:
            await conn.execute(f"PRAGMA {pragma}")

        async def op() -> None:
            job, relay = next(rows)
            async with lock:
                await conn.execute("BEGIN IMMEDIATE")
                await conn.execute_fetchall(ins_job.sql, job)
                await conn.execute_fetchall(ins_relay.sql, relay)
                await conn.execute("COMMIT")

        yield op


@contextlib.asynccontextmanager
async def bare_sqlite_one_hop(path: Path, prefix: str) -> AsyncIterator[Op]:
    """The whole transaction as one function on a one-thread executor (plain sqlite3)."""
    ins_job, ins_relay = _inserts("sqlite")
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-bench")
    loop = asyncio.get_running_loop()

    def connect() -> sqlite3.Connection:
        conn = sqlite3.connect(str(path), isolation_level=None, check_same_thread=False)
        for pragma in SQLITE_PRAGMAS:
            conn.execute(f"PRAGMA {pragma}")
        return conn

    conn = await loop.run_in_executor(pool, connect)
    rows = job_rows(prefix)

    def tx(job: dict[str, Any], relay: dict[str, Any]) -> None:
        with conn:  # commits, or rolls back on an exception
            conn.execute("BEGIN IMMEDIATE")
            conn.execute(ins_job.sql, job).fetchall()
            conn.execute(ins_relay.sql, relay).fetchall()

    async def op() -> None:
        await loop.run_in_executor(pool, tx, *next(rows))

    try:
        yield op
    finally:
        await loop.run_in_executor(pool, conn.close)
        pool.shutdown()
