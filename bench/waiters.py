"""Held requests: 10,000 clients waiting on one job instead of polling it.

Per backend, the daemon (`outboxd serve`, roles api and relay, the instant SQS stub) takes
one portal job (RUNNING: on the queue, no consumer), then a client process opens
10,000 connections that each send `GET /v1/jobs/{id}` with `Prefer: wait=120` and the
job's ETag in `If-None-Match`. With every request held: the daemon's RSS against before,
and /healthz answered one after another (its p99). Then the job is cancelled, which
changes its body, and the client reports when each held request was answered: the time
from the cancel to the last answer, and that every answer was a 200.

    python -m bench.waiters [--quick] [--backends sqlite,postgres] [--json-out F]
    python -m bench.waiters --client URL --etag E --count N    (the client process)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from testkit.daemon import DaemonProcess, FakeProcess

from bench import fmt
from bench.common import (
    PY,
    ROOT,
    Bench,
    Results,
    database,
    emit,
    percentile,
    proc_rss,
    table,
    workdir,
)
from outboxd.security import generate_key

WAIT_S = 120
CONNECT_WAVE = 500  # connections opened at once: the listen backlog is finite


# ---------------------------------------------------------------------------- the client


async def hold(url: str, etag: str, count: int) -> None:
    u = urlsplit(url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    request = (
        f"GET {u.path} HTTP/1.1\r\nHost: {host}:{port}\r\nPrefer: wait={WAIT_S}\r\n"
        f"If-None-Match: {etag}\r\n\r\n"
    ).encode()
    answered: list[tuple[float, int]] = []

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            answered.append((time.time(), int(head[9:12])))
        finally:
            writer.close()

    tasks = []
    for start in range(0, count, CONNECT_WAVE):
        conns = await asyncio.gather(
            *(asyncio.open_connection(host, port) for _ in range(min(CONNECT_WAVE, count - start)))
        )
        for reader, writer in conns:
            writer.write(request)
            tasks.append(asyncio.create_task(one(reader, writer)))
    sys.stdout.write(json.dumps({"held": len(tasks)}) + "\n")
    sys.stdout.flush()
    await asyncio.wait(tasks, timeout=WAIT_S + 30)
    statuses: dict[str, int] = {}
    for _, status in answered:
        statuses[str(status)] = statuses.get(str(status), 0) + 1
    last = max((at for at, _ in answered), default=None)
    sys.stdout.write(json.dumps({"answered": len(answered), "last_at": last, "statuses": statuses}))
    sys.stdout.write("\n")


# ---------------------------------------------------------------------------- the run


def call(method: str, url: str, body: dict[str, Any] | None = None, **headers: str) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers)  # noqa: S310
    if data is not None:
        req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=30) as resp:  # noqa: S310 (loopback http only)
        return resp.headers, json.loads(resp.read() or b"{}")


def healthz_p99(base: str, n: int) -> float:
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        call("GET", base + "/healthz")
        lat.append((time.perf_counter() - t0) * 1000)
    return percentile(lat, 99)


async def run_backend(backend: str, wd: Path, stub_url: str, count: int) -> Results:
    async with database(backend, "waiters", wd) as db:
        tag = wd.name[-8:].replace("-", "")
        config = {
            # Held requests may take three quarters of the connections; all are one user's.
            "server": {"host": "127.0.0.1", "port": 0, "max_connections": count * 4 // 3 + 200},
            "api": {"max_waiters": count, "max_waiters_per_user": count, "max_wait_s": WAIT_S},
            "storage": {"url": db},
            "sqs": {
                "endpoint_url": stub_url,
                "jobs_queue": f"w{tag}-jobs",
                "tasks_queue": f"w{tag}-tasks.fifo",
            },
            "daemon": {"roles": ["api", "relay"], "shutdown_timeout_s": 5},
            "logging": {"level": "warning"},
        }
        env = {
            "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench",
            "AWS_DEFAULT_REGION": "us-east-1",
            "OUTBOXD_SECRET_KEYS": generate_key(),
        }
        daemon = DaemonProcess(wd / backend, config, env=env, name=f"waiters-{backend}")
        base = daemon.start(timeout_s=60)
        try:
            body = {"portal": "suwon", "username": "20201234", "password": "bench-pw"}
            _, job = call("POST", base + "/v1/portal-link-jobs", body, **{"Idempotency-Key": "w-1"})
            url = f"{base}/v1/jobs/{job['jobId']}"
            headers, _ = call("GET", url)
            etag = headers["ETag"]
            rss_before = proc_rss(daemon.pid)
            client = subprocess.Popen(
                [PY, "-m", "bench.waiters", "--client", url, "--etag", etag, "--count", str(count)],
                cwd=ROOT,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert client.stdout is not None
            held = json.loads(client.stdout.readline())["held"]
            await asyncio.sleep(1.0)  # the last requests of the last wave reach the handler
            rss_held = proc_rss(daemon.pid)
            health = await asyncio.to_thread(healthz_p99, base, 200)
            changed_at = time.time()
            call("POST", url + "/cancel", {})
            out, _ = await asyncio.to_thread(client.communicate, timeout=WAIT_S + 60)
            answers = json.loads(out.strip().splitlines()[-1])
        finally:
            daemon.terminate()
    last = answers["last_at"]
    return {
        "held": held,
        "rss_before": rss_before,
        "rss_held": rss_held,
        "healthz_p99_ms": health,
        "answered": answers["answered"],
        "statuses": answers["statuses"],
        "all_answered_s": None if last is None else last - changed_at,
    }


async def main_async(bench: Bench) -> int:
    backends = await bench.backends()
    count = 10_000
    bench.heading("Held requests")
    results: Results = {}
    with workdir("waiters") as wd:
        stub = FakeProcess(wd, "bench.servers", "sqs-stub", name="sqs_stub", timeout_s=60)
        try:
            for backend in backends:
                results[backend] = await run_backend(backend, wd, stub.info["endpoint_url"], count)
        finally:
            stub.stop()
    rows = []
    for backend, r in results.items():
        grew = r["rss_held"] - r["rss_before"]
        done = "never" if r["all_answered_s"] is None else f"{r['all_answered_s']:.2f} s"
        rows.append([backend, str(r["held"]), fmt.mib(r["rss_before"]), fmt.mib(r["rss_held"])])
        rows[-1] += [fmt.mib(grew), fmt.ms(r["healthz_p99_ms"]), str(r["statuses"]), done]
    head = ["backend", "held", "RSS before MiB", "RSS held MiB", "growth MiB"]
    head += ["/healthz p99 ms", "answers", "all answered after the change"]
    emit(table("Held requests on one job (Prefer: wait)", head, rows))
    bench.save(results=results)
    return 0


def main() -> int:
    if "--client" in sys.argv:
        p = argparse.ArgumentParser()
        p.add_argument("--client", required=True)
        p.add_argument("--etag", required=True)
        p.add_argument("--count", type=int, required=True)
        a = p.parse_args()
        asyncio.run(hold(a.client, a.etag, a.count))
        return 0
    return asyncio.run(main_async(Bench.parse("waiters", __doc__)))


if __name__ == "__main__":
    raise SystemExit(main())
