"""Peers: procrastinate's `defer_async` and pgqueuer's `enqueue` beside our intake.

All on the same Postgres in the same run, 16 concurrent, trials interleaved:

- ours, storage layer: `SqlStore.create_portal_job` (job + outbox row, one transaction);
- ours, HTTP: `POST /v1/portal-link-jobs` (dispatch off; server and load generator in
  separate processes);
- the bare loop committing the same two INSERTs (the floor under both);
- procrastinate `Task.defer_async` and pgqueuer `Queries.enqueue`, each in its own
  database, each through its public API with a pool of 16 connections, enqueueing a
  payload equivalent to a portal-link job (ids, user, key, a sealed blob of the same
  size). They run in this module's worker mode inside `.venv-peers` (created here
  with pip from PyPI, pins in `bench/requirements-peers.txt`; the project's venv is
  untouched), timed by the same `bench.measure.measure` as ours.

    python -m bench.peers [--quick] [--json-out F]
    python -m bench.peers --worker procrastinate|pgqueuer --dsn DSN [--install]   (in .venv-peers)
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import hashlib
import itertools
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from bench import fmt
from bench.common import (
    BENCH,
    ROOT,
    Bench,
    emit,
    med,
    open_migrated_store,
    pg_create,
    pg_drop,
    pg_version,
    ratio,
    run_loadgen,
    table,
    workdir,
)
from bench.intake import api_server
from bench.measure import bare_pg, measure, ours_op

VENV = ROOT / ".venv-peers"  # beside .venv, outside bench/: not our code
REQUIREMENTS = BENCH / "requirements-peers.txt"
CONC = 16
PEERS = {"procrastinate": "procrastinate defer_async", "pgqueuer": "pgqueuer enqueue"}


def ensure_venv() -> Path:
    """.venv-peers with the pinned peers; rebuilt when the pins change."""
    py = VENV / "bin" / "python"
    stamp = VENV / ".installed"
    want = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()[:16]
    if py.exists() and stamp.exists() and stamp.read_text().strip() == want:
        return py
    emit(f"(preparing {VENV} from {REQUIREMENTS.name}: pip install from PyPI)")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(VENV)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, "-r", str(REQUIREMENTS)], check=True)
    stamp.write_text(want + "\n")
    return py


def peer(py: Path, lib: str, dsn: str, *extra: str) -> dict[str, Any]:
    argv = [str(py), "-m", "bench.peers", "--worker", lib, "--dsn", dsn, *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{lib} worker failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


SEALED = base64.b64encode(os.urandom(96)).decode()


def payload(i: int) -> dict[str, Any]:
    return {
        "jobId": str(uuid.uuid4()),
        "userId": "bench",
        "idempotencyKey": f"peer-{os.getpid()}-{i}",
        "portal": "suwon",
        "sealed": SEALED,
    }


def job_op(enqueue: Callable[[dict[str, Any]], Awaitable[Any]]) -> Callable[[], Awaitable[Any]]:
    """One enqueue per call, each with a payload of its own."""
    counter = itertools.count()

    async def op() -> None:
        await enqueue(payload(next(counter)))

    return op


async def run_procrastinate(args: argparse.Namespace) -> dict[str, Any]:
    import procrastinate

    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(conninfo=args.dsn, min_size=CONC, max_size=CONC)
    )

    @app.task(name="portal_link", queue="portal")
    async def portal_link(**kwargs: Any) -> None:  # never run here: intake only
        return None

    async with app.open_async():
        if args.install:
            await app.schema_manager.apply_schema_async()
            return {"installed": True}

        op = job_op(lambda p: portal_link.defer_async(**p))
        return await measure(op, CONC, args.duration, args.warmup)


async def run_pgqueuer(args: argparse.Namespace) -> dict[str, Any]:
    import asyncpg
    from pgqueuer.queries import Queries

    pool = await asyncpg.create_pool(args.dsn, min_size=CONC, max_size=CONC)
    try:
        queries = Queries.from_asyncpg_pool(pool)
        if args.install:
            await queries.install()
            return {"installed": True}

        op = job_op(lambda p: queries.enqueue("portal_link", json.dumps(p).encode()))
        return await measure(op, CONC, args.duration, args.warmup)
    finally:
        await pool.close()


async def run(py: Path, trials: int, dur: float, warm: float) -> dict[str, list[dict[str, Any]]]:
    dbs = {k: await pg_create(f"peers_{k}") for k in ("ours", "http", *PEERS)}
    res: dict[str, list[dict[str, Any]]] = {}
    try:
        for lib in PEERS:
            peer(py, lib, dbs[lib][1], "--install")
        with workdir("peers") as wd:
            store = await open_migrated_store(dbs["ours"][1], wd, CONC)
            server = api_server("api-peers", wd, dbs["http"][1])
            try:
                async with bare_pg(dbs["ours"][1], CONC, "bare") as bare:
                    ours = ours_op(store, "ours")
                    for _ in range(trials):
                        res.setdefault("ours: SqlStore.create_portal_job", []).append(
                            await measure(ours, CONC, dur, warm)
                        )
                        res.setdefault("ours: POST /v1/portal-link-jobs (dispatch off)", []).append(
                            await asyncio.to_thread(
                                run_loadgen,
                                server.info["base_url"],
                                CONC,
                                dur,
                                warm,
                                {"server": server.pid},
                                "peers",
                            )
                        )
                        res.setdefault("bare: BEGIN+2 INSERT+COMMIT", []).append(
                            await measure(bare, CONC, dur, warm)
                        )
                        for lib, label in PEERS.items():
                            more = ("--duration", str(dur), "--warmup", str(warm))
                            r = await asyncio.to_thread(peer, py, lib, dbs[lib][1], *more)
                            res.setdefault(label, []).append(r)
            finally:
                server.stop()
                await store.close()
    finally:
        for name, _dsn in dbs.values():
            await pg_drop(name)
    return res


async def main_async() -> int:
    bench = Bench.parse(
        "peers",
        __doc__,
        {
            "--worker": {"choices": PEERS, "help": "enqueue with this peer (in .venv-peers)"},
            "--dsn": {},
            "--install": {"action": "store_true", "help": "with --worker: create its schema"},
            "--duration": {"type": float, "default": 5.0},
            "--warmup": {"type": float, "default": 1.0},
        },
    )
    args = bench.args
    if args.worker:
        import importlib.metadata

        fn = run_procrastinate if args.worker == "procrastinate" else run_pgqueuer
        result = {**await fn(args), "version": importlib.metadata.version(args.worker)}
        sys.stdout.write(json.dumps(result) + "\n")
        return 0
    version = await pg_version()
    if version is None:
        bench.save(skipped="Postgres unreachable")
        return 0
    py = ensure_venv()
    trials, dur, warm = (2, 2.0, 0.5) if args.quick else (3, 5.0, 1.0)
    bench.heading("Peers on the same Postgres")
    emit(f"PostgreSQL {version}; {CONC} concurrent; trials={trials} × {dur:g} s after {warm:g} s")
    res = await run(py, trials, dur, warm)
    versions = {lib: res[label][0]["version"] for lib, label in PEERS.items()}
    procr = med(res[PEERS["procrastinate"]], "rate")
    bare = med(res["bare: BEGIN+2 INSERT+COMMIT"], "rate")
    rows = []
    for name, rs in res.items():
        rate = med(rs, "ok_rate" if "ok_rate" in rs[0] else "rate")
        label = f"{name} {versions[name.split()[0]]}" if name.split()[0] in versions else name
        cpu = [r["cpu"]["loadgen"] if isinstance(r["cpu"], dict) else r["cpu"] for r in rs]
        rows.append(
            [
                label,
                fmt.rate(rate),
                fmt.ms(med(rs, "p50_ms")),
                fmt.ms(med(rs, "p99_ms")),
                fmt.pct(sorted(cpu)[len(cpu) // 2]),
                fmt.pct(ratio(rate, procr)),
                fmt.pct(ratio(rate, bare)),
            ]
        )
    head = ["variant", "jobs/s", "p50 ms", "p99 ms", "client CPU", "vs procrastinate", "vs bare"]
    emit(
        table(
            f"Intake on one Postgres, {CONC} concurrent (jobs/s, medians of trials)",
            head,
            rows,
            "client CPU: the process issuing the jobs (for HTTP: the load generator; the "
            "server's own CPU is in the intake table). Peers run in .venv-peers.",
        )
    )
    bench.save(results=res, versions=versions)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
