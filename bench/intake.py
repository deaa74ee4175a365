"""Intake: `POST /v1/portal-link-jobs` and `SqlStore.create_portal_job`, beside their limits.

Per backend (SQLite, Postgres), in one run, trials interleaved so drift hits all alike:

- storage layer, in this process: our `create_portal_job` (job + outbox row, one
  transaction) against a bare loop committing the same two INSERTs per transaction on the
  same database (same driver and settings; on SQLite also plain sqlite3 with the whole
  transaction in one thread hop);
- HTTP, server in a subprocess and the load generator in another: the real API with
  dispatch off, with dispatch on to the SQS stub and to moto, and a bare aiohttp handler;
  at concurrency 1, 16 and 64, each beside the bare HTTP handler and the bare two-insert
  loop at the same concurrency.

    python -m bench.intake [--quick] [--backends sqlite,postgres] [--profile] [--json-out F]
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from pathlib import Path
from typing import Any

from bench import profile
from bench.common import (
    PY,
    Child,
    MotoChild,
    StubChild,
    backends_arg,
    base_parser,
    database,
    emit,
    f_ms,
    f_pct,
    f_rate,
    goal,
    machine_line,
    median,
    open_migrated_store,
    purge_queue,
    ratio,
    run_loadgen,
    save,
    table,
    verdict,
    workdir,
)
from bench.measure import (
    Result,
    bare_pg,
    bare_sqlite_aiosqlite,
    bare_sqlite_one_hop,
    measure,
    ours_op,
)
from bench.roundtrips import counting

POOL = 16
PATH = "/v1/portal-link-jobs"


def med(results: list[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in results if r.get(key) is not None and not math.isnan(r[key])])


async def storage_layer(
    backend: str, url: str, wd: Path, concs: list[int], trials: int, dur: float, warm: float
) -> tuple[dict[str, dict[int, list[dict[str, Any]]]], dict[str, float]]:
    """{variant: {concurrency: [trial results]}}, {variant: round trips per job}."""
    store = await open_migrated_store(url, wd, POOL)
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    round_trips: dict[str, float] = {}
    try:
        async with contextlib.AsyncExitStack() as stack:
            variants: dict[str, Any] = {"ours: create_portal_job": ours_op(store, "ours")}
            if backend == "postgres":
                variants["bare: BEGIN+2 INSERT+COMMIT"] = await stack.enter_async_context(
                    bare_pg(url, POOL, "bare")
                )
            else:
                # The reference: plain sqlite3, the whole transaction in one hop to one
                # thread, as outboxd's driver does since 2fc7c99. Beside it aiosqlite,
                # which hops to its thread once per call (outboxd's driver before).
                path = Path(url.removeprefix("sqlite:///"))
                variants["bare: BEGIN+2 INSERT+COMMIT"] = await stack.enter_async_context(
                    bare_sqlite_one_hop(path, "bare")
                )
                variants["bare, aiosqlite (a hop per call)"] = await stack.enter_async_context(
                    bare_sqlite_aiosqlite(path, "aio")
                )
            for _trial in range(trials):
                for conc in concs:
                    for name, op in variants.items():
                        r: Result = await measure(op, conc, dur, warm)
                        out.setdefault(name, {}).setdefault(conc, []).append(r.as_dict())
            for name, op in variants.items():
                with counting() as counter:
                    for _ in range(20):
                        await op()
                round_trips[name] = counter.total / 20
    finally:
        await store.close()
    return out, round_trips


def http_runs(
    backend: str,
    urls: dict[str, str],
    wd: Path,
    sqs: dict[str, str],
    sqs_pids: dict[str, int],
    concs: list[int],
    trials: int,
    dur: float,
    warm: float,
    prof: bool,
) -> tuple[dict[str, dict[int, list[dict[str, Any]]]], dict[str, str]]:
    servers: dict[str, Child] = {}
    out: dict[str, dict[int, list[dict[str, Any]]]] = {}
    profiles: dict[str, str] = {}
    try:
        for mode, endpoint in (("off", None), *sqs.items()):
            argv = [
                PY,
                "-m",
                "bench.api_server",
                "--mode",
                "outboxd",
                "--db",
                urls[mode],
                "--workdir",
                str(wd),
                "--pool-size",
                str(POOL),
            ]
            if endpoint:
                argv += ["--sqs", endpoint]
            servers[f"dispatch {mode}"] = Child(f"api-{backend}-{mode}", argv, wd)
        for _trial in range(trials):
            for conc in concs:
                for name, srv in servers.items():
                    pids = {"server": srv.pid}
                    sq = name.removeprefix("dispatch ")
                    if sq in sqs_pids:
                        pids["sqs"] = sqs_pids[sq]
                    if sq == "moto":
                        purge_queue(sqs[sq], srv.info["jobs_queue_url"])
                    spy = None
                    raw = wd / f"profile-{backend}-{sq}-{conc}.txt"
                    if prof and _trial == 0 and conc == 16:
                        spy = profile.record_pid(srv.pid, dur, raw)
                    r = run_loadgen(
                        srv.info["base_url"],
                        path=PATH,
                        concurrency=conc,
                        duration_s=dur,
                        warmup_s=warm,
                        server_pids=pids,
                        tag=f"{backend}-{sq}",
                    )
                    if spy is not None:
                        spy.wait()
                        profiles[f"{backend} HTTP {name} c16"] = profile.summarize(
                            raw, title=f"py-spy: API server, {backend}, {name}, concurrency 16"
                        )
                    out.setdefault(name, {}).setdefault(conc, []).append(r)
    finally:
        for srv in servers.values():
            srv.stop()
    return out, profiles


def bare_http(
    wd: Path, concs: list[int], trials: int, dur: float, warm: float
) -> dict[int, list[dict[str, Any]]]:
    srv = Child("api-bare", [PY, "-m", "bench.api_server", "--mode", "bare"], wd)
    out: dict[int, list[dict[str, Any]]] = {}
    try:
        for _trial in range(trials):
            for conc in concs:
                r = run_loadgen(
                    srv.info["base_url"],
                    path=PATH,
                    concurrency=conc,
                    duration_s=dur,
                    warmup_s=warm,
                    server_pids={"server": srv.pid},
                    tag="bare",
                )
                out.setdefault(conc, []).append(r)
    finally:
        srv.stop()
    return out


async def run_backend(
    backend: str,
    wd: Path,
    sqs: dict[str, str],
    sqs_pids: dict[str, int],
    args: Any,
    concs: list[int],
    trials: int,
    dur: float,
    warm: float,
) -> dict[str, Any]:
    async with contextlib.AsyncExitStack() as stack:
        url = await stack.enter_async_context(database(backend, "intake", wd))
        urls = {
            m: await stack.enter_async_context(database(backend, f"intake_{m}", wd))
            for m in ("off", *sqs)
        }
        storage, rts = await storage_layer(backend, url, wd, concs, trials, dur, warm)
        http, profiles = await asyncio.to_thread(
            http_runs, backend, urls, wd, sqs, sqs_pids, concs, trials, dur, warm, args.profile
        )
    return {"storage": storage, "round_trips": rts, "http": http, "profiles": profiles}


def report(results: dict[str, Any], concs: list[int]) -> list[dict[str, Any]]:
    goals: list[dict[str, Any]] = []
    bare_h = {c: med(v, "rate") for c, v in results["bare_http"].items()}
    for backend, res in results["backends"].items():
        bare_key = "bare: BEGIN+2 INSERT+COMMIT"
        bare_db = {c: med(v, "rate") for c, v in res["storage"][bare_key].items()}
        rows = []
        for name, per_c in res["storage"].items():
            for c in concs:
                rs = per_c[c]
                rate = med(rs, "rate")
                rows.append(
                    [
                        name,
                        c,
                        f_rate(rate),
                        f_ms(med(rs, "p50_ms")),
                        f_ms(med(rs, "p99_ms")),
                        f_pct(med(rs, "cpu")),
                        f_pct(ratio(rate, bare_db[c])),
                        f"{res['round_trips'][name]:g}",
                    ]
                )
        emit(
            table(
                f"Intake at the storage layer, {backend} (jobs/s, medians of trials)",
                [
                    "variant",
                    "conc",
                    "jobs/s",
                    "p50 ms",
                    "p99 ms",
                    "bench CPU",
                    "vs bare loop",
                    "trips/job",
                ],
                rows,
                "bench CPU: this process (one core = 100%); Postgres' own CPU is outside it. "
                "trips/job: statements sent to Postgres, or hops to the SQLite thread, per job. "
                "SQLite bare loop: plain sqlite3, the transaction in one thread hop (the "
                "driver outboxd uses).",
            )
        )
        ours16 = med(res["storage"]["ours: create_portal_job"][16], "rate")
        r = ratio(ours16, bare_db[16])
        goals.append(
            goal(
                f"storage-layer intake ≥ 70% of the bare two-insert loop ({backend}, conc 16)",
                r,
                0.7,
                None if math.isnan(r) else r >= 0.7,
                f"{f_rate(ours16)} vs {f_rate(bare_db[16])} jobs/s = {f_pct(r)}",
            )
        )
        if "bare, aiosqlite (a hop per call)" in res["storage"]:
            aio16 = med(res["storage"]["bare, aiosqlite (a hop per call)"][16], "rate")
            results.setdefault("notes", []).append(
                f"{backend}: ours = {f_pct(ratio(ours16, aio16))} of the aiosqlite loop "
                "(a hop per call)"
            )
        rows = []
        for name, per_c in res["http"].items():
            for c in concs:
                rs = per_c[c]
                rate = med(rs, "ok_rate")
                rows.append(
                    [
                        name,
                        c,
                        f_rate(rate),
                        f_ms(med(rs, "p50_ms")),
                        f_ms(med(rs, "p99_ms")),
                        f_pct(median([x["cpu"]["server"] for x in rs])),
                        f_pct(median([x["cpu"]["loadgen"] for x in rs])),
                        f_pct(median([x["cpu"].get("sqs", math.nan) for x in rs])),
                        f_pct(median([x["machine_busy"] for x in rs])),
                        f_pct(ratio(rate, bare_h[c])),
                        f_pct(ratio(rate, bare_db[c])),
                    ]
                )
        for c in concs:
            rs = results["bare_http"][c]
            rows.append(
                [
                    "bare aiohttp handler",
                    c,
                    f_rate(bare_h[c]),
                    f_ms(med(rs, "p50_ms")),
                    f_ms(med(rs, "p99_ms")),
                    f_pct(median([x["cpu"]["server"] for x in rs])),
                    f_pct(median([x["cpu"]["loadgen"] for x in rs])),
                    "-",
                    f_pct(median([x["machine_busy"] for x in rs])),
                    "100%",
                    "-",
                ]
            )
        emit(
            table(
                f"HTTP intake, {backend}: POST {PATH} (202/s, medians of trials)",
                [
                    "server",
                    "conc",
                    "jobs/s",
                    "p50 ms",
                    "p99 ms",
                    "server CPU",
                    "loadgen CPU",
                    "SQS CPU",
                    "machine",
                    "vs bare HTTP",
                    "vs bare loop",
                ],
                rows,
                "CPU: share of one core per process; machine: both cores, all processes "
                "(other users' too). vs bare loop: the storage-layer bare loop at the same "
                "concurrency.",
            )
        )
        if backend == "sqlite":
            off = {c: med(res["http"]["dispatch off"][c], "ok_rate") for c in concs}
            best_c = max(off, key=lambda c: off[c])
            goals.append(
                goal(
                    "HTTP intake ≥ 1,000 jobs/s on SQLite, dispatch off (best concurrency)",
                    off[best_c],
                    1000,
                    off[best_c] >= 1000,
                    f"{f_rate(off[best_c])} jobs/s at concurrency {best_c}",
                )
            )
    for text in results.get("profiles", []):
        emit("\n" + text)
    return goals


async def main_async() -> int:
    p = base_parser(__doc__ or "")
    p.add_argument("--profile", action="store_true", help="py-spy the API server at conc 16")
    p.add_argument("--no-moto", action="store_true", help="skip dispatch to moto")
    args = p.parse_args()
    backends = await backends_arg(args.backends)
    quick = args.quick
    trials, dur, warm = (1, 2.0, 0.5) if quick else (3, 4.0, 1.0)
    concs = [1, 16, 64]
    emit(f"\n## Intake  ({machine_line()})")
    emit(f"trials={trials} × {dur:g} s per point after {warm:g} s warm-up; pool_size={POOL}")
    results: dict[str, Any] = {"backends": {}, "profiles": []}
    with workdir("intake") as wd:
        stub = StubChild(wd)
        moto = None if args.no_moto else MotoChild(wd)
        try:
            sqs = {"stub": stub.endpoint_url}
            pids = {"stub": stub.pid}
            if moto is not None:
                sqs["moto"] = moto.endpoint_url
                pids["moto"] = moto.pid
            results["bare_http"] = await asyncio.to_thread(bare_http, wd, concs, trials, dur, warm)
            for backend in backends:
                res = await run_backend(backend, wd, sqs, pids, args, concs, trials, dur, warm)
                results["backends"][backend] = res
                results["profiles"] += list(res.pop("profiles").values())
        finally:
            stub.stop()
            if moto is not None:
                moto.stop()
        goals = report(results, concs)
    for note in results.get("notes", []):
        emit(f"note: {note}")
    emit("\nGoals:")
    for g in goals:
        emit(f"  [{verdict(g['pass'])}] {g['name']}: {g['text']}")
    save(args.json_out, {"bench": "intake", "quick": quick, "results": results, "goals": goals})
    return 0


def main() -> int:
    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
