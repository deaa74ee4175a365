"""Claimer at scale: claim latency with 10k … 1M rows in the work outbox, and pruning.

Per backend the work outbox grows in stages (bulk-loaded with COPY / executemany, then
ANALYZE): mostly COMPLETED history (90% of it older than the prune cut-off), a fixed
number of fresh PENDING rows, some PENDING retries not yet due and a few PROCESSING rows.
At each stage:

- claim + complete: `SqlStore.claim_work` then `SqlStore.complete_work`, one at a time,
  as the claimer's tick does (p50/p99 of each);
- idle claim: `claim_work` when nothing is eligible (all three scans miss), which is
  what every tick costs on a quiet system;
- Postgres: `EXPLAIN (ANALYZE, BUFFERS)` of the three claim statements (rolled back);
  SQLite: `EXPLAIN QUERY PLAN`.

At the largest stage `SqlStore.prune` (outbox.prune's storage call) runs: rows before and
after, and the time it takes; then claims are measured again.

    python -m bench.claimer [--quick] [--sizes 10000,100000,1000000] [--backends ...]
"""

from __future__ import annotations

import asyncio
import os
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    backends_arg,
    base_parser,
    database,
    emit,
    f_ms,
    goal,
    machine_line,
    open_migrated_store,
    percentile,
    quiet_logging,
    ratio,
    save,
    table,
    verdict,
    workdir,
)
from bench.roundtrips import counting

FRESH_PENDING = 2000
RETRY_PENDING = 200
PROCESSING = 20
DAY = 86400.0
CHUNK = 50_000

WEB_COLS = ["id", "domain", "favicon_url", "category", "created_at", "updated_at"]
WORK_COLS = [
    "id",
    "website_id",
    "status",
    "attempt_count",
    "attempted_at",
    "last_error",
    "created_at",
]


def _rows(
    start: int, n: int, status: str, now: float
) -> tuple[list[tuple[Any, ...]], list[tuple[Any, ...]]]:
    webs, works = [], []
    for i in range(start, start + n):
        wid, oid = str(uuid.uuid4()), str(uuid.uuid4())
        if status == "COMPLETED":
            # 90% older than the 7-day prune cut-off, 10% recent.
            age = (8 + (i % 30)) * DAY if i % 10 else (i % 6) * DAY
            created, attempted, attempts, category = now - age - 60, now - age, 1, "other"
        elif status == "PENDING":
            created, attempted, attempts, category = now - 3600 + i * 1e-3, None, 0, None
        elif status == "RETRY":
            # Attempted recently: waits for claimer.retry_delay_s (60 s) before it is due.
            created, attempted, attempts, category = now - 3600, now - 5, 1, None
        else:  # PROCESSING, held by a live claimer (not stale)
            created, attempted, attempts, category = now - 3600, now - 10, 1, None
        webs.append((wid, f"site-{i}.example.com", None, category, created, created))
        works.append(
            (
                oid,
                wid,
                "PENDING" if status == "RETRY" else status,
                attempts,
                attempted,
                None,
                created,
            )
        )
    return webs, works


async def load(backend: str, url: str, start: int, counts: dict[str, int]) -> float:
    """Insert rows of each status; returns the seconds it took (with ANALYZE)."""
    t0 = time.perf_counter()
    now = time.time()
    i = start
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            for status, n in counts.items():
                for off in range(0, n, CHUNK):
                    k = min(CHUNK, n - off)
                    webs, works = _rows(i, k, status, now)
                    i += k
                    await conn.copy_records_to_table("websites", records=webs, columns=WEB_COLS)
                    await conn.copy_records_to_table(
                        "work_outbox", records=works, columns=WORK_COLS
                    )
            await conn.execute("ANALYZE websites; ANALYZE work_outbox")
        finally:
            await conn.close()
        return time.perf_counter() - t0
    db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        db.execute("PRAGMA synchronous=OFF")  # the loader only; the store keeps FULL
        db.execute("BEGIN IMMEDIATE")
        for status, n in counts.items():
            for off in range(0, n, CHUNK):
                k = min(CHUNK, n - off)
                webs, works = _rows(i, k, status, now)
                i += k
                db.executemany(
                    f"INSERT INTO websites ({','.join(WEB_COLS)}) VALUES "
                    f"({','.join('?' * len(WEB_COLS))})",
                    webs,
                )
                db.executemany(
                    f"INSERT INTO work_outbox ({','.join(WORK_COLS)}) VALUES "
                    f"({','.join('?' * len(WORK_COLS))})",
                    works,
                )
        db.execute("COMMIT")
        db.execute("ANALYZE")
    finally:
        db.close()
    return time.perf_counter() - t0


async def exec_sql(backend: str, url: str, sql: str) -> None:
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()
        return
    db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        db.execute(sql)
    finally:
        db.close()


async def counts_by_status(store: Any) -> dict[str, int]:
    return {s.status: s.count for s in await store.status_counts() if s.table == "work_outbox"}


async def measure_claims(store: Any, k: int) -> dict[str, Any]:
    claim, complete, both = [], [], []
    for _ in range(k):
        t0 = time.perf_counter()
        row = await store.claim_work(time.time(), 60.0, 300.0)
        t1 = time.perf_counter()
        if row is None:
            break
        await store.complete_work(row, "other", time.time())
        t2 = time.perf_counter()
        claim.append((t1 - t0) * 1000)
        complete.append((t2 - t1) * 1000)
        both.append((t2 - t0) * 1000)
    with counting() as c:
        row = await store.claim_work(time.time(), 60.0, 300.0)
        if row is not None:
            await store.complete_work(row, "other", time.time())
    return {
        "n": len(both),
        "claim_p50": percentile(claim, 50),
        "claim_p99": percentile(claim, 99),
        "complete_p50": percentile(complete, 50),
        "complete_p99": percentile(complete, 99),
        "both_p50": percentile(both, 50),
        "both_p99": percentile(both, 99),
        "round_trips": c.total,
    }


async def measure_idle(store: Any, k: int) -> dict[str, Any]:
    lat = []
    for _ in range(k):
        t0 = time.perf_counter()
        row = await store.claim_work(time.time(), 60.0, 300.0)
        lat.append((time.perf_counter() - t0) * 1000)
        assert row is None, "idle claim found a row"
    with counting() as c:
        await store.claim_work(time.time(), 60.0, 300.0)
    return {"n": k, "p50": percentile(lat, 50), "p99": percentile(lat, 99), "round_trips": c.total}


async def plans(backend: str, url: str) -> dict[str, list[str]]:
    """The claim statements' plans (Postgres: executed and rolled back)."""
    from outboxd.storage.db import load_queries

    q = load_queries("postgres" if backend == "postgres" else "sqlite")
    now = time.time()
    params = {
        "now": now,
        "retry_before": now - 60,
        "stale_before": now - 300,
        "before": now - 7 * DAY,
        "limit": 1000,
    }
    names = ["claim_work_fresh", "claim_work_retry", "claim_work_stale", "prune_work_completed"]
    out: dict[str, list[str]] = {}
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            for name in names:
                tx = conn.transaction()
                await tx.start()
                try:
                    rows = await conn.fetch(
                        "EXPLAIN (ANALYZE, BUFFERS) " + q[name].sql, *q[name].positional(params)
                    )
                finally:
                    await tx.rollback()
                out[name] = [r[0] for r in rows]
        finally:
            await conn.close()
        return out
    db = sqlite3.connect(url.removeprefix("sqlite:///"))
    try:
        for name in names:
            rows = db.execute("EXPLAIN QUERY PLAN " + q[name].sql, params).fetchall()
            out[name] = [str(r[-1]) for r in rows]
    finally:
        db.close()
    return out


def plan_digest(lines: list[str]) -> str:
    """Which index each plan reads, and its time and buffers (Postgres)."""
    idx = sorted(
        {
            part.split(" on ")[0].split(" using ")[-1].strip()
            for ln in lines
            for part in [ln]
            if " using " in ln.lower()
        }
    )
    seq = any("Seq Scan" in ln or ("SCAN " in ln and "USING" not in ln) for ln in lines)
    execution = next((ln.split(":")[1].strip() for ln in lines if "Execution Time" in ln), "")
    buffers = next((ln.strip().removeprefix("Buffers: ") for ln in lines if "Buffers:" in ln), "")
    text = ", ".join(idx) or "-"
    if seq:
        text += " + SEQ SCAN"
    if execution:
        text += f"; {execution}"
    if buffers:
        text += f"; {buffers}"
    return text


async def run_backend(backend: str, wd: Path, sizes: list[int], k: int) -> dict[str, Any]:
    async with database(backend, "claimer", wd) as url:
        store = await open_migrated_store(url, wd, 4)
        stages: list[dict[str, Any]] = []
        loaded = 0
        try:
            for size in sizes:
                counts = await counts_by_status(store)
                fresh_now = counts.get("PENDING", 0)
                extra_completed = (
                    size
                    - loaded
                    - (FRESH_PENDING + RETRY_PENDING + PROCESSING if not loaded else 0)
                )
                todo = {
                    "COMPLETED": max(0, extra_completed),
                    "PENDING": max(0, FRESH_PENDING - fresh_now),
                }
                if not loaded:
                    todo.update({"RETRY": RETRY_PENDING, "PROCESSING": PROCESSING})
                load_s = await load(backend, url, loaded, todo)
                loaded += sum(todo.values())
                total = sum((await counts_by_status(store)).values())
                claims = await measure_claims(store, k)
                plan = await plans(backend, url)
                # Idle: nothing fresh left (bench-only SQL), retries not due, PROCESSING live.
                await exec_sql(
                    backend,
                    url,
                    "UPDATE work_outbox SET status = 'COMPLETED', "
                    "attempted_at = created_at, attempt_count = 1 "
                    "WHERE status = 'PENDING' AND attempted_at IS NULL",
                )
                idle = await measure_idle(store, k)
                stages.append(
                    {
                        "size": size,
                        "rows": total,
                        "load_s": load_s,
                        "claims": claims,
                        "idle": idle,
                        "plan": plan,
                    }
                )
                emit(
                    f"  {backend}: {total:,} rows loaded in {load_s:.1f} s; claim+complete p50 "
                    f"{claims['both_p50']:.2f} ms, idle claim p50 {idle['p50']:.2f} ms"
                )
            # Prune at the largest size, then claims once more on the small table.
            before = await counts_by_status(store)
            now = time.time()
            t0 = time.perf_counter()
            pruned = await store.prune(now - 7 * DAY, now - 7 * DAY, 1000)
            prune_s = time.perf_counter() - t0
            after = await counts_by_status(store)
            await load(backend, url, loaded + 1, {"PENDING": FRESH_PENDING})
            post = await measure_claims(store, k)
            return {
                "stages": stages,
                "prune": {"before": before, "after": after, "seconds": prune_s, "pruned": pruned},
                "after_prune_claims": post,
            }
        finally:
            await store.close()


async def main_async() -> int:
    p = base_parser(__doc__ or "")
    p.add_argument(
        "--sizes", help="comma-separated row counts (default: quick 10k,100k; full 10k,100k,1M)"
    )
    args = p.parse_args()
    backends = await backends_arg(args.backends)
    if args.sizes:
        sizes = [int(x) for x in args.sizes.split(",")]
    else:
        sizes = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    k = 200 if args.quick else 500
    emit(f"\n## Claimer at scale  ({machine_line()})")
    emit(f"sizes={sizes}; {k} claims per stage; {FRESH_PENDING} fresh PENDING rows per stage")
    sink = quiet_logging()
    results: dict[str, Any] = {}
    with workdir("claimer") as wd:
        for backend in backends:
            results[backend] = await run_backend(backend, wd, sizes, k)
    sink.close()
    goals = []
    for backend, res in results.items():
        rows = []
        for st in res["stages"]:
            c, i = st["claims"], st["idle"]
            rows.append(
                [
                    f"{st['rows']:,}",
                    f_ms(c["claim_p50"]),
                    f_ms(c["claim_p99"]),
                    f_ms(c["complete_p50"]),
                    f_ms(c["both_p50"]),
                    f_ms(c["both_p99"]),
                    f_ms(i["p50"]),
                    f_ms(i["p99"]),
                    c["round_trips"],
                    i["round_trips"],
                    f"{st['load_s']:.1f}",
                ]
            )
        c = res["after_prune_claims"]
        after_rows = sum(res["prune"]["after"].values())
        rows.append(
            [
                f"{after_rows:,} (pruned)",
                f_ms(c["claim_p50"]),
                f_ms(c["claim_p99"]),
                f_ms(c["complete_p50"]),
                f_ms(c["both_p50"]),
                f_ms(c["both_p99"]),
                "-",
                "-",
                c["round_trips"],
                "-",
                "-",
            ]
        )
        emit(
            table(
                f"Claim latency, {backend} (ms)",
                [
                    "rows",
                    "claim p50",
                    "claim p99",
                    "complete p50",
                    "claim+complete p50",
                    "claim+complete p99",
                    "idle p50",
                    "idle p99",
                    "trips",
                    "idle trips",
                    "load s",
                ],
                rows,
                "trips: database round trips (statements, or hops to the SQLite thread) of one "
                "claim+complete / one idle claim.",
            )
        )
        first, last = res["stages"][0], res["stages"][-1]
        for st in (first, last):
            digest = [[name, plan_digest(lines)] for name, lines in st["plan"].items()]
            emit(table(f"Plans at {st['rows']:,} rows, {backend}", ["statement", "reads"], digest))
        if backend == "postgres":
            emit(f"\nEXPLAIN (ANALYZE, BUFFERS) at {last['rows']:,} rows:")
            for name, lines in last["plan"].items():
                emit(f"-- {name}")
                emit("\n".join("   " + ln for ln in lines))
        pr = res["prune"]
        emit(
            table(
                f"outbox.prune (SqlStore.prune, batches of 1,000), {backend}",
                ["work_outbox before", "after", "seconds", "rows/s", "deleted per table"],
                [
                    [
                        f"{sum(pr['before'].values()):,}",
                        f"{sum(pr['after'].values()):,}",
                        f"{pr['seconds']:.1f}",
                        f"{sum(pr['pruned'].values()) / pr['seconds']:,.0f}"
                        if pr["seconds"]
                        else "-",
                        ", ".join(f"{k2}={v:,}" for k2, v in pr["pruned"].items()),
                    ]
                ],
            )
        )
        growth = ratio(last["claims"]["both_p50"], first["claims"]["both_p50"])
        goals.append(
            goal(
                f"claim latency flat (≤ 2×) from {first['rows']:,} to {last['rows']:,} rows "
                f"({backend})",
                growth,
                2.0,
                growth <= 2.0,
                f"claim+complete p50 {f_ms(first['claims']['both_p50'])} → "
                f"{f_ms(last['claims']['both_p50'])} ms = {growth:.2f}×; idle claim p50 "
                f"{f_ms(first['idle']['p50'])} → {f_ms(last['idle']['p50'])} ms",
            )
        )
    emit("\nGoals:")
    for g in goals:
        emit(f"  [{verdict(g['pass'])}] {g['name']}: {g['text']}")
    save(
        args.json_out,
        {
            "bench": "claimer",
            "quick": args.quick,
            "sizes": sizes,
            "results": results,
            "goals": goals,
        },
    )
    return 0


def main() -> int:
    return asyncio.run(main_async())


if __name__ == "__main__":
    if os.environ.get("OUTBOXD_BENCH_DEBUG"):
        asyncio.get_event_loop_policy()
    raise SystemExit(main())
