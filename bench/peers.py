"""Peers: procrastinate's `defer_async` and pgqueuer's `enqueue` beside our intake.

All on the same Postgres in the same run, 16 concurrent, trials interleaved:

- ours, storage layer: `SqlStore.create_portal_job` (job + outbox row, one transaction);
- ours, HTTP: `POST /v1/portal-link-jobs` (dispatch off; server and load generator in
  separate processes);
- the bare loop committing the same two INSERTs (the floor under both);
- procrastinate 3.10 `Task.defer_async` and pgqueuer 1.6 `Queries.enqueue`, each in its own
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
    PY,
    Child,
    base_parser,
    emit,
    f_ms,
    f_pct,
    f_rate,
    goal,
    machine_line,
    median,
    open_migrated_store,
    pg_available,
    pg_create,
    pg_drop,
    pg_version,
    ratio,
    run_loadgen,
    save,
    table,
    verdict,
    workdir,
)
from bench.measure import bare_pg, measure, ours_op

VENV = BENCH / ".venv-peers"
REQUIREMENTS = BENCH / "requirements-peers.txt"
CONC = 16


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
    subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-r",
            str(REQUIREMENTS),
        ],
        check=True,
    )
    stamp.write_text(want + "\n")
    return py


def peer(py: Path, lib: str, dsn: str, *extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [
            str(py),
            str(BENCH / "peers_worker.py"),
            "--lib",
            lib,
            "--dsn",
            dsn,
            "--concurrency",
            str(CONC),
            *extra,
        ],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    if out.returncode != 0:
        raise RuntimeError(f"{lib} worker failed:\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


async def main_async() -> int:
    p = base_parser(__doc__ or "")
    args = p.parse_args()
    reason = await pg_available()
    if reason is not None:
        emit(f"peers: Postgres unreachable ({reason}); skipped")
        save(args.json_out, {"bench": "peers", "skipped": reason, "goals": []})
        return 0
    py = ensure_venv()
    trials, dur, warm = (2, 2.0, 0.5) if args.quick else (3, 5.0, 1.0)
    emit(f"\n## Peers on the same Postgres  ({machine_line()})")
    emit(
        f"PostgreSQL {await pg_version()}; {CONC} concurrent; trials={trials} × {dur:g} s "
        f"after {warm:g} s warm-up; pools of {CONC} connections everywhere"
    )
    dbs = {k: await pg_create(f"peers_{k}") for k in ("ours", "http", "procrastinate", "pgqueuer")}
    res: dict[str, list[dict[str, Any]]] = {}
    versions: dict[str, str] = {}
    try:
        for lib in ("procrastinate", "pgqueuer"):
            versions[lib] = peer(py, lib, dbs[lib][1], "--install")["version"]
        with workdir("peers") as wd:
            store = await open_migrated_store(dbs["ours"][1], Path(wd), CONC)
            server = Child(
                "api-peers",
                [
                    PY,
                    "-m",
                    "bench.api_server",
                    "--mode",
                    "outboxd",
                    "--db",
                    dbs["http"][1],
                    "--workdir",
                    str(wd),
                    "--pool-size",
                    str(CONC),
                ],
                wd,
            )
            try:
                async with bare_pg(dbs["ours"][1], CONC, "bare") as bare:
                    ours = ours_op(store, "ours")
                    for _ in range(trials):
                        res.setdefault("ours: SqlStore.create_portal_job", []).append(
                            (await measure(ours, CONC, dur, warm)).as_dict()
                        )
                        res.setdefault("ours: POST /v1/portal-link-jobs (dispatch off)", []).append(
                            await asyncio.to_thread(
                                run_loadgen,
                                server.info["base_url"],
                                path="/v1/portal-link-jobs",
                                concurrency=CONC,
                                duration_s=dur,
                                warmup_s=warm,
                                server_pids={"server": server.pid},
                                tag="peers",
                            )
                        )
                        res.setdefault("bare: BEGIN+2 INSERT+COMMIT", []).append(
                            (await measure(bare, CONC, dur, warm)).as_dict()
                        )
                        for lib, label in (
                            ("procrastinate", "procrastinate defer_async"),
                            ("pgqueuer", "pgqueuer enqueue"),
                        ):
                            res.setdefault(f"{label} {versions[lib]}", []).append(
                                await asyncio.to_thread(
                                    peer,
                                    py,
                                    lib,
                                    dbs[lib][1],
                                    "--duration",
                                    str(dur),
                                    "--warmup",
                                    str(warm),
                                )
                            )
            finally:
                server.stop()
                await store.close()
    finally:
        for name, _dsn in dbs.values():
            await pg_drop(name)
    procr = median(
        [r["rate"] for k, rs in res.items() if k.startswith("procrastinate") for r in rs]
    )
    bare_rate = median([r["rate"] for r in res["bare: BEGIN+2 INSERT+COMMIT"]])
    rows = []
    for name, rs in res.items():
        rate = median([r.get("ok_rate", r["rate"]) for r in rs])
        cpu = median([r["cpu"]["loadgen"] if isinstance(r["cpu"], dict) else r["cpu"] for r in rs])
        rows.append(
            [
                name,
                f_rate(rate),
                f_ms(median([r["p50_ms"] for r in rs])),
                f_ms(median([r["p99_ms"] for r in rs])),
                f_pct(cpu),
                f_pct(ratio(rate, procr)),
                f_pct(ratio(rate, bare_rate)),
            ]
        )
    emit(
        table(
            "Intake on one Postgres, 16 concurrent (jobs/s, medians of trials)",
            [
                "variant",
                "jobs/s",
                "p50 ms",
                "p99 ms",
                "client CPU",
                "vs procrastinate",
                "vs bare loop",
            ],
            rows,
            "client CPU: the process issuing the jobs (for HTTP: the load generator; the "
            "server's own CPU is in the intake table). Peers run in bench/.venv-peers.",
        )
    )
    ours_rate = median([r["rate"] for r in res["ours: SqlStore.create_portal_job"]])
    r = ratio(ours_rate, procr)
    goals = [
        goal(
            "storage-layer intake ≥ procrastinate's defer rate (same Postgres)",
            r,
            1.0,
            r >= 1.0,
            f"{f_rate(ours_rate)} vs {f_rate(procr)} jobs/s = {f_pct(r)}",
        )
    ]
    emit("\nGoals:")
    for g in goals:
        emit(f"  [{verdict(g['pass'])}] {g['name']}: {g['text']}")
    save(
        args.json_out,
        {
            "bench": "peers",
            "quick": args.quick,
            "versions": versions,
            "results": res,
            "goals": goals,
        },
    )
    return 0


def main() -> int:
    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
