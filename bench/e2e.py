"""End to end: job accepted → handler started, through the real daemon.

The daemon runs as a subprocess (`outboxd serve`, all roles, embedded SQS = moto as its
child), with the fake Suwon portal (started through testkit) answering at once and
`scrapers.suwon.min_interval_s = 0`. Jobs are POSTed one at a time, spaced so the
consumer is never the queue; the latency is read from the daemon's own log lines:
`job_accepted` (API, after commit) → `job_started` (consumer, after the job row is
leased), and `job_started` → `job_succeeded` for the whole handler.

    python -m bench.e2e [--quick] [--backends sqlite,postgres] [--json-out F]
"""

from __future__ import annotations

import asyncio
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from testkit.daemon import PORTAL_MODULE, SAMPLE_PASSWORD, SAMPLE_SNO, DaemonProcess, FakeProcess

from bench import fmt
from bench.common import (
    Bench,
    Results,
    database,
    emit,
    percentile,
    proc_cpu_s,
    table,
    workdir,
)

EVENTS = ("job_accepted", "job_started", "job_succeeded")
INTERVALS = {
    "http_ms": ("POST → 202 (client)", "sent", "answered"),
    "accepted_to_started": ("job_accepted → job_started", "job_accepted", "job_started"),
    "post_to_started": ("POST sent → job_started", "sent", "job_started"),
    "started_to_succeeded": ("job_started → job_succeeded", "job_started", "job_succeeded"),
}


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def submit(base_url: str, n: int, spacing_s: float, tag: str) -> list[dict[str, Any]]:
    out = []
    async with aiohttp.ClientSession() as http:
        for i in range(n):
            t0 = time.time()
            async with http.post(
                f"{base_url}/v1/portal-link-jobs",
                json={"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD},
                headers={"Idempotency-Key": f"e2e-{tag}-{i}"},
            ) as resp:
                body = await resp.json()
                if resp.status != 202:
                    raise RuntimeError(f"POST answered {resp.status}: {body}")
            dispatch = (body.get("dispatch") or {}).get("status")
            out.append({"job_id": body["jobId"], "sent": t0, "answered": time.time()})
            out[-1]["dispatch"] = dispatch
            await asyncio.sleep(max(0.0, spacing_s - (time.time() - t0)))
    return out


def ready(daemon: DaemonProcess) -> str:
    """Start the daemon and wait for `daemon_ready` (every role up): its base URL."""
    base = daemon.start(timeout_s=90)
    deadline = time.monotonic() + 60
    while not any(e.get("event") == "daemon_ready" for e in daemon.events()):
        if time.monotonic() > deadline:
            raise RuntimeError("daemon never logged daemon_ready")
        time.sleep(0.1)
    return base


def run_one(backend: str, url: str, wd: Path, n: int, spacing: float) -> Results:
    from outboxd.security import generate_key

    portal = FakeProcess(wd, PORTAL_MODULE)
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": url if backend == "postgres" else "sqlite:///var/outboxd.db"},
        "sqs": {"endpoint_url": "embedded"},
        "scrapers": {
            "suwon": {
                "portal_base_url": portal.info["portal_base_url"],
                "info_base_url": portal.info["info_base_url"],
                "min_interval_s": 0.0,
            }
        },
        "logging": {"level": "info", "format": "json"},
    }
    env = {"OUTBOXD_SECRET_KEYS": generate_key()} if backend == "postgres" else {}
    daemon = DaemonProcess(wd / backend, config, env=env, name=f"e2e-{backend}")
    try:
        base = ready(daemon)
        time.sleep(1.0)
        cpu0 = proc_cpu_s(daemon.pid)
        t0 = time.perf_counter()
        sent = asyncio.run(submit(base, n, spacing, backend))
        ids = {s["job_id"] for s in sent}
        deadline = time.monotonic() + 60
        while True:
            events = daemon.events()
            done = {e.get("job_id") for e in events if e.get("event") == "job_succeeded"}
            if ids <= done or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        wall = time.perf_counter() - t0
        cpu = (proc_cpu_s(daemon.pid) - cpu0) / wall
    finally:
        if daemon.running():
            daemon.terminate()
        portal.stop()
    first: dict[tuple[str, str], float] = {}
    for e in events:
        key = (str(e.get("event")), str(e.get("job_id")))
        if e.get("job_id") in ids and key not in first and "timestamp" in e:
            first[key] = _ts(e["timestamp"])
    out: Results = {key: [] for key in INTERVALS}
    for s in sent:
        at = {**s, **{ev: first.get((ev, s["job_id"])) for ev in EVENTS}}
        for name, (_label, a, b) in INTERVALS.items():
            if at[a] is not None and at[b] is not None:
                out[name].append((at[b] - at[a]) * 1000)
    dispatched = sum(1 for s in sent if s["dispatch"] == "SENT")
    return {**out, "jobs": n, "dispatched_sent": dispatched, "daemon_cpu": cpu}


async def main_async() -> int:
    bench = Bench.parse("e2e", __doc__)
    args = bench.args
    backends = await bench.backends()
    n, spacing = (30, 0.2) if args.quick else (200, 0.2)
    bench.heading("End to end")
    emit(
        f"{n} jobs per backend, one every {spacing:g} s; daemon with all roles, embedded moto, "
        "fake portal answering at once"
    )
    results: dict[str, Any] = {}
    with workdir("e2e") as wd:
        for backend in backends:
            async with database(backend, "e2e", wd) as url:
                results[backend] = await asyncio.to_thread(run_one, backend, url, wd, n, spacing)
    rows = []
    for backend, r in results.items():
        for key, (label, _a, _b) in INTERVALS.items():
            xs = r[key]
            ps = (fmt.ms(percentile(xs, q)) for q in (50, 99, 100))
            rows.append([backend, label, len(xs), *ps])
    emit(
        table(
            "Job accepted → handler started (ms)",
            ["backend", "interval", "jobs", "p50", "p99", "max"],
            rows,
            "Timestamps from the daemon's own JSON log lines (one clock); 202s answered "
            "with dispatch SENT: "
            + ", ".join(f"{b} {r['dispatched_sent']}/{r['jobs']}" for b, r in results.items())
            + "; daemon CPU while submitting: "
            + ", ".join(f"{b} {r['daemon_cpu']:.0%}" for b, r in results.items()),
        )
    )
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
