"""Footprint: idle RSS and CPU of the daemon on the embedded default, what it sustains end to
end, and RSS under load.

The daemon runs as `outboxd serve` with the repository's config.toml (SQLite, embedded
SQS = moto as a child process, all roles, long polls of 20 s, the nightly prune
schedule), in a scratch folder, port 0, its portal the fake one (testkit) with the portal's
pace opened (`scrapers.suwon.min_interval_s = 0`, `max_concurrency = 4`, the consumer's) and
the login lock off (every job logs in as the one sample student). After it is ready and
has settled:

- idle: CPU (utime+stime from /proc/<pid>/stat) and RSS (VmRSS from /proc/<pid>/status)
  of the daemon, and of its moto child, over 60 s (`--quick`: 15 s); context switches
  per second show whether anything wakes up more often than its interval;
- end to end: 16 clients submit portal jobs for the sample student (each POST waiting for
  its 202) until `--e2e-jobs` are in; the jobs SUCCEEDED per second from the first POST
  until the last job SUCCEEDED (the consumer works through the backlog at its own pace:
  that pace is the figure), the p50 of one job's run (`job_started` → `job_succeeded`) and
  of a POST, and the CPU of the daemon and of its moto child meanwhile. With the default
  pace (0.2 s between portal requests, 12 requests a job) the portal allows about 0.4 jobs
  a second instead, whatever the daemon could do;
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

from testkit.daemon import PORTAL_MODULE, DaemonProcess, FakeProcess

from bench import fmt
from bench.common import (
    ROOT,
    Bench,
    CpuWindow,
    Results,
    emit,
    percentile,
    proc_rss,
    proc_status,
    run_loadgen,
    table,
    workdir,
)
from bench.e2e import _ts, ready
from bench.sqsreq import submit


def config_from_repo(portal: dict[str, Any] | None = None) -> dict[str, Any]:
    """config.toml on port 0; with `portal` (the fake's URLs), the pace opened and the login
    lock off (module docstring)."""
    import tomllib

    cfg: dict[str, Any] = tomllib.loads((ROOT / "config.toml").read_text())
    cfg.setdefault("server", {})["port"] = 0
    if portal is not None:
        scrapers = cfg.setdefault("scrapers", {})
        scrapers["suwon"] = {
            "portal_base_url": portal["portal_base_url"],
            "info_base_url": portal["info_base_url"],
            "min_interval_s": 0.0,
            "max_concurrency": 4,
            "max_auth_failures": 0,
            "max_auth_failures_total": 0,
        }
    return cfg


def end_to_end(daemon: DaemonProcess, base: str, moto: int, n: int) -> Results:
    """`n` portal jobs from 16 clients, until every one SUCCEEDED (module docstring)."""
    win = CpuWindow({"daemon": daemon.pid, "moto": moto})
    win.start()
    sent = asyncio.run(submit(base, n, 16, "footprint"))
    ids = {s["job_id"] for s in sent}
    deadline = time.monotonic() + 180
    at: dict[tuple[str, str], float] = {}
    while time.monotonic() < deadline:
        for e in daemon.events():
            if e.get("job_id") in ids and e.get("event") in ("job_started", "job_succeeded"):
                at.setdefault((str(e["event"]), str(e["job_id"])), _ts(e["timestamp"]))
        if sum(1 for ev, _ in at if ev == "job_succeeded") == n:
            break
        time.sleep(0.2)
    win.stop()
    done = [at[("job_succeeded", j)] for j in ids if ("job_succeeded", j) in at]
    runs = [
        (at[("job_succeeded", j)] - at[("job_started", j)]) * 1000
        for j in ids
        if ("job_succeeded", j) in at and ("job_started", j) in at
    ]
    first = min(s["sent"] for s in sent)
    return {
        "jobs": n,
        "succeeded": len(done),
        "rate": len(done) / (max(done) - first) if done else 0.0,
        "run_p50_ms": percentile(runs, 50),
        "post_p50_ms": percentile([(s["answered"] - s["sent"]) * 1000 for s in sent], 50),
        "cpu": win.pct("daemon"),
        "moto_cpu": win.pct("moto"),
    }


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


def run(wd: Path, idle_s: float, settle_s: float, load_s: float, e2e_jobs: int) -> Results:
    portal = FakeProcess(wd, PORTAL_MODULE)
    daemon = DaemonProcess(wd / "daemon", config_from_repo(portal.info), name="footprint")
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
        e2e = end_to_end(daemon, base, moto, e2e_jobs)
        with max_rss([pid, moto]) as rss_load:
            load = run_loadgen(base, 16, load_s, 1.0, {"server": pid, "sqs": moto}, "footprint")
        time.sleep(2.0)
        after = {"rss": proc_rss(pid), "moto_rss": proc_rss(moto)}
        load.update(rss_max=rss_load.get(pid, 0), moto_rss_max=rss_load.get(moto, 0))
        disk = sum(f.stat().st_size for f in (wd / "daemon" / "var").glob("outboxd.db*"))
        return {"idle": idle, "e2e": e2e, "load": load, "after": after, "db_bytes": disk}
    finally:
        if daemon.running():
            daemon.terminate()
        portal.stop()


async def main_async() -> int:
    options: dict[str, dict[str, Any]] = {"--idle-s": {"type": float}, "--e2e-jobs": {"type": int}}
    bench = Bench.parse("footprint", __doc__, options)
    args = bench.args
    idle_s = args.idle_s or (15.0 if args.quick else 60.0)
    e2e_jobs = args.e2e_jobs or (200 if args.quick else 600)
    settle_s, load_s = (5.0, 5.0) if args.quick else (10.0, 15.0)
    bench.heading("Footprint")
    emit(
        f"embedded default (config.toml, fake portal, its pace open): idle {idle_s:g} s after "
        f"{settle_s:g} s settling; end to end {e2e_jobs} jobs from 16 clients; load {load_s:g} s "
        "at concurrency 16"
    )
    with workdir("footprint") as wd:
        r = await asyncio.to_thread(run, wd, idle_s, settle_s, load_s, e2e_jobs)
    i, e, ld, a = r["idle"], r["e2e"], r["load"], r["after"]
    e2e = ["", fmt.pct(e["cpu"]), "", "", fmt.pct(e["moto_cpu"]), fmt.rate(e["rate"])]
    e2e += [fmt.ms(e["run_p50_ms"]), ""]
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
                [f"end to end c16 ({e['succeeded']}/{e['jobs']} SUCCEEDED)", *e2e],
                ["load c16 (max)", *load],
                ["after load", fmt.mib(a["rss"]), "", "", fmt.mib(a["moto_rss"]), *[""] * 4],
            ],
            "End to end: jobs SUCCEEDED per second (POST to the last success, the consumer "
            "working through the backlog), p50 the run of one job (job_started → job_succeeded; "
            f"a POST's p50 {fmt.ms(e['post_p50_ms'])} ms). "
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
