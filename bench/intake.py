"""Intake: `POST /v1/portal-link-jobs` and `SqlStore.create_portal_job`, beside their limits.

Per backend (SQLite, Postgres), in one run, trials interleaved so drift hits all alike:

- storage layer, in this process: our `create_portal_job` (job + outbox row, one
  transaction) against a bare loop committing the same two INSERTs, one transaction per
  job, on the same database (asyncpg with a pool; on SQLite plain sqlite3 with the whole
  transaction in one thread hop, and aiosqlite with a hop per call beside it);
- HTTP, server in a subprocess and the load generator in another: the real API with
  dispatch off, with dispatch on to the SQS stub and to moto, a bare aiohttp handler, and
  that bare handler calling our storage layer (`create_portal_job`, nothing else);
  at concurrency 1, 16 and 64, each beside the bare HTTP handler and the bare two-insert
  loop at the same concurrency.

With `--baseline REV` the API servers of another commit (checked out into a scratch
worktree, its own code run) are measured beside this one's, dispatch off and to the stub,
each trial of one right beside the same trial of the other (`paired_order`): the figures a
change is judged by (a move, a new table) in one run, as the median of the paired ratios.

    python -m bench.intake [--quick] [--backends sqlite,postgres] [--no-moto] [--baseline REV]
                           [--json-out F]
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

from testkit.daemon import FakeProcess

from bench import fmt
from bench.common import (
    Bench,
    Results,
    SqsEndpoint,
    database,
    emit,
    med,
    median,
    open_migrated_store,
    purge_queue,
    ratio,
    run_loadgen,
    sqs_servers,
    stub_counts,
    table,
    workdir,
)
from bench.measure import bare_pg, bare_sqlite_aiosqlite, bare_sqlite_one_hop, measure, ours_op
from bench.previous import short, tree_of

POOL = 16
OURS, BARE, AIO = "ours: create_portal_job", "bare: BEGIN+2 INSERT+COMMIT", "bare, aiosqlite"
BARE_STORE = "bare handler + storage layer"
BASELINE = "baseline dispatch"
BASELINE_TRIALS = 5
PerConc = dict[int, list[Results]]


async def storage_layer(
    backend: str, url: str, wd: Path, concs: list[int], trials: int, dur: float, warm: float
) -> dict[str, PerConc]:
    """{variant: {concurrency: [trial results]}}."""
    store = await open_migrated_store(url, wd, POOL)
    out: dict[str, PerConc] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            variants: dict[str, Any] = {OURS: ours_op(store, "ours")}
            if backend == "postgres":
                variants[BARE] = await stack.enter_async_context(bare_pg(url, POOL, "bare"))
            else:
                # The reference: plain sqlite3, the whole transaction in one hop to one
                # thread, as outboxd's driver does. Beside it aiosqlite, which hops to its
                # thread once per call (outboxd's driver before).
                path = Path(url.removeprefix("sqlite:///"))
                ctx = bare_sqlite_one_hop(path, "bare")
                variants[BARE] = await stack.enter_async_context(ctx)
                ctx = bare_sqlite_aiosqlite(path, "aio")
                variants[AIO + " (a hop per call)"] = await stack.enter_async_context(ctx)
            for _trial in range(trials):
                for conc in concs:
                    for name, op in variants.items():
                        r = await measure(op, conc, dur, warm)
                        out.setdefault(name, {}).setdefault(conc, []).append(r)
    finally:
        await store.close()
    return out


def http_runs(
    servers: dict[str, FakeProcess],
    sqs: dict[str, SqsEndpoint],
    concs: list[int],
    trials: int,
    dur: float,
    warm: float,
) -> dict[str, PerConc]:
    """Every server at every concurrency, trial 1 of all before trial 2 of any."""
    out: dict[str, PerConc] = {}
    for trial in range(trials):
        for conc in concs:
            for name in paired_order(list(servers), trial):
                srv = servers[name]
                pids = {"server": srv.pid}
                endpoint = sqs.get(name.removeprefix("dispatch "))
                if endpoint is not None:
                    pids["sqs"] = endpoint.pid
                if endpoint is not None and name == "dispatch moto":
                    purge_queue(endpoint.url, srv.info["jobs_queue_url"])
                # How full the coalesced batches were: the stub counts what it is sent.
                before = stub_counts(sqs["stub"].url) if name.endswith(" stub") else None
                r = run_loadgen(srv.info["base_url"], conc, dur, warm, pids, name.split()[-1])
                if before is not None:
                    after = stub_counts(sqs["stub"].url)
                    sent, calls = after[0] - before[0], after[1] - before[1]
                    r["per_call"] = sent / calls if calls else None
                out.setdefault(name, {}).setdefault(conc, []).append(r)
    return out


def paired_order(names: list[str], trial: int) -> list[str]:
    """`names` with each baseline server right beside ours in the same mode, ours first in
    even trials and second in odd ones (A B, then B A): the two a 0.9x line compares run
    back to back, and a drift within a trial (a checkpoint, autovacuum) favours neither."""
    out: list[str] = []
    for name in names:
        if name.startswith(BASELINE):
            continue
        base = f"{BASELINE} {name.removeprefix('dispatch ')}"
        pair = [name, base] if base in names and name.startswith("dispatch ") else [name]
        out.extend(pair if trial % 2 == 0 else pair[::-1])
    return out


def api_server(
    name: str,
    wd: Path,
    db: str | None,
    sqs_url: str | None = None,
    mode: str = "",
    tree: Path | None = None,
) -> FakeProcess:
    argv = [mode or ("outboxd" if db else "bare")]
    if db:
        argv += ["--db", db, "--workdir", str(wd), "--pool-size", str(POOL)]
    if sqs_url:
        argv += ["--sqs", sqs_url]
    return FakeProcess(wd, "bench.servers", *argv, name=name, timeout_s=60, tree=tree)


async def run_backend(
    backend: str,
    wd: Path,
    sqs: dict[str, SqsEndpoint],
    concs: list[int],
    timing: tuple[int, float, float],
    baseline: Path | None = None,
) -> Results:
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(database(backend, "intake", wd))
        storage = await storage_layer(backend, url, wd, concs, *timing)
        servers: dict[str, FakeProcess] = {}
        try:
            for mode in ("off", *sqs):
                db = await stack.enter_async_context(database(backend, f"intake_{mode}", wd))
                endpoint = sqs[mode].url if mode in sqs else None
                name = f"api-{backend}-{mode}"
                servers[f"dispatch {mode}"] = api_server(name, wd, db, endpoint)
            if baseline is not None:
                for mode in ("off", "stub"):
                    db = await stack.enter_async_context(database(backend, f"base_{mode}", wd))
                    endpoint = sqs[mode].url if mode in sqs else None
                    name = f"base-{backend}-{mode}"
                    servers[f"{BASELINE} {mode}"] = api_server(
                        name, wd, db, endpoint, tree=baseline
                    )
            # The ceiling over our storage layer: aiohttp's bare handler calling it.
            db = await stack.enter_async_context(database(backend, "intake_bare_store", wd))
            name = f"api-{backend}-bare-store"
            servers[BARE_STORE] = api_server(name, wd, db, mode="bare-store")
            http = await asyncio.to_thread(http_runs, servers, sqs, concs, *timing)
        finally:
            for srv in servers.values():
                srv.stop()
    return {"storage": storage, "http": http}


def report(results: Results, concs: list[int]) -> None:
    bare_h = {c: med(v, "rate") for c, v in results["bare_http"].items()}
    for backend, res in results["backends"].items():
        bare_db = {c: med(v, "rate") for c, v in res["storage"][BARE].items()}
        rows = []
        for name, per_c in res["storage"].items():
            for c in concs:
                rs = per_c[c]
                rate = med(rs, "rate")
                rows.append([name, c, fmt.rate(rate), fmt.ms(med(rs, "p50_ms"))])
                rows[-1] += [fmt.ms(med(rs, "p99_ms")), fmt.pct(med(rs, "cpu"))]
                rows[-1].append(fmt.pct(ratio(rate, bare_db[c])))
        emit(
            table(
                f"Intake at the storage layer, {backend} (jobs/s, medians of trials)",
                ["variant", "conc", "jobs/s", "p50 ms", "p99 ms", "bench CPU", "vs bare loop"],
                rows,
                "bench CPU: this process (one core = 100%); Postgres' own CPU is outside it. "
                "SQLite bare loop: plain sqlite3, the transaction in one thread hop.",
            )
        )
        rows = []
        http = {**res["http"], "bare aiohttp handler": results["bare_http"]}
        for name, per_c in http.items():
            for c in concs:
                rs = per_c[c]
                rate = med(rs, "ok_rate")
                cpu = {k: med([x["cpu"] for x in rs], k) for k in ("server", "loadgen", "sqs")}
                rows.append([name, c, fmt.rate(rate), fmt.ms(med(rs, "p50_ms"))])
                rows[-1] += [fmt.ms(med(rs, "p99_ms")), *(fmt.pct(v) for v in cpu.values())]
                rows[-1] += [fmt.pct(med(rs, "machine_busy")), fmt.pct(ratio(rate, bare_h[c]))]
                rows[-1].append(fmt.pct(ratio(rate, bare_db[c])))
                fills = [x["per_call"] for x in rs if x.get("per_call") is not None]
                rows[-1].append(f"{median(fills):.1f}" if fills else "-")
        head = ["server", "conc", "jobs/s", "p50 ms", "p99 ms", "server CPU", "loadgen CPU"]
        head += ["SQS CPU", "machine", "vs bare HTTP", "vs bare loop", "msgs/call"]
        emit(
            table(
                f"HTTP intake, {backend}: POST /v1/portal-link-jobs (202/s, medians of trials)",
                head,
                rows,
                "CPU: share of one core per process; machine: both cores, all processes "
                "(other users' too). vs bare loop: the storage-layer bare loop at the same "
                "concurrency. msgs/call: messages per SendMessageBatch the stub was sent "
                "(how full the coalesced batches were; docs/decisions/0027).",
            )
        )


async def main_async() -> int:
    bench = Bench.parse(
        "intake",
        __doc__,
        {
            "--no-moto": {"action": "store_true", "help": "skip dispatch to moto"},
            "--baseline": {"help": "a commit whose API is measured beside this one's"},
        },
    )
    args = bench.args
    backends = await bench.backends()
    timing = (1, 2.0, 0.5) if args.quick else (3, 4.0, 1.0)
    if args.baseline:
        # A 0.9x line cannot be told from one trial on two cores, where single paired
        # trials range 76-137%: five, paired and interleaved, judged by their median.
        timing = (BASELINE_TRIALS, *timing[1:])
    concs = [1, 16, 64]
    bench.heading("Intake")
    emit(f"trials={timing[0]} × {timing[1]:g} s per point after {timing[2]:g} s; pool={POOL}")
    results: Results = {"backends": {}}
    if args.baseline:
        rev = short(args.baseline)
        results["baseline"] = rev
        emit(f"baseline: the API of {rev}, measured beside this one's")
    with workdir("intake") as wd, tree_of(args.baseline, wd) as base:
        sqs = sqs_servers(wd, moto=not args.no_moto)
        try:
            bare = api_server("api-bare", wd, None)
            try:
                servers = {"bare": bare}
                bare_http = await asyncio.to_thread(http_runs, servers, {}, concs, *timing)
                results["bare_http"] = bare_http["bare"]
            finally:
                bare.stop()
            for backend in backends:
                results["backends"][backend] = await run_backend(
                    backend, wd, sqs, concs, timing, base
                )
        finally:
            for srv in sqs.values():
                srv.stop()
    report(results, concs)
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
