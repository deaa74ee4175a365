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
import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from testkit.daemon import DaemonProcess

from bench import fmt
from bench.common import (
    ROOT,
    Bench,
    CpuWindow,
    Results,
    emit,
    proc_rss,
    proc_status,
    run_loadgen,
    table,
    workdir,
)
from bench.e2e import ready


def config_from_repo() -> dict[str, Any]:
    import tomllib

    cfg: dict[str, Any] = tomllib.loads((ROOT / "config.toml").read_text())
    cfg.setdefault("server", {})["port"] = 0
    return cfg


def wakeups(pid: int) -> int:
    return proc_status(pid, "voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")


@contextlib.contextmanager
def max_rss(pids: list[int]) -> Iterator[dict[int, int]]:
    """The largest RSS of each process, sampled every 0.5 s on a thread while inside."""
    out: dict[int, int] = {}
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            for pid in pids:
                out[pid] = max(out.get(pid, 0), proc_rss(pid))
            stop.wait(0.5)

    sampler = threading.Thread(target=sample)
    sampler.start()
    try:
        yield out
    finally:
        stop.set()
        sampler.join()


def run(wd: Path, idle_s: float, settle_s: float, load_s: float) -> Results:
    daemon = DaemonProcess(wd / "daemon", config_from_repo(), name="footprint")
    try:
        base = ready(daemon)
        time.sleep(settle_s)
        pid = daemon.pid
        # Children of any thread: the embedded moto may be spawned from a worker thread.
        tasks = Path(f"/proc/{pid}/task").iterdir()
        moto = ([int(x) for t in tasks for x in (t / "children").read_text().split()] or [0])[0]
        win = CpuWindow({"daemon": pid, "moto": moto})
        x0, xm0 = wakeups(pid), wakeups(moto)
        with max_rss([pid, moto]) as rss_max:
            win.start()
            time.sleep(idle_s)
            win.stop()
        idle = {"seconds": win.wall_s, "cpu": win.pct("daemon"), "moto_cpu": win.pct("moto")}
        idle.update(rss=proc_rss(pid), rss_max=rss_max.get(pid, 0), moto_rss=proc_rss(moto))
        idle.update(machine_busy=win.machine_busy, wakeups_per_s=(wakeups(pid) - x0) / win.wall_s)
        idle["moto_wakeups_per_s"] = (wakeups(moto) - xm0) / win.wall_s
        with max_rss([pid, moto]) as rss_load:
            load = run_loadgen(base, 16, load_s, 1.0, {"server": pid, "sqs": moto}, "footprint")
        time.sleep(2.0)
        after = {"rss": proc_rss(pid), "moto_rss": proc_rss(moto)}
        load.update(rss_max=rss_load.get(pid, 0), moto_rss_max=rss_load.get(moto, 0))
        disk = sum(f.stat().st_size for f in (wd / "daemon" / "var").glob("outboxd.db*"))
        return {"idle": idle, "load": load, "after": after, "db_bytes": disk}
    finally:
        if daemon.running():
            daemon.terminate()


async def main_async() -> int:
    bench = Bench.parse("footprint", __doc__, {"--idle-s": {"type": float}})
    args = bench.args
    idle_s = args.idle_s or (15.0 if args.quick else 60.0)
    settle_s, load_s = (5.0, 5.0) if args.quick else (10.0, 15.0)
    bench.heading("Footprint")
    emit(
        f"embedded default (config.toml): idle {idle_s:g} s after {settle_s:g} s settling; "
        f"load {load_s:g} s at concurrency 16"
    )
    with workdir("footprint") as wd:
        r = await asyncio.to_thread(run, wd, idle_s, settle_s, load_s)
    i, ld, a = r["idle"], r["load"], r["after"]
    idle = [fmt.mib(i["rss"]), f"{i['cpu']:.2%}", f"{i['wakeups_per_s']:.1f}"]
    idle += [fmt.mib(i["moto_rss"]), f"{i['moto_cpu']:.2%}", "-", "-", "-"]
    load = [fmt.mib(ld["rss_max"]), fmt.pct(ld["cpu"]["server"]), "", fmt.mib(ld["moto_rss_max"])]
    load += [fmt.pct(ld["cpu"]["sqs"]), fmt.rate(ld["ok_rate"])]
    load += [fmt.ms(ld["p50_ms"]), fmt.ms(ld["p99_ms"])]
    head = ["phase", "daemon RSS MiB", "daemon CPU", "wakeups/s", "moto RSS MiB", "moto CPU"]
    emit(
        table(
            "Footprint (daemon process; its embedded moto child beside it)",
            [*head, "jobs/s", "p50 ms", "p99 ms"],
            [
                ["idle (end)", *idle],
                ["idle (max)", fmt.mib(i["rss_max"]), *[""] * 7],
                ["load c16 (max)", *load],
                ["after load", fmt.mib(a["rss"]), "", "", fmt.mib(a["moto_rss"]), *[""] * 4],
            ],
            f"CPU: share of one core. Machine busy during the idle window (everything, "
            f"other users too): {i['machine_busy']:.0%}. Loadgen CPU under load: "
            f"{ld['cpu']['loadgen']:.0%}. Database after the load: "
            f"{r['db_bytes'] / 2**20:.1f} MiB.",
        )
    )
    bench.save(results=r)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
