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

Then the whole life beside the previous release's (`bench/previous.py`, 5f8e556 unless
`--previous REV`), each tree running its own code, its own `run` (group commit on) in a
subprocess, in paired trials: the goal's jobs/s ratio is the median of the pairs' ratios.

    python -m bench.pgcost [--quick] [--previous REV] [--json-out F]
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

from testkit.records import CS101_RECORD

from bench import fmt
from bench.common import (
    ROOT,
    Bench,
    Results,
    database,
    emit,
    median,
    pg_version,
    table,
    workdir,
)
from bench.measure import new_portal_job
from bench.previous import PREVIOUS, answer, short, spawn_in, tree_of

CONCURRENCY = 16
# A paired run's process (`paired`), in either tree: migrates its database, answers, then
# runs the tree's own `lifecycle` for each number of jobs read from stdin, answering the
# time they took after MARK.
MARK = "PGCOST "
CHILD = """
import asyncio, itertools, json, sys, time
from pathlib import Path
from bench import pgcost
from outboxd.storage.store import SqlStore, open_database

async def main(url):
    db = await open_database(url, Path("."), pgcost.CONCURRENCY, 10.0)
    store = SqlStore(db, group_commit=True)
    await db.migrate()
    seq = itertools.count()

    async def jobs(n):
        queue = iter(range(n))
        async def worker():
            for i in queue:
                await pgcost.lifecycle(store, i, seq)
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(pgcost.CONCURRENCY)))
        return {"jobs": n, "seconds": time.perf_counter() - t0,
                "jobs_per_s": n / (time.perf_counter() - t0)}

    await jobs(50)
    print("PGCOST {}", flush=True)
    while line := await asyncio.to_thread(sys.stdin.readline):
        print("PGCOST " + json.dumps(await jobs(int(line))), flush=True)
    await store.close()

asyncio.run(main(sys.argv[1]))
"""
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
# This database's own WAL between two positions (pg_walinspect): the records that change one
# of its pages, and the commit records of the transactions that wrote them. Other databases
# on the cluster (a test suite, another benchmark) then count for nothing.
# Past this much WAL between the two positions (other work on the cluster), reading it would
# take minutes: the cluster's figures are kept instead, saying so.
WAL_READ_LIMIT = 256 * 2**20
OWN_WAL_SQL = """
WITH r AS (
    SELECT xid, record_length, fpi_length, coalesce(block_ref, '') AS blocks
      FROM pg_get_wal_records_info($1::text::pg_lsn, $2::text::pg_lsn)
), ours AS (
    SELECT * FROM r WHERE blocks ~ (' rel [0-9]+/' || $3::text || '/')
)
SELECT count(*) AS wal_records, coalesce(sum(record_length), 0) AS wal_bytes,
       count(*) FILTER (WHERE fpi_length > 0) AS wal_fpi
  FROM (SELECT record_length, fpi_length FROM ours
        UNION ALL
        SELECT record_length, fpi_length FROM r
         WHERE blocks = '' AND xid <> 0 AND xid IN (SELECT xid FROM ours)) AS mine
"""
DB_COUNTERS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted")
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


class OwnWal:
    """This database's share of the WAL from now on (pg_walinspect), kept readable by a
    temporary replication slot of this connection (gone with it, whatever happens: other
    work on the cluster may recycle segments before the run ends). Where it cannot be (not a
    superuser, no pg_walinspect, no free slot), `read` answers None: the cluster's
    pg_stat_wal counts then."""

    def __init__(self, conn: Any, start: str | None) -> None:
        self.conn, self.start = conn, start
        self.why = "" if start is not None else "pg_walinspect unavailable"

    @classmethod
    async def begin(cls, url: str) -> OwnWal:
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CREATE EXTENSION IF NOT EXISTS pg_walinspect")
            slot = f"outboxd_bench_wal_{os.getpid()}_{uuid.uuid4().hex[:8]}"
            await conn.execute("SELECT pg_create_physical_replication_slot($1, true, true)", slot)
            start = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
        except asyncpg.PostgresError:
            start = None
        return cls(conn, start)

    async def read(self) -> dict[str, float] | None:
        """This database's WAL records, bytes and full-page images since the start."""
        import asyncpg

        if self.start is None:
            return None
        conn = self.conn
        try:
            end = await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
            # Only flushed WAL is read: an asynchronous commit (the SENT marks) may not be yet.
            flushed = "SELECT pg_current_wal_flush_lsn() >= $1::text::pg_lsn"
            for _ in range(200):
                if await conn.fetchval(flushed, end):
                    break
                await asyncio.sleep(0.05)
            size = await conn.fetchval(
                "SELECT pg_wal_lsn_diff($1::text::pg_lsn, $2::text::pg_lsn)", end, self.start
            )
            if size > WAL_READ_LIMIT:  # decoding it would take minutes
                self.why = f"{size / 2**20:,.0f} MiB of the cluster's WAL meanwhile"
                return None
            oid = await conn.fetchval(
                "SELECT oid::text FROM pg_database WHERE datname = current_database()"
            )
            row = await conn.fetchrow(OWN_WAL_SQL, self.start, end, oid)
        except asyncpg.PostgresError as exc:
            self.why = f"pg_walinspect: {exc}"
            return None
        return {k: float(row[k]) for k in ("wal_records", "wal_bytes", "wal_fpi")}

    async def close(self) -> None:
        await self.conn.close()  # the temporary slot goes with the session


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
    """One job's every write, as the daemon makes them. The progress goes through the
    consumer's own `ProgressWriter` at the default `consumer.progress_interval_s`: steps that
    come as fast as here are held and written with the outcome, as the consumer's
    `finish_job(progress=...)` writes them (a portal slower than the interval gets a write
    per interval on top; docs/decisions/0037-progress-written-per-interval.md)."""
    from outboxd.config import ConsumerSettings
    from outboxd.ids import new_id
    from outboxd.workers.progress import ProgressWriter

    job_id = new_id()
    new = new_portal_job(job_id, new_id(), f"cost-{n}-{next(seq)}")
    intake = await store.create_portal_job(new, now=time.time())
    assert intake.outbox is not None
    await store.record_relay_outcome([(intake.outbox, f"msg-{job_id}")], [], time.time())
    job = await store.start_job_run(job_id, time.time(), 60.0, 1)
    assert job is not None
    interval = ConsumerSettings().progress_interval_s
    progress = ProgressWriter(store, lambda: job, time.time, interval)
    for step in PROGRESS:
        await progress.step(step, 1, 1)
    held = await progress.settle()
    done = await store.finish_job(job, "SUCCEEDED", time.time(), result=RESULT, progress=held)
    assert done is not None


async def run(url: str, jobs: int, group_commit: bool, checkpoint: bool = False) -> Results:
    import asyncpg

    from outboxd.storage.store import SqlStore, open_database

    db = await open_database(url, Path("."), CONCURRENCY, 10.0)
    store = SqlStore(db, group_commit=group_commit)
    await db.migrate()
    if checkpoint:
        conn = await asyncpg.connect(url)
        try:
            await conn.execute("CHECKPOINT")
        finally:
            await conn.close()
    wal = await OwnWal.begin(url)
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
    try:  # after the counters: its own statements are not the job's
        own = await wal.read()
    finally:
        await wal.close()
    delta = {k: float(after[k]) - float(migrated[k]) for k in after}
    per_job = {k: v / jobs for k, v in delta.items()}
    if own is not None:  # the cluster's figures stay beside, as cluster_<name>
        per_job |= {f"cluster_{k}": per_job[k] for k in own}
        per_job |= {k: v / jobs for k, v in own.items()}
    return {
        "jobs": jobs,
        "seconds": elapsed,
        "jobs_per_s": jobs / elapsed,
        "per_job": per_job,
        "wal_of": "this database (pg_walinspect)" if own else f"the cluster ({wal.why})",
        "result_bytes": len(json.dumps(RESULT, ensure_ascii=False).encode()),
    }


async def paired(rev: str, segment: int, trials: int, wd: Path) -> Results:
    """This tree's whole life beside `rev`'s. Each tree runs its own code (its storage layer,
    its progress path, its own `bench.pgcost.lifecycle`, group commit on) in a process of its
    own on a fresh database, kept open; the two run `segment` jobs in turn, `trials` times
    each, ours first in even trials and second in odd ones, so a drift (other work on the
    machine) hits a pair alike and favours neither. Commits and WAL per job: each database's
    own, counted the same way for both."""
    out: Results = {"previous": short(rev), "segment": segment, "trials": [], "per_job": {}}
    async with contextlib.AsyncExitStack() as stack:
        old = stack.enter_context(tree_of(rev, wd))
        assert old is not None
        sides: dict[str, Any] = {}
        for side, tree in (("ours", ROOT), ("previous", old)):
            url = await stack.enter_async_context(database("postgres", f"pair_{side}", wd))
            child = stack.enter_context(spawn_in(tree, CHILD, [url]))
            await asyncio.to_thread(answer, child, MARK)  # migrated, warm
            wal = await OwnWal.begin(url)
            stack.push_async_callback(wal.close)
            sides[side] = (url, child, wal, await settled(url))
        for trial in range(-1, trials):  # -1: one segment each first, not counted
            order = list(sides) if trial % 2 == 0 else list(sides)[::-1]
            pair: Results = {}
            for side in order:
                child = sides[side][1]
                child.stdin.write(f"{segment}\n")
                child.stdin.flush()
                pair[side] = await asyncio.to_thread(answer, child, MARK)
            if trial >= 0:
                pair["ratio"] = pair["ours"]["jobs_per_s"] / pair["previous"]["jobs_per_s"]
                out["trials"].append(pair)
        for _, child, _, _ in sides.values():
            child.stdin.close()
            await asyncio.to_thread(child.wait, 60)
        # Both at once, as soon as both ended: the less of other work's WAL to read through.
        owns = await asyncio.gather(*(wal.read() for _, _, wal, _ in sides.values()))
        jobs = segment * (trials + 1)  # the first, uncounted segment too
        for (side, (url, _, wal, before)), own in zip(sides.items(), owns, strict=True):
            after = await settled(url)
            per_job = {k: (float(after[k]) - float(before[k])) / jobs for k in DB_COUNTERS}
            per_job |= {k: v / jobs for k, v in (own or {}).items()}
            out["per_job"][side] = per_job
            out.setdefault("wal_of", {})[side] = "this database" if own else wal.why
    out["paired_ratio"] = median([t["ratio"] for t in out["trials"]])
    return out


def report_paired(p: Results) -> None:
    rows = []
    for n, t in enumerate(p["trials"], start=1):
        rows.append([n, fmt.rate(t["ours"]["jobs_per_s"]), fmt.rate(t["previous"]["jobs_per_s"])])
        rows[-1].append(f"{t['ratio']:.2f}×")
    rows.append(["median", "", "", f"{p['paired_ratio']:.2f}×"])
    emit(
        table(
            f"Whole-life jobs/s beside {p['previous']} (the previous release), paired trials",
            ["trial", "this tree", p["previous"], "ratio"],
            rows,
            f"{p['segment']} jobs a trial, 16 at a time, group commit on, each tree's own code "
            "in a process of its own on its own database; ours first in odd trials.",
        )
    )
    rows = []
    for side in ("ours", "previous"):
        pj = p["per_job"][side]
        rows.append([side if side == "ours" else p["previous"], f"{pj['xact_commit']:.2f}"])
        rows[-1] += [f"{pj['tup_inserted']:.1f}", f"{pj['tup_updated']:.1f}"]
        rows[-1].append(f"{pj['wal_bytes']:,.0f}" if "wal_bytes" in pj else p["wal_of"][side])
    head = ["tree", "commits/job", "rows in/job", "rows updated/job", "WAL bytes/job"]
    emit(
        table(
            "Per job over the paired trials (warm-up included)",
            head,
            rows,
            "Each tree's own database: pg_stat_database, and its WAL read with pg_walinspect.",
        )
    )


async def main_async() -> int:
    bench = Bench.parse(
        "pgcost",
        __doc__,
        {"--previous": {"default": PREVIOUS, "help": "the commit compared with (paired)"}},
    )
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
        trials, segment = (9, 200) if args.quick else (15, 400)
        previous = await paired(args.previous, segment, trials, wd)
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
            f"WAL: {results[next(iter(results))]['wal_of']}; the CPU: the whole cluster (run "
            "on an idle, local Postgres); the rest: pg_stat_database, after the migrations. "
            "A job: intake, SENT mark, start, "
            "5 progress steps (the consumer's progress writer: held, written with the "
            "outcome), SUCCEEDED "
            f"with a {results[next(iter(results))]['result_bytes']:,}-byte result.",
        )
    )
    report_paired(previous)
    bench.save(results={"runs": results, "previous": previous})
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
