"""What one job costs Postgres: WAL, commits and rows over its whole life.

A fresh database; N portal jobs, 16 at a time, each through every write the daemon makes
for it, through the storage layer as the daemon calls it: the intake (job, outbox row and
its event; group commit on, or off), the dispatch's SENT mark, the worker's start, the
five progress steps of a portal scrape, and SUCCEEDED with a result the size of a real
academic record. Around the run, the cluster's `pg_stat_wal` and the database's
`pg_stat_database` counters (read after the store's connections closed, so every backend
flushed its statistics), and the CPU of every `postgres` process on this machine (the
postmaster's reaped children included). Run it on an otherwise idle, local Postgres:
pg_stat_wal and the CPU count the whole cluster.

Three runs: group commit on and off, and on again right after a CHECKPOINT, so that the
first change to each page after it writes the whole page to the WAL (full-page images):
the WAL a job costs lies between the first and the third.

    python -m bench.pgcost [--quick] [--json-out F]
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

from testkit.records import CS101_RECORD

from bench import fmt
from bench.common import (
    Bench,
    Results,
    database,
    emit,
    pg_version,
    table,
    workdir,
)
from bench.measure import new_portal_job

CONCURRENCY = 16
PROGRESS = ("LOGIN", "SSO", "PROFILE", "SEMESTERS", "GRADES")
# A result of the size the portal's record gives (eight semesters of six courses).
RESULT: dict[str, Any] = {
    "student": {"studentNumber": "20201234", "name": "홍길동", "college": "IT", "year": 4},
    "semesters": [
        {
            "year": 2021 + n // 2,
            "term": "1" if n % 2 == 0 else "2",
            "creditsAttempted": 18,
            "creditsEarned": 18,
            "gpa": 4.1,
            "percentile": 91.5,
            "rank": "6/33",
            "courses": [{**CS101_RECORD, "code": f"CS{n}{c:02d}"} for c in range(6)],
        }
        for n in range(8)
    ],
    "totals": {"creditsAttempted": 144, "creditsEarned": 144, "gpa": 4.1, "percentile": 91.5},
}
WAL_SQL = "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
DB_SQL = (
    "SELECT xact_commit, tup_inserted, tup_updated, tup_deleted "
    "FROM pg_stat_database WHERE datname = current_database()"
)


CLK_TCK = os.sysconf("SC_CLK_TCK")


def postgres_cpu_s() -> float:
    """CPU seconds of every `postgres` process here: its own and its reaped children's
    (utime, stime, cutime, cstime), so backends that exited during the run still count."""
    total = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if (entry / "comm").read_text().strip() != "postgres":
                continue
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue  # gone meanwhile
        total += sum(int(f) for f in fields[11:15])
    return total / CLK_TCK


async def counters(url: str) -> dict[str, float]:
    import asyncpg

    conn = await asyncpg.connect(url)
    try:
        wal = await conn.fetchrow(WAL_SQL)
        db = await conn.fetchrow(DB_SQL)
    finally:
        await conn.close()
    return {**dict(wal), **dict(db), "cpu_s": postgres_cpu_s()}


async def settled(url: str) -> dict[str, float]:
    """The counters once two readings a moment apart agree (statistics flushed)."""
    last = await counters(url)
    for _ in range(20):
        await asyncio.sleep(0.5)
        now = await counters(url)
        if all(now[k] == last[k] for k in ("xact_commit", "tup_inserted", "tup_updated")):
            return now
        last = now
    return last


async def lifecycle(store: Any, n: int, seq: Any) -> None:
    """One job's every write, as the daemon makes them."""
    from outboxd.ids import new_id

    job_id = new_id()
    new = new_portal_job(job_id, new_id(), f"cost-{n}-{next(seq)}")
    intake = await store.create_portal_job(new, now=time.time())
    assert intake.outbox is not None
    await store.record_relay_outcome([(intake.outbox, f"msg-{job_id}")], [], time.time())
    job = await store.start_job_run(job_id, time.time(), 60.0, 1)
    assert job is not None
    for step in PROGRESS:
        updated = await store.update_job_progress(
            job, {"step": step, "done": 1, "total": 1}, time.time()
        )
        job = updated or job
    done = await store.finish_job(job, "SUCCEEDED", time.time(), result=RESULT)
    assert done is not None


async def run(url: str, jobs: int, group_commit: bool, checkpoint: bool = False) -> Results:
    import asyncpg

    from outboxd.storage.store import SqlStore, open_database

    before = await settled(url)
    db = await open_database(url, Path("."), CONCURRENCY, 10.0)
    store = SqlStore(db, group_commit=group_commit)
    await db.migrate()
    if checkpoint:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()
    migrated = await settled(url)
    seq = itertools.count()
    queue = iter(range(jobs))
    t0 = time.perf_counter()

    async def worker() -> None:
        for n in queue:
            await lifecycle(store, n, seq)

    await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))
    elapsed = time.perf_counter() - t0
    await store.close()
    after = await settled(url)
    del before
    delta = {k: float(after[k]) - float(migrated[k]) for k in after}
    return {
        "jobs": jobs,
        "seconds": elapsed,
        "jobs_per_s": jobs / elapsed,
        "per_job": {k: v / jobs for k, v in delta.items()},
        "result_bytes": len(json.dumps(RESULT, ensure_ascii=False).encode()),
    }


async def main_async() -> int:
    bench = Bench.parse("pgcost", __doc__)
    args = bench.args
    if await pg_version() is None:
        emit("(no Postgres: nothing to measure)")
        return 0
    jobs = 400 if args.quick else 2000
    bench.heading("What one job costs Postgres")
    results: Results = {}
    with workdir("pgcost") as wd:
        runs = (
            ("group commit on", True, False),
            ("group commit off", False, False),
            ("group commit on, after a CHECKPOINT", True, True),
        )
        for n, (label, group_commit, checkpoint) in enumerate(runs):
            async with database("postgres", f"cost_{n}", wd) as url:
                results[label] = await run(url, jobs, group_commit, checkpoint)
    rows = []
    for label, r in results.items():
        pj = r["per_job"]
        rows.append([label, fmt.rate(r["jobs_per_s"]), f"{pj['xact_commit']:.2f}"])
        rows[-1] += [f"{pj['wal_bytes']:,.0f}", f"{pj['wal_records']:.1f}", f"{pj['wal_fpi']:.2f}"]
        rows[-1] += [f"{pj['tup_inserted']:.1f}", f"{pj['tup_updated']:.1f}"]
        rows[-1] += [f"{pj['cpu_s'] * 1e6:,.0f}"]
    head = ["run", "jobs/s (whole life)", "commits/job", "WAL bytes/job", "WAL records/job"]
    head += ["full-page images/job", "rows inserted/job", "rows updated/job"]
    head += ["Postgres CPU µs/job"]
    emit(
        table(
            f"Per job over its whole life ({jobs} jobs, {CONCURRENCY} at a time)",
            head,
            rows,
            "pg_stat_wal and the CPU (the whole cluster: run on an idle, local Postgres) and "
            "pg_stat_database, after the migrations. A job: intake, SENT mark, start, "
            "5 progress steps, SUCCEEDED "
            f"with a {results[next(iter(results))]['result_bytes']:,}-byte result.",
        )
    )
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
