"""End to end: job accepted → handler started, through the real daemon.

The daemon runs as a subprocess (`outboxd serve`, all roles, embedded SQS = moto as its
child), with the fake Suwon portal (tests/fakes/portal.py) answering at once and
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

from bench.common import (
    backends_arg,
    base_parser,
    emit,
    f_ms,
    machine_line,
    percentile,
    pg_create,
    pg_drop,
    proc_cpu_s,
    save,
    table,
    workdir,
)


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def submit(base_url: str, n: int, spacing_s: float, tag: str) -> list[dict[str, Any]]:
    from tests.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

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
            out.append(
                {
                    "job_id": body["jobId"],
                    "sent": t0,
                    "answered": time.time(),
                    "dispatch": (body.get("dispatch") or {}).get("status"),
                }
            )
            await asyncio.sleep(max(0.0, spacing_s - (time.time() - t0)))
    return out


def run_one(backend: str, dsn: str | None, wd: Path, n: int, spacing: float) -> dict[str, Any]:
    from tests.support.daemon import DaemonProcess, FakeProcess

    from outboxd.security import generate_key

    portal = FakeProcess(wd, "tests.fakes.portal")
    config: dict[str, Any] = {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": dsn or "sqlite:///var/outboxd.db"},
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
    env = {"OUTBOXD_SECRET_KEYS": generate_key()} if dsn else {}
    daemon = DaemonProcess(wd / backend, config, env=env, name=f"e2e-{backend}")
    try:
        base = daemon.start(timeout_s=90)
        deadline = time.monotonic() + 60
        while not any(e.get("event") == "daemon_ready" for e in daemon.events()):
            if time.monotonic() > deadline:
                raise RuntimeError("daemon never logged daemon_ready")
            time.sleep(0.1)
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
    acc_start, start_done, http_ms, post_to_start = [], [], [], []
    for s in sent:
        j = s["job_id"]
        acc, st, ok = (first.get((k, j)) for k in ("job_accepted", "job_started", "job_succeeded"))
        http_ms.append((s["answered"] - s["sent"]) * 1000)
        if acc is not None and st is not None:
            acc_start.append((st - acc) * 1000)
            post_to_start.append((st - s["sent"]) * 1000)
        if st is not None and ok is not None:
            start_done.append((ok - st) * 1000)
    return {
        "jobs": n,
        "started": len(acc_start),
        "succeeded": len(start_done),
        "dispatched_sent": sum(1 for s in sent if s["dispatch"] == "SENT"),
        "accepted_to_started": acc_start,
        "started_to_succeeded": start_done,
        "http_ms": http_ms,
        "post_to_started": post_to_start,
        "daemon_cpu": cpu,
    }


async def main_async() -> int:
    p = base_parser(__doc__ or "")
    args = p.parse_args()
    backends = await backends_arg(args.backends)
    n, spacing = (30, 0.2) if args.quick else (200, 0.2)
    emit(f"\n## End to end  ({machine_line()})")
    emit(
        f"{n} jobs per backend, one every {spacing:g} s; daemon with all roles, embedded moto, "
        "fake portal answering at once"
    )
    results: dict[str, Any] = {}
    with workdir("e2e") as wd:
        for backend in backends:
            dsn = name = None
            if backend == "postgres":
                name, dsn = await pg_create("e2e")
            try:
                results[backend] = await asyncio.to_thread(run_one, backend, dsn, wd, n, spacing)
            finally:
                if name:
                    await pg_drop(name)
    rows = []
    for backend, r in results.items():
        for label, key in (
            ("POST → 202 (client)", "http_ms"),
            ("job_accepted → job_started", "accepted_to_started"),
            ("POST sent → job_started", "post_to_started"),
            ("job_started → job_succeeded", "started_to_succeeded"),
        ):
            xs = r[key]
            rows.append(
                [
                    backend,
                    label,
                    len(xs),
                    f_ms(percentile(xs, 50)),
                    f_ms(percentile(xs, 99)),
                    f_ms(max(xs) if xs else float("nan")),
                ]
            )
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
    save(args.json_out, {"bench": "e2e", "quick": args.quick, "results": results, "goals": []})
    return 0


def main() -> int:
    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
