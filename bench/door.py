"""The door: outboxd's HTTP intake against what a user would build instead of it, an aiohttp
handler that enqueues with pgqueuer or defers with procrastinate (bench/door_peer.py, run in
`.venv-peers`), all on the same Postgres, 16 concurrent clients.

Nobody puts a job queue on the internet without an HTTP handler in front of it; this compares
the doors. Every server is its own process with a database of its own on the one Postgres,
and the load generator (bench/loadgen.py) is another, POSTing the same portal-link bodies
with an Idempotency-Key to each:

- outboxd's API, dispatch off (the job waits for the relay) and dispatch on to the instant
  SQS stub (published before the answer), as bench/intake.py runs it (auth off);
- the pgqueuer handler and the procrastinate handler (what they check and why:
  bench/door_peer.py).

Trials are interleaved and paired: in each, the four run back to back, in reverse order
every other trial, so each ratio (ours / a peer, same trial) compares neighbours; the goal
line takes the median of the paired ratios. Five trials even with --quick, as intake's
baseline line (single trials range widely on two shared cores).

    python -m bench.door [--quick] [--json-out F]
"""

from __future__ import annotations

import asyncio
import contextlib

from testkit.daemon import FakeProcess

from bench import fmt
from bench.common import (
    Bench,
    Results,
    emit,
    med,
    median,
    pg_create,
    pg_drop,
    pg_version,
    ratio,
    run_loadgen,
    sqs_servers,
    table,
    workdir,
)
from bench.intake import api_server
from bench.peers import ensure_venv, peer
from bench.pgcost import postgres_cpu_s

CONC = 16
TRIALS = 5
OFF, ON = "outboxd, dispatch off", "outboxd, dispatch on (stub)"
PEERS = {"pgqueuer": "aiohttp + pgqueuer enqueue", "procrastinate": "aiohttp + procrastinate defer"}


def trials(
    servers: dict[str, FakeProcess], sqs_pid: int, n: int, dur: float, warm: float
) -> dict[str, list[Results]]:
    """{server: [trial results]}, every server once per trial, reversed every other trial.
    Each result also has `pg_cpu_us`: the CPU of every Postgres process over the whole load
    run (warm-up included) per job answered 202 in it (other users of the same Postgres
    count too: a figure to explain the rates with, not to judge)."""
    out: dict[str, list[Results]] = {}
    names = list(servers)
    for trial in range(n):
        for name in names if trial % 2 == 0 else names[::-1]:
            srv = servers[name]
            pids = {"server": srv.pid} | ({"sqs": sqs_pid} if name == ON else {})
            pg0 = postgres_cpu_s()
            r = run_loadgen(srv.info["base_url"], CONC, dur, warm, pids, f"door{trial}")
            jobs = r["ok_rate"] * (dur + warm)
            r["pg_cpu_us"] = (postgres_cpu_s() - pg0) / jobs * 1e6 if jobs else None
            out.setdefault(name, []).append(r)
    return out


def paired(ours: list[Results], theirs: list[Results]) -> list[float]:
    """Ours over theirs, trial by trial (the two ran side by side), sorted."""
    return sorted(ratio(o["ok_rate"], t["ok_rate"]) for o, t in zip(ours, theirs, strict=True))


async def run(n: int, dur: float, warm: float) -> dict[str, list[Results]]:
    py = ensure_venv()
    dbs = {k: await pg_create(f"door_{k}") for k in ("off", "on", *PEERS)}
    servers: dict[str, FakeProcess] = {}
    try:
        for lib in PEERS:
            peer(py, lib, dbs[lib][1], "--install")
        with workdir("door") as wd:
            sqs = sqs_servers(wd, moto=False)["stub"]
            try:
                servers[OFF] = api_server("door-off", wd, dbs["off"][1])
                servers[ON] = api_server("door-on", wd, dbs["on"][1], sqs.url)
                for lib, label in PEERS.items():
                    servers[label] = FakeProcess(
                        wd,
                        "bench.door_peer",
                        lib,
                        "--dsn",
                        dbs[lib][1],
                        name=f"door-{lib}",
                        timeout_s=60,
                        python=str(py),
                    )
                res = await asyncio.to_thread(trials, servers, sqs.pid, n, dur, warm)
            finally:
                for srv in servers.values():
                    srv.stop()
                sqs.stop()
    finally:
        for name, _dsn in dbs.values():
            with contextlib.suppress(Exception):
                await pg_drop(name)
    return res


def report(res: dict[str, list[Results]]) -> None:
    rows = []
    for name, rs in res.items():
        rate = med(rs, "ok_rate")
        # CPU per job, which the load on the machine moves less than the rates.
        per_job = [r["cpu"]["server"] / r["ok_rate"] * 1e6 for r in rs if r["ok_rate"]]
        pg = [r["pg_cpu_us"] for r in rs if r.get("pg_cpu_us") is not None]
        row = [name, fmt.rate(rate), fmt.ms(med(rs, "p50_ms")), fmt.ms(med(rs, "p99_ms"))]
        row += [f"{median(per_job):,.0f}", f"{median(pg):,.0f}" if pg else "-"]
        row.append(fmt.pct(med(rs, "machine_busy")))
        for label in PEERS.values():
            if name in (OFF, ON):
                pairs = paired(rs, res[label])
                row.append(f"{median(pairs):.2f}× ({pairs[0]:.2f}-{pairs[-1]:.2f})")
            else:
                row.append("")
        rows.append(row)
    head = ["server", "jobs/s", "p50 ms", "p99 ms", "server CPU µs/job", "Postgres CPU µs/job"]
    head.append("machine")
    head += [f"vs {lib} (paired)" for lib in PEERS]
    emit(
        table(
            f"The door: POST /v1/portal-link-jobs on one Postgres, c{CONC} (202/s, medians)",
            head,
            rows,
            "vs: the median of the trial-by-trial ratios, their range in brackets. Server CPU: "
            "the server process's, per job answered; Postgres CPU: every Postgres process's "
            "over the load run, warm-up included, per job (other users' too); machine: both "
            "cores busy, all processes.",
        )
    )


async def main_async() -> int:
    bench = Bench.parse("door", __doc__)
    version = await pg_version()
    if version is None:
        bench.save(skipped="Postgres unreachable")
        return 0
    dur, warm = (2.0, 0.5) if bench.args.quick else (4.0, 1.0)
    bench.heading("The door: outboxd's API against aiohttp over pgqueuer and procrastinate")
    emit(f"PostgreSQL {version}; c{CONC}; {TRIALS} paired trials × {dur:g} s after {warm:g} s")
    res = await run(TRIALS, dur, warm)
    report(res)
    bench.save(results=res, peers=PEERS)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
