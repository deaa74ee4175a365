"""HTTP load generator: N keep-alive connections POSTing portal-link jobs, in its own process.

Standard library only (and bench.common), a hand-rolled HTTP/1.1 client on asyncio
streams: an aiohttp client spends more CPU per request than the server it measures
(docs/architecture.md#decisions-and-their-measurements), and on 2 cores that would cap the
number we report. Prints one JSON object:

    {"concurrency", "requests", "rate", "p50_ms", "p99_ms", "statuses",
     "cpu": {"loadgen": share of one core, "<watched>": ...}, "machine_busy": 0..1}

Only requests completed inside the measured window (after `--warmup`) count.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from urllib.parse import urlsplit

from bench.common import CpuWindow, percentile


class Window:
    def __init__(self) -> None:
        self.open = False
        self.closed = False
        self.latencies: list[float] = []
        self.statuses: dict[int, int] = {}


async def worker(
    host: str, port: int, path: str, prefix: str, win: Window, stop: asyncio.Event
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    head_tpl = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        "Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
        "Content-Length: {n}\r\n\r\n"
    )
    i = 0
    try:
        while not stop.is_set():
            i += 1
            body = (
                f'{{"portal":"suwon","username":"2020{i % 10000:04d}",'
                f'"password":"pw-{prefix}-{i}"}}'
            ).encode()
            req = head_tpl.format(key=f"{prefix}-{i}", n=len(body)).encode() + body
            t0 = time.perf_counter()
            writer.write(req)
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            lower = head.lower()
            at = lower.find(b"\r\ncontent-length:")
            if at < 0:
                raise RuntimeError("response without Content-Length")
            end = lower.find(b"\r\n", at + 2)
            n = int(lower[at + 17 : end])
            if n:
                await reader.readexactly(n)
            lat = time.perf_counter() - t0
            if win.open and not win.closed:
                win.latencies.append(lat)
                win.statuses[status] = win.statuses.get(status, 0) + 1
    finally:
        writer.close()


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    u = urlsplit(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    watched = {n: int(pid) for n, _, pid in (w.partition("=") for w in args.watch)}
    win = Window()
    stop = asyncio.Event()
    tasks = [
        asyncio.create_task(worker(host, port, u.path, f"{args.key_prefix}-c{c}", win, stop))
        for c in range(args.concurrency)
    ]
    await asyncio.sleep(args.warmup)
    cpu = CpuWindow({"loadgen": os.getpid(), **watched})
    cpu.start()
    win.open = True
    await asyncio.sleep(args.duration)
    win.closed = True
    cpu.stop()
    stop.set()
    done, pending = await asyncio.wait(tasks, timeout=30)
    for t in pending:
        t.cancel()
    errors = [repr(t.exception()) for t in done if not t.cancelled() and t.exception()]
    lat_ms = [x * 1000 for x in win.latencies]
    return {
        "concurrency": args.concurrency,
        "requests": len(lat_ms),
        "rate": len(lat_ms) / cpu.wall_s,
        "ok_rate": sum(v for s, v in win.statuses.items() if 200 <= s < 300) / cpu.wall_s,
        "p50_ms": percentile(lat_ms, 50),
        "p99_ms": percentile(lat_ms, 99),
        "statuses": {str(k): v for k, v in sorted(win.statuses.items())},
        "cpu": cpu.shares(),
        "machine_busy": cpu.machine_busy,
        "errors": errors[:3],
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT/v1/portal-link-jobs")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--duration", type=float, default=5.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--key-prefix", default=f"lg{os.getpid()}")
    p.add_argument("--watch", action="append", default=[], help="name=pid: report its CPU")
    args = p.parse_args()
    result = asyncio.run(main_async(args))
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
