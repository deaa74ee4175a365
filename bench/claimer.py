"""Claimer at scale: claim latency with 10k … 1M rows in the work outbox, and pruning.

Per backend the work outbox grows in stages (bulk-loaded with COPY / executemany, then
ANALYZE): mostly COMPLETED history (90% of it older than the prune cut-off), a fixed
number of fresh PENDING rows, some PENDING retries not yet due and a few PROCESSING rows.
At each stage:

- claim + complete: `SqlStore.claim_work` then `SqlStore.complete_work`, one at a time,
  as the claimer's tick does (p50/p99 of each);
- idle claim: `claim_work` when nothing is eligible (all three scans miss), which is
  what every tick costs on a quiet system;
- the indexes each claim statement and the prune read (Postgres: `EXPLAIN (ANALYZE,
  BUFFERS)`, rolled back, with its execution time; SQLite: `EXPLAIN QUERY PLAN`).

At the largest stage `SqlStore.prune` (outbox.prune's storage call) runs: rows before and
after, and the time it takes; then claims are measured again.

    python -m bench.claimer [--quick] [--sizes 10000,100000,1000000] [--backends ...]
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

from bench import fmt
from bench.common import (
    Bench,
    Results,
    Table,
    database,
    emit,
    open_migrated_store,
    percentile,
    quiet_logging,
    table,
    workdir,
    write_raw,
)

FRESH_PENDING = 2000
RETRY_PENDING = 200
PROCESSING = 20
DAY = 86400.0
CHUNK = 50_000
WEB_COLS = ["id", "domain", "favicon_url", "category", "created_at", "updated_at"]
WORK_COLS = ["id", "website_id", "status", "attempt_count", "attempted_at", "last_error"]
WORK_COLS.append("created_at")


def _rows(start: int, n: int, status: str, now: float) -> tuple[list[Any], list[Any]]:
    from outboxd.ids import new_id

    webs, works = [], []
    for i in range(start, start + n):
        wid, oid = new_id(), new_id()
        if status == "COMPLETED":
            # 90% older than the 7-day prune cut-off, 10% recent.
            age = (8 + (i % 30)) * DAY if i % 10 else (i % 6) * DAY
            created, attempted, attempts, category = now - age - 60, now - age, 1, "other"
        elif status == "PENDING":
            created, attempted, attempts, category = now - 3600 + i * 1e-3, None, 0, None
        else:
            # RETRY: attempted 5 s ago, waits for claimer.retry_delay_s (60 s) to be due.
            # PROCESSING: held by a live claimer (not stale).
            created, attempted, attempts, category = now - 3600, now - 5, 1, None
        webs.append((wid, f"site-{i}.example.com", None, category, created, created))
        row_status = "PENDING" if status == "RETRY" else status
        works.append((oid, wid, row_status, attempts, attempted, None, created))
    return webs, works


async def load(backend: str, url: str, start: int, counts: dict[str, int]) -> float:
    """Insert rows of each status; returns the seconds it took (with ANALYZE)."""
    t0, now, i = time.perf_counter(), time.time(), start
    chunks = []
    for status, n in counts.items():
        for off in range(0, n, CHUNK):
            k = min(CHUNK, n - off)
            chunks.append(_rows(i, k, status, now))
            i += k
    tables: list[Table] = []
    for webs, works in chunks:
        tables += [("websites", WEB_COLS, webs), ("work_outbox", WORK_COLS, works)]
    await write_raw(backend, url, tables)
    return time.perf_counter() - t0


async def counts_by_status(store: Any) -> dict[str, int]:
    return {s.status: s.count for s in await store.status_counts() if s.table == "work_outbox"}


async def measure_claims(store: Any, k: int) -> Results:
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
    out: Results = {"n": len(both)}
    for name, xs in (("claim", claim), ("complete", complete), ("both", both)):
        out.update({f"{name}_p50": percentile(xs, 50), f"{name}_p99": percentile(xs, 99)})
    return out


async def measure_idle(store: Any, k: int) -> Results:
    lat = []
    for _ in range(k):
        t0 = time.perf_counter()
        row = await store.claim_work(time.time(), 60.0, 300.0)
        lat.append((time.perf_counter() - t0) * 1000)
        assert row is None, "idle claim found a row"
    return {"n": k, "p50": percentile(lat, 50), "p99": percentile(lat, 99)}


async def plans(backend: str, url: str) -> dict[str, str]:
    """Which index each claim statement reads (Postgres: EXPLAIN ANALYZE, rolled back)."""
    from outboxd.storage.db import load_queries

    q = load_queries("postgres" if backend == "postgres" else "sqlite")
    now = time.time()
    params = {"now": now, "retry_before": now - 60, "stale_before": now - 300}
    params.update(before=now - 7 * DAY, limit=1000)
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
                    sql = "EXPLAIN (ANALYZE, BUFFERS) " + q[name].sql
                    rows = await conn.fetch(sql, *q[name].positional(params))
                finally:
                    await tx.rollback()
                out[name] = [r[0] for r in rows]
        finally:
            await conn.close()
    else:
        db = sqlite3.connect(url.removeprefix("sqlite:///"))
        try:
            for name in names:
                rows = db.execute("EXPLAIN QUERY PLAN " + q[name].sql, params).fetchall()
                out[name] = [str(r[-1]) for r in rows]
        finally:
            db.close()
    return {name: plan_digest(lines) for name, lines in out.items()}


def plan_digest(lines: list[str]) -> str:
    """The indexes a plan reads, whether it scans a whole table, and its time (Postgres)."""
    used = [ln for ln in lines if " using " in ln.lower()]
    idx = {ln.split(" on ")[0].split(" using ")[-1].strip() for ln in used}
    seq = any("Seq Scan" in ln or ("SCAN " in ln and "USING" not in ln) for ln in lines)
    execution = [ln.split(":")[1].strip() for ln in lines if "Execution Time" in ln]
    text = ", ".join(sorted(idx) or ["-"]) + (" + SEQ SCAN" if seq else "")
    return "; ".join([text, *execution])


async def run_backend(backend: str, wd: Path, sizes: list[int], k: int) -> Results:
    async with database(backend, "claimer", wd) as url:
        store = await open_migrated_store(url, wd, 4)
        stages: list[Results] = []
        loaded = 0
        try:
            for size in sizes:
                fresh_now = (await counts_by_status(store)).get("PENDING", 0)
                todo = {"PENDING": max(0, FRESH_PENDING - fresh_now)}
                if not loaded:
                    todo.update({"RETRY": RETRY_PENDING, "PROCESSING": PROCESSING})
                todo["COMPLETED"] = max(0, size - loaded - sum(todo.values()))
                load_s = await load(backend, url, loaded, todo)
                loaded += sum(todo.values())
                total = sum((await counts_by_status(store)).values())
                claims = await measure_claims(store, k)
                plan = await plans(backend, url)
                # Idle: nothing fresh left (bench-only SQL), retries not due, PROCESSING live.
                await write_raw(
                    backend,
                    url,
                    sql="UPDATE work_outbox SET status = 'COMPLETED', "
                    "attempted_at = created_at, attempt_count = 1 "
                    "WHERE status = 'PENDING' AND attempted_at IS NULL",
                )
                idle = await measure_idle(store, k)
                stages.append({"rows": total, "load_s": load_s, "claims": claims})
                stages[-1].update(idle=idle, plan=plan)
                emit(
                    f"  {backend}: {total:,} rows loaded in {load_s:.1f} s; claim+complete p50 "
                    f"{claims['both_p50']:.2f} ms, idle claim p50 {idle['p50']:.2f} ms"
                )
            # Prune at the largest size, then claims once more on the small table.
            before = await counts_by_status(store)
            now = time.time()
            t0 = time.perf_counter()
            pruned = await store.prune(now - 7 * DAY, now - 7 * DAY, now - 7 * DAY, 1000)
            prune_s = time.perf_counter() - t0
            after = await counts_by_status(store)
            await load(backend, url, loaded + 1, {"PENDING": FRESH_PENDING})
            post = await measure_claims(store, k)
            prune = {"before": before, "after": after, "seconds": prune_s, "pruned": pruned}
            return {"stages": stages, "prune": prune, "after_prune_claims": post}
        finally:
            await store.close()


def report(backend: str, res: Results) -> None:
    rows = []
    pruned = f"{sum(res['prune']['after'].values()):,} (pruned)"
    for st in [*res["stages"], {"rows": None, "claims": res["after_prune_claims"]}]:
        c, i = st["claims"], st.get("idle", {})
        rows.append(
            [
                f"{st['rows']:,}" if st["rows"] else pruned,
                *(fmt.ms(c[k]) for k in ("claim_p50", "claim_p99", "complete_p50", "both_p50")),
                fmt.ms(c["both_p99"]),
                fmt.ms(i.get("p50", math.nan)),
                fmt.ms(i.get("p99", math.nan)),
                f"{st['load_s']:.1f}" if "load_s" in st else "-",
            ]
        )
    head = ["rows", "claim p50", "claim p99", "complete p50", "claim+complete p50"]
    head += ["claim+complete p99", "idle p50", "idle p99", "load s"]
    emit(table(f"Claim latency, {backend} (ms)", head, rows))
    for st in (res["stages"][0], res["stages"][-1]):
        digest = list(st["plan"].items())
        emit(table(f"Plans at {st['rows']:,} rows, {backend}", ["statement", "reads"], digest))
    pr = res["prune"]
    n_before, n_after = sum(pr["before"].values()), sum(pr["after"].values())
    rate = f"{sum(pr['pruned'].values()) / pr['seconds']:,.0f}" if pr["seconds"] else "-"
    per_table = ", ".join(f"{k}={v:,}" for k, v in pr["pruned"].items())
    emit(
        table(
            f"outbox.prune (SqlStore.prune, batches of 1,000), {backend}",
            ["work_outbox before", "after", "seconds", "rows/s", "deleted per table"],
            [[f"{n_before:,}", f"{n_after:,}", f"{pr['seconds']:.1f}", rate, per_table]],
        )
    )


async def main_async() -> int:
    sizes_help = "row counts (default: quick 10k,100k; full 10k,100k,1M)"
    bench = Bench.parse("claimer", __doc__, {"--sizes": {"help": sizes_help}})
    args = bench.args
    backends = await bench.backends()
    default = "10000,100000" if args.quick else "10000,100000,1000000"
    sizes = [int(x) for x in (args.sizes or default).split(",")]
    k = 200 if args.quick else 500
    bench.heading("Claimer at scale")
    emit(f"sizes={sizes}; {k} claims per stage; {FRESH_PENDING} fresh PENDING rows per stage")
    sink = quiet_logging()
    results: dict[str, Any] = {}
    with workdir("claimer") as wd:
        for backend in backends:
            results[backend] = await run_backend(backend, wd, sizes, k)
    sink.close()
    for backend, res in results.items():
        report(backend, res)
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
