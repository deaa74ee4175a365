"""Sustained load: clients arriving at a rate, the way users meet the daemon.

Per backend, one server (bench/servers.py `outboxd --sqs STUB --relay`: the API with dispatch
on and the relay loop beside it, as a daemon with roles api and relay runs them) against
the instant SQS stub:

1. its closed-loop capacity: 16 connections for a few seconds (bench/loadgen.py);
2. an open loop at 60% of that capacity for 30 s: requests due on a fixed schedule, each
   one's latency counted from the moment it was due (bench/loadgen.py `--rate`);
3. meanwhile, every quarter second, the relay backlog: relay-outbox rows not SENT yet,
   read from the database by this process; after the schedule ends, how long until every
   row is SENT.

    python -m bench.sustained [--quick] [--backends sqlite,postgres] [--json-out F]
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from testkit.daemon import FakeProcess

from bench import fmt
from bench.common import (
    Bench,
    Results,
    database,
    emit,
    run_loadgen,
    table,
    workdir,
)

SHARE = 0.6  # of the closed-loop capacity, offered open loop
DURATION_S = 30.0
SAMPLE_S = 0.25
UNSENT_SQL = "SELECT count(*) FROM relay_outbox WHERE status IN ('PENDING', 'RETRYABLE_FAILED')"


def unsent_reader(backend: str, url: str) -> Callable[[], Awaitable[int]]:
    """A cheap count of the rows the relay still has to send (the outbox's unsent index)."""
    if backend == "sqlite":
        path = url.removeprefix("sqlite:///")

        def count() -> int:
            with contextlib.closing(sqlite3.connect(path, timeout=5)) as db:
                return int(db.execute(UNSENT_SQL).fetchone()[0])

        async def read_sqlite() -> int:
            return await asyncio.to_thread(count)

        return read_sqlite

    async def read_pg() -> int:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            return int(await conn.fetchval(UNSENT_SQL))
        finally:
            await conn.close()

    return read_pg


async def run_backend(backend: str, wd: Path, stub_url: str, stub_pid: int, quick: bool) -> Results:
    async with database(backend, "sustained", wd) as db:
        server = FakeProcess(
            wd,
            "bench.servers",
            "outboxd",
            "--db",
            db,
            "--workdir",
            str(wd),
            "--sqs",
            stub_url,
            "--relay",
            name=f"sustained-{backend}",
            timeout_s=60,
        )
        try:
            base = server.info["base_url"]
            pids = {"server": server.pid, "sqs": stub_pid}
            cap_dur, warm = (3.0, 1.0) if quick else (5.0, 1.0)
            closed = await asyncio.to_thread(run_loadgen, base, 16, cap_dur, warm, pids, "cap")
            capacity = float(closed["ok_rate"])
            rate = SHARE * capacity
            read_unsent = unsent_reader(backend, db)
            samples: list[tuple[float, int]] = []
            stop = asyncio.Event()

            async def sample() -> None:
                while not stop.is_set():
                    samples.append((time.time(), await read_unsent()))
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), SAMPLE_S)

            sampler = asyncio.create_task(sample())
            try:
                load = await asyncio.to_thread(
                    run_loadgen, base, 0, DURATION_S, 2.0, pids, "sus", rate
                )
            finally:
                stop.set()
                await sampler
            end_at = float(load["end_at"])
            drained_at = None
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                n = await read_unsent()
                samples.append((time.time(), n))
                if n == 0:
                    drained_at = time.time()
                    break
                await asyncio.sleep(0.05)
        finally:
            server.stop()
    during = [n for at, n in samples if at <= end_at]
    return {
        "capacity": closed,
        "open_loop": load,
        "offered_rate": rate,
        "backlog_max": max(during, default=0),
        "backlog_samples": len(during),
        "drain_s": None if drained_at is None else max(0.0, drained_at - end_at),
    }


async def main_async() -> int:
    bench = Bench.parse("sustained", __doc__)
    args = bench.args
    backends = await bench.backends()
    bench.heading("Sustained load")
    emit(
        f"open loop at {SHARE:.0%} of the closed-loop capacity (c16, dispatch on), {DURATION_S:g} s"
    )
    results: Results = {}
    with workdir("sustained") as wd:
        stub = FakeProcess(wd, "bench.servers", "sqs-stub", name="sqs_stub", timeout_s=60)
        try:
            for backend in backends:
                results[backend] = await run_backend(
                    backend, wd, stub.info["endpoint_url"], stub.pid, args.quick
                )
        finally:
            stub.stop()
    rows = []
    for backend, r in results.items():
        ol = r["open_loop"]
        drain = "never" if r["drain_s"] is None else f"{r['drain_s']:.2f} s"
        rows.append([backend, fmt.rate(r["capacity"]["ok_rate"]), fmt.rate(r["offered_rate"])])
        rows[-1] += [fmt.rate(ol["ok_rate"]), fmt.ms(ol["p50_ms"]), fmt.ms(ol["p99_ms"])]
        rows[-1] += [fmt.ms(ol["max_ms"]), str(r["backlog_max"]), drain]
        rows[-1] += [fmt.pct(ol["cpu"].get("server", 0.0)), str(ol["late"])]
    head = ["backend", "capacity c16", "offered", "answered/s", "p50 ms", "p99 ms", "max ms"]
    head += ["backlog max", "all SENT after", "server CPU", "late sends"]
    emit(
        table(
            "Sustained: open loop at 60% of capacity, dispatch on to the stub, relay loop on",
            head,
            rows,
            "Latency from the moment each request was due. backlog: relay rows not SENT, sampled "
            "every 0.25 s. all SENT after: from the end of the schedule. late sends: requests "
            "the load generator itself sent over 5 ms after their due time.",
        )
    )
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
