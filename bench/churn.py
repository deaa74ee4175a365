"""Churn: jobs through their whole lives on Postgres with retention on, for as long as it
takes the tables to reach their plateau.

16 workers take portal jobs through every write the daemon makes for them (as bench/pgcost.py:
intake, the SENT mark, the worker's start, the progress steps, SUCCEEDED with a full-size
result), while a second store (another instance) runs `outbox.prune` through its registered
controller every `--prune-every` seconds with a compressed retention (`--keep` seconds for
finished jobs). Every 10 s a sample: table and index bytes of the tables a job writes, their dead
rows, the claim's latency (the worker's start: the lease it takes on the job) in that window,
and the oldest open transaction's age as outboxd's metric reads it. Every prune transaction is
timed: it is the longest any lock it took was held.

`--hold-at S --hold-for S`: one REPEATABLE READ transaction opened S seconds in and held, as a
forgotten psql session or a long report would, to show what it does to vacuum and to the tables.

    python -m bench.churn [--jobs N | --seconds S] [--hold-at S --hold-for S] [--json-out F]
        [--svg F]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import multiprocessing
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import fmt
from bench.common import Bench, database, emit, percentile, pg_version, table, workdir
from bench.measure import new_portal_job
from bench.pgcost import PROGRESS, RESULT
from bench.svgplot import Series, line_chart
from outboxd.workers.loops import sleep_or_stop

CONCURRENCY = 16
SAMPLE_S = 10.0
TABLES = ("jobs", "job_events", "relay_outbox")
SIZES_SQL = """
SELECT c.relname AS name, pg_total_relation_size(c.oid) AS total, pg_indexes_size(c.oid) AS idx,
       COALESCE(s.n_dead_tup, 0) AS dead, COALESCE(s.n_live_tup, 0) AS live
  FROM pg_class c LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid
 WHERE c.relname = ANY($1::text[]) AND c.relkind = 'r'
"""
# The alert's rule (contrib/prometheus/alerts.yml, OutboxdTransactionHeldOpen).
HELD_ALERT_AGE_S = 540.0


class Recorder:
    """Latencies of one kind, kept per sample window."""

    def __init__(self) -> None:
        self.window: list[float] = []

    def add(self, seconds: float) -> None:
        self.window.append(seconds)

    def take(self) -> list[float]:
        out, self.window = self.window, []
        return out


async def lifecycle(store: Any, n: int, claims: Recorder, intakes: Recorder) -> None:
    from outboxd.ids import new_id

    job_id = new_id()
    new = new_portal_job(job_id, new_id(), f"churn-{n}")
    t0 = time.perf_counter()
    intake = await store.create_portal_job(new, now=time.time())
    intakes.add(time.perf_counter() - t0)
    assert intake.outbox is not None
    await store.record_relay_outcome([(intake.outbox, f"msg-{job_id}")], [], time.time())
    t0 = time.perf_counter()
    job = await store.start_job_run(job_id, time.time(), 60.0, 1)
    claims.add(time.perf_counter() - t0)
    assert job is not None
    for step in PROGRESS:
        updated = await store.update_job_progress(
            job, {"step": step, "done": 1, "total": 1}, time.time()
        )
        job = updated or job
    done = await store.finish_job(job, "SUCCEEDED", time.time(), result=RESULT)
    assert done is not None


def timed_runs(store: Any, durations: list[float], by_kind: dict[str, float]) -> None:
    """Every transaction the store runs, timed (the prune's store only); the longest of each
    kind (the named statement, or the body's name) in `by_kind`."""
    run = store.db.run

    async def timed(body: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return await run(body, **kwargs)
        finally:
            took = time.perf_counter() - t0
            durations.append(took)
            args = getattr(body, "args", ())
            func = getattr(body, "func", body)
            kind = args[0] if args and isinstance(args[0], str) else func.__name__
            by_kind[kind] = max(by_kind.get(kind, 0.0), took)

    store.db.run = timed


async def pruner(url: str, keep_s: float, every_s: float, stop: Any) -> dict[str, Any]:
    """outbox.prune every `every_s` through its controller, as another instance's consumer runs
    it, every transaction timed, until `stop` (a multiprocessing Event) is set."""
    from outboxd.services.tasks import TASK_TYPES, Retention, TaskContext
    from outboxd.storage.store import SqlStore, open_database

    db = await open_database(url, Path("."), 2, 10.0)
    store = SqlStore(db, group_commit=False)
    durations: list[float] = []
    kinds: dict[str, float] = {}
    timed_runs(store, durations, kinds)
    retention = Retention(finished_s=keep_s, dead_s=keep_s, batch_rows=1000)
    ctx = TaskContext(store, time.time, retention)
    runs: list[dict[str, Any]] = []
    next_at = time.monotonic() + every_s
    while not stop.is_set():
        await asyncio.sleep(0.2)
        if time.monotonic() < next_at:
            continue
        next_at += every_s
        run, _ = await store.enqueue_task(
            str(uuid.uuid4()), str(uuid.uuid4()), "outbox.prune", {}, uuid.uuid4().hex, time.time()
        )
        t0 = time.perf_counter()
        await TASK_TYPES["outbox.prune"](ctx, run)
        runs.append({"at": time.time(), "seconds": time.perf_counter() - t0})
    await store.close()
    return {
        "runs": runs,
        "tx_max_ms": max(durations, default=0.0) * 1e3,
        "tx_p99_ms": percentile(durations, 99) * 1e3 if durations else 0.0,
        "tx_count": len(durations),
        "tx_max_ms_by_kind": {k: v * 1e3 for k, v in kinds.items()},
    }


def pruner_process(url: str, keep_s: float, every_s: float, stop: Any, out: Any) -> None:
    import structlog

    structlog.configure(
        wrapper_class=structlog.make_filtering_bound_logger(30)  # warnings and up
    )
    out.send(asyncio.run(pruner(url, keep_s, every_s, stop)))


async def holder(url: str, at_s: float, for_s: float, t0: float, marks: dict[str, float]) -> None:
    """One REPEATABLE READ transaction, opened `at_s` into the run and held `for_s`."""
    import asyncpg

    await asyncio.sleep(max(0.0, t0 + at_s - time.monotonic()))
    conn = await asyncpg.connect(url)
    try:
        tr = conn.transaction(isolation="repeatable_read")
        await tr.start()
        await conn.fetchval("SELECT COUNT(*) FROM jobs")  # the snapshot is taken here
        marks["hold_start"] = time.monotonic() - t0
        await asyncio.sleep(for_s)
        await tr.rollback()
        marks["hold_end"] = time.monotonic() - t0
    finally:
        await conn.close()


async def sampler(
    url: str,
    store: Any,
    t0: float,
    done: Callable[[], int],
    claims: Recorder,
    intakes: Recorder,
    stop: asyncio.Event,
    out: list[dict[str, Any]],
) -> None:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        while True:
            rows = await conn.fetch(SIZES_SQL, list(TABLES))
            growth = await store.growth()
            window = claims.take()
            intake = intakes.take()
            out.append(
                {
                    "t": time.monotonic() - t0,
                    "jobs": done(),
                    "bytes": sum(int(r["total"]) for r in rows),
                    "index_bytes": sum(int(r["idx"]) for r in rows),
                    "by_table": {r["name"]: int(r["total"]) for r in rows},
                    "dead": sum(int(r["dead"]) for r in rows),
                    "live": sum(int(r["live"]) for r in rows),
                    "claim_p50_ms": percentile(window, 50) * 1e3 if window else None,
                    "claim_p99_ms": percentile(window, 99) * 1e3 if window else None,
                    "intake_p99_ms": percentile(intake, 99) * 1e3 if intake else None,
                    "oldest_tx_s": growth.oldest_transaction_age_s,
                }
            )
            if stop.is_set():
                return
            await sleep_or_stop(stop, SAMPLE_S)
    finally:
        await conn.close()


async def run(url: str, args: Any, hold: tuple[float, float] | None) -> dict[str, Any]:
    from outboxd.storage.store import SqlStore, open_database

    db = await open_database(url, Path("."), CONCURRENCY, 10.0)
    store = SqlStore(db, group_commit=True)
    await db.migrate()
    # The prune runs in a process of its own, as on another instance: its transactions are
    # timed on an event loop the 16 workers do not share.
    ctx = multiprocessing.get_context("spawn")
    prune_stop = ctx.Event()
    receive, send = ctx.Pipe(duplex=False)
    prune_proc = ctx.Process(
        target=pruner_process, args=(url, args.keep, args.prune_every, prune_stop, send)
    )
    prune_proc.start()
    watch_db = await open_database(url, Path("."), 1, 10.0)
    watch = SqlStore(watch_db, group_commit=False)

    claims, intakes = Recorder(), Recorder()
    stop = asyncio.Event()
    counter = itertools.count()
    finished = [0]
    samples: list[dict[str, Any]] = []
    marks: dict[str, float] = {}
    t0 = time.monotonic()
    deadline = t0 + args.seconds if args.seconds else None

    async def worker() -> None:
        while not stop.is_set():
            n = next(counter)
            if args.jobs and n >= args.jobs:
                return
            if deadline is not None and time.monotonic() >= deadline:
                return
            await lifecycle(store, n, claims, intakes)
            finished[0] += 1

    tasks: list[asyncio.Task[None]] = [
        asyncio.create_task(
            sampler(url, watch, t0, lambda: finished[0], claims, intakes, stop, samples)
        ),
    ]
    if hold is not None:
        tasks.append(asyncio.create_task(holder(url, hold[0], hold[1], t0, marks)))
    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    if hold is not None:
        await tasks[-1]
    stop.set()
    prune_stop.set()
    await asyncio.gather(*tasks)
    elapsed = time.monotonic() - t0
    prunes = await asyncio.to_thread(receive.recv)
    prune_proc.join()
    for s in (store, watch):
        await s.close()
    return {
        "jobs": finished[0],
        "seconds": elapsed,
        "keep_s": args.keep,
        "prune_every_s": args.prune_every,
        "samples": samples,
        "prunes": prunes["runs"],
        "prune_tx_max_ms": prunes["tx_max_ms"],
        "prune_tx_p99_ms": prunes["tx_p99_ms"],
        "prune_tx_count": prunes["tx_count"],
        "prune_tx_max_ms_by_kind": prunes["tx_max_ms_by_kind"],
        "marks": marks,
    }


HEAD: tuple[str, ...] = ("run", "jobs", "s", "size at 100k", "largest after", "ratio")
HEAD += ("claim p99 first (ms)",)
HEAD += ("claim p99 worst (ms)", "longest prune tx (ms)", "held-tx alert")


def summary(label: str, r: dict[str, Any]) -> list[str]:
    samples = r["samples"]
    at_100k = next((s for s in samples if s["jobs"] >= 100_000), samples[-1])
    late = [s for s in samples if s["jobs"] >= at_100k["jobs"]]
    plateau = max(s["bytes"] for s in late)
    # The first window is the first claims on an empty, cold database: the first full one counts.
    claims = [
        s["claim_p99_ms"] for s in samples if s["claim_p99_ms"] is not None and s["t"] >= SAMPLE_S
    ]
    first_p99 = claims[0] if claims else 0.0
    fired = next(
        (s["t"] for s in samples if (s["oldest_tx_s"] or 0.0) > HELD_ALERT_AGE_S), None
    )
    return [
        label,
        f"{r['jobs']:,}",
        f"{r['seconds']:.0f}",
        fmt.mib(at_100k["bytes"]),
        fmt.mib(plateau),
        f"{plateau / at_100k['bytes']:.2f}x",
        f"{first_p99:.1f}",
        f"{max(claims, default=0.0):.1f}",
        f"{r['prune_tx_max_ms']:.1f}",
        "-" if fired is None else f"{fired:.0f} s",
    ]


def hold_summary(r: dict[str, Any]) -> str:
    """Table and index bytes at the hold's start and end, 5 minutes after, and at the run's end."""
    marks = r["marks"]
    if "hold_end" not in marks:
        return ""

    def at(t: float) -> float:
        return float(min(r["samples"], key=lambda s: abs(s["t"] - t))["bytes"])

    start, end = at(marks["hold_start"]), at(marks["hold_end"])
    after, last = at(marks["hold_end"] + 300), float(r["samples"][-1]["bytes"])
    return (
        f"held {marks['hold_end'] - marks['hold_start']:.0f} s from {marks['hold_start']:.0f} s: "
        f"{fmt.mib(start)} MiB at its start, {fmt.mib(end)} at its end ({end / start:.2f}x), "
        f"{fmt.mib(after)} 5 minutes later, {fmt.mib(last)} at the run's end "
        f"({r['samples'][-1]['t'] - marks['hold_end']:.0f} s after it)"
    )


def plot(path: Path, results: dict[str, dict[str, Any]]) -> None:
    series = []
    for label, r in results.items():
        pts = [(s["t"] / 60, s["bytes"] / 2**20) for s in r["samples"]]
        series.append(Series(f"{label}: tables+indexes", pts))
        idx = [(s["t"] / 60, s["index_bytes"] / 2**20) for s in r["samples"]]
        series.append(Series(f"{label}: of which indexes", idx, dashed=True))
    marks = []
    for r in results.values():
        for k in ("hold_start", "hold_end"):
            if k in r["marks"]:
                marks.append((r["marks"][k] / 60, k.replace("_", " ")))
    path.write_text(
        line_chart(
            "Churn on Postgres: jobs, job_events, relay_outbox (MiB) over minutes",
            series,
            x_label="minutes",
            y_label="MiB",
            marks=marks,
        )
    )


async def main_async() -> int:
    bench = Bench.parse(
        "churn",
        __doc__,
        {
            "--jobs": {"type": int, "default": 0, "help": "stop after this many jobs"},
            "--seconds": {"type": float, "default": 0.0, "help": "stop after this long"},
            "--keep": {"type": float, "default": 120.0, "help": "retention.finished_s"},
            "--prune-every": {"type": float, "default": 15.0, "help": "prune schedule (s)"},
            "--hold-at": {"type": float, "default": 0.0},
            "--hold-for": {"type": float, "default": 0.0},
            "--svg": {"type": Path, "default": None},
            "--plot-from": {
                "type": Path,
                "nargs": "+",
                "help": "draw --svg from earlier runs' --json-out files, run nothing",
            },
        },
    )
    args = bench.args
    if args.plot_from:
        runs: dict[str, Any] = {}
        for f in args.plot_from:
            runs.update(json.loads(f.read_text())["results"])
        emit(table("Churn", HEAD, [summary(k, v) for k, v in runs.items()]))
        for v in runs.values():
            if hold_summary(v):
                emit(hold_summary(v))
        if args.svg:
            plot(args.svg, runs)
        return 0
    if not args.jobs and not args.seconds:
        args.jobs = 20_000 if args.quick else 300_000
    if await pg_version() is None:
        emit("(no Postgres: nothing to measure)")
        return 0
    bench.heading("Churn: jobs through their lives with retention on")
    hold = (args.hold_at, args.hold_for) if args.hold_for else None
    label = "held transaction" if hold else "retention on"
    with workdir("churn") as wd:
        async with database("postgres", "churn", wd) as url:
            result = await run(url, args, hold)
    emit(table("Churn", HEAD, [summary(label, result)]))
    if hold_summary(result):
        emit(hold_summary(result))
    kinds = sorted(result["prune_tx_max_ms_by_kind"].items(), key=lambda kv: -kv[1])
    emit("longest prune transaction of each kind (ms): " + ", ".join(
        f"{k} {v:.1f}" for k, v in kinds))
    if args.svg:
        plot(args.svg, {label: result})
    bench.save(results={label: result})
    return 0


def main() -> None:
    raise SystemExit(asyncio.run(main_async()))


if __name__ == "__main__":
    main()
