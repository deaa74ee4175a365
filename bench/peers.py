"""Peers: procrastinate's `defer_async` and pgqueuer's `enqueue` beside our intake.

All on the same Postgres in the same run, 16 concurrent, trials interleaved:

- ours, storage layer: `SqlStore.create_portal_job` (job + outbox row, one transaction);
- ours, HTTP: `POST /v1/portal-link-jobs` (dispatch off; server and load generator in
  separate processes);
- the bare loop committing the same two INSERTs (the floor under both);
- procrastinate `Task.defer_async` and pgqueuer `Queries.enqueue`, each in its own
  database, run by `bench/peers_worker.py` inside `bench/.venv-peers` (created here with
  pip from PyPI, pins in `bench/requirements-peers.txt`; the project's venv is untouched).

    python -m bench.peers [--quick] [--json-out F]
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH,
    ROOT,
    Child,
    base_parser,
    emit,
    f_ms,
    f_pct,
    f_rate,
    machine_line,
    med,
    open_migrated_store,
    pg_create,
    pg_drop,
    pg_version,
    ratio,
    run_loadgen,
    save,
    table,
    workdir,
)
from bench.measure import bare_pg, measure, ours_op

VENV = BENCH / ".venv-peers"
REQUIREMENTS = BENCH / "requirements-peers.txt"
CONC = 16
PEERS = {"procrastinate": "procrastinate defer_async", "pgqueuer": "pgqueuer enqueue"}


def ensure_venv() -> Path:
    """bench/.venv-peers with the pinned peers; rebuilt when the pins change."""
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
    argv = [str(py), "-m", "bench.peers_worker", "--lib", lib, "--dsn", dsn]
    argv += ["--concurrency", str(CONC), *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False, cwd=ROOT)
    if out.returncode != 0:
        raise RuntimeError(f"{lib} worker failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def run(py: Path, trials: int, dur: float, warm: float) -> dict[str, list[dict[str, Any]]]:
    dbs = {k: await pg_create(f"peers_{k}") for k in ("ours", "http", *PEERS)}
    res: dict[str, list[dict[str, Any]]] = {}
    try:
        for lib in PEERS:
            peer(py, lib, dbs[lib][1], "--install")
        with workdir("peers") as wd:
            store = await open_migrated_store(dbs["ours"][1], wd, CONC)
            argv = ["bench.api_server", "--mode", "outboxd", "--db", dbs["http"][1]]
            server = Child("api-peers", [*argv, "--workdir", str(wd)], wd)
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
    args = base_parser(__doc__ or "").parse_args()
    version = await pg_version()
    if version is None:
        save(args.json_out, {"bench": "peers", "skipped": "Postgres unreachable"})
        return 0
    py = ensure_venv()
    trials, dur, warm = (2, 2.0, 0.5) if args.quick else (3, 5.0, 1.0)
    emit(f"\n## Peers on the same Postgres  ({machine_line()})")
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
                f_rate(rate),
                f_ms(med(rs, "p50_ms")),
                f_ms(med(rs, "p99_ms")),
                f_pct(sorted(cpu)[len(cpu) // 2]),
                f_pct(ratio(rate, procr)),
                f_pct(ratio(rate, bare)),
            ]
        )
    head = ["variant", "jobs/s", "p50 ms", "p99 ms", "client CPU", "vs procrastinate", "vs bare"]
    emit(
        table(
            f"Intake on one Postgres, {CONC} concurrent (jobs/s, medians of trials)",
            head,
            rows,
            "client CPU: the process issuing the jobs (for HTTP: the load generator; the "
            "server's own CPU is in the intake table). Peers run in bench/.venv-peers.",
        )
    )
    save(args.json_out, {"bench": "peers", "results": res, "versions": versions})
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
