"""Footprint: idle RSS and CPU of the daemon on the embedded default, and RSS under load.

The daemon runs as `outboxd serve` with the repository's config.toml (SQLite, embedded
SQS = moto as a child process, all roles, long polls of 20 s, the nightly prune
schedule), in a scratch folder, port 0. After it is ready and has settled:

- idle: CPU (utime+stime from /proc/<pid>/stat) and RSS (VmRSS from /proc/<pid>/status)
  of the daemon, and of its moto child, over 60 s (`--quick`: 15 s); context switches
  per second show whether anything wakes up more often than its interval;
- load: the load generator POSTs portal-link jobs at concurrency 16 (dispatch to the
  embedded moto), RSS sampled every 0.5 s; then RSS once more after the load.

    python -m bench.footprint [--quick] [--idle-s 60] [--json-out F]
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    base_parser,
    children_of,
    emit,
    f_mib,
    f_ms,
    f_rate,
    goal,
    machine_jiffies,
    machine_line,
    proc_cpu_s,
    proc_ctx_switches,
    proc_rss,
    run_loadgen,
    save,
    table,
    verdict,
    workdir,
)

IDLE_CPU_GOAL = 0.01
IDLE_RSS_GOAL = 120 * 2**20


def config_from_repo(port_zero: bool = True) -> dict[str, Any]:
    import tomllib

    cfg: dict[str, Any] = tomllib.loads((ROOT / "config.toml").read_text())
    if port_zero:
        cfg.setdefault("server", {})["port"] = 0
    return cfg


def sample_rss(pids: list[int], stop: threading.Event, out: dict[int, int]) -> None:
    while not stop.is_set():
        for pid in pids:
            out[pid] = max(out.get(pid, 0), proc_rss(pid))
        stop.wait(0.5)


def run(wd: Path, idle_s: float, settle_s: float, load_s: float) -> dict[str, Any]:
    from tests.support.daemon import DaemonProcess

    daemon = DaemonProcess(wd / "daemon", config_from_repo(), name="footprint")
    try:
        base = daemon.start(timeout_s=90)
        deadline = time.monotonic() + 60
        while not any(e.get("event") == "daemon_ready" for e in daemon.events()):
            if time.monotonic() > deadline:
                raise RuntimeError("daemon never logged daemon_ready")
            time.sleep(0.1)
        time.sleep(settle_s)
        pid = daemon.pid
        kids = children_of(pid)
        moto = kids[0] if kids else None
        c0, m0 = proc_cpu_s(pid), proc_cpu_s(moto) if moto else 0.0
        x0, xm0 = proc_ctx_switches(pid), proc_ctx_switches(moto) if moto else 0
        j0 = machine_jiffies()
        rss_max: dict[int, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=([pid, *kids], stop, rss_max))
        sampler.start()
        t0 = time.perf_counter()
        time.sleep(idle_s)
        wall = time.perf_counter() - t0
        stop.set()
        sampler.join()
        j1 = machine_jiffies()
        idle = {
            "seconds": wall,
            "cpu": (proc_cpu_s(pid) - c0) / wall,
            "moto_cpu": ((proc_cpu_s(moto) - m0) / wall) if moto else float("nan"),
            "rss": proc_rss(pid),
            "rss_max": rss_max.get(pid, 0),
            "moto_rss": proc_rss(moto) if moto else 0,
            "wakeups_per_s": (proc_ctx_switches(pid) - x0) / wall,
            "moto_wakeups_per_s": ((proc_ctx_switches(moto) - xm0) / wall) if moto else 0.0,
            "machine_busy": (j1[0] - j0[0]) / max(1, j1[1] - j0[1]),
        }
        rss_load: dict[int, int] = {}
        stop = threading.Event()
        sampler = threading.Thread(target=sample_rss, args=([pid, *kids], stop, rss_load))
        sampler.start()
        pids = {"server": pid, **({"sqs": moto} if moto else {})}
        load = run_loadgen(
            base,
            path="/v1/portal-link-jobs",
            concurrency=16,
            duration_s=load_s,
            warmup_s=1.0,
            server_pids=pids,
            tag="footprint",
        )
        stop.set()
        sampler.join()
        time.sleep(2.0)
        after = {"rss": proc_rss(pid), "moto_rss": proc_rss(moto) if moto else 0}
        load.update(
            {"rss_max": rss_load.get(pid, 0), "moto_rss_max": rss_load.get(moto, 0) if moto else 0}
        )
        disk = sum(f.stat().st_size for f in (wd / "daemon" / "var").glob("outboxd.db*"))
        return {"idle": idle, "load": load, "after": after, "db_bytes": disk}
    finally:
        if daemon.running():
            daemon.terminate()


async def main_async() -> int:
    p = base_parser(__doc__ or "")
    p.add_argument("--idle-s", type=float)
    args = p.parse_args()
    idle_s = args.idle_s or (15.0 if args.quick else 60.0)
    settle_s, load_s = (5.0, 5.0) if args.quick else (10.0, 15.0)
    emit(f"\n## Footprint  ({machine_line()})")
    emit(
        f"embedded default (config.toml): idle {idle_s:g} s after {settle_s:g} s settling; "
        f"load {load_s:g} s at concurrency 16"
    )
    with workdir("footprint") as wd:
        r = await asyncio.to_thread(run, wd, idle_s, settle_s, load_s)
    i, ld, a = r["idle"], r["load"], r["after"]
    emit(
        table(
            "Footprint (daemon process; its embedded moto child beside it)",
            [
                "phase",
                "daemon RSS MiB",
                "daemon CPU",
                "wakeups/s",
                "moto RSS MiB",
                "moto CPU",
                "jobs/s",
                "p50 ms",
                "p99 ms",
            ],
            [
                [
                    "idle (end)",
                    f_mib(i["rss"]),
                    f"{i['cpu']:.2%}",
                    f"{i['wakeups_per_s']:.1f}",
                    f_mib(i["moto_rss"]),
                    f"{i['moto_cpu']:.2%}",
                    "-",
                    "-",
                    "-",
                ],
                ["idle (max)", f_mib(i["rss_max"]), "", "", "", "", "", "", ""],
                [
                    "load c16 (max)",
                    f_mib(ld["rss_max"]),
                    f"{ld['cpu']['server']:.0%}",
                    "",
                    f_mib(ld["moto_rss_max"]),
                    f"{ld['cpu'].get('sqs', float('nan')):.0%}",
                    f_rate(ld["ok_rate"]),
                    f_ms(ld["p50_ms"]),
                    f_ms(ld["p99_ms"]),
                ],
                ["after load", f_mib(a["rss"]), "", "", f_mib(a["moto_rss"]), "", "", "", ""],
            ],
            f"CPU: share of one core. Machine busy during the idle window (everything, "
            f"other users too): {i['machine_busy']:.0%}. Loadgen CPU under load: "
            f"{ld['cpu']['loadgen']:.0%}. Database after the load: "
            f"{r['db_bytes'] / 2**20:.1f} MiB.",
        )
    )
    goals = [
        goal(
            "idle CPU < 1% (daemon)",
            i["cpu"],
            IDLE_CPU_GOAL,
            i["cpu"] < IDLE_CPU_GOAL,
            f"{i['cpu']:.2%} of one core over {i['seconds']:.0f} s (embedded moto: "
            f"{i['moto_cpu']:.2%})",
        ),
        goal(
            "idle RSS < 120 MiB (daemon)",
            i["rss_max"],
            IDLE_RSS_GOAL,
            i["rss_max"] < IDLE_RSS_GOAL,
            f"{f_mib(i['rss_max'])} MiB (embedded moto child: {f_mib(i['moto_rss'])} MiB)",
        ),
    ]
    emit("\nGoals:")
    for g in goals:
        emit(f"  [{verdict(g['pass'])}] {g['name']}: {g['text']}")
    save(args.json_out, {"bench": "footprint", "quick": args.quick, "results": r, "goals": goals})
    return 0


def main() -> int:
    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
