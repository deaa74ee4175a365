"""HTTP load generator: keep-alive connections POSTing portal-link jobs, in its own process.

Closed loop (`--concurrency N`): N connections, each sending its next request when the last
is answered: the server's capacity at that concurrency. Open loop (`--rate R`): requests
are due at a fixed rate whatever the answers do, as independent clients arrive; each one's
latency runs from the moment it was due, so time spent waiting for a free connection (a
server falling behind) counts, and a slow server cannot slow the offered load down.

Standard library only (and bench.common), a hand-rolled HTTP/1.1 client on asyncio
streams: an aiohttp client spends more CPU per request than the server it measures
(docs/architecture.md#decisions-and-their-measurements), and on 2 cores that would cap the
number we report. Prints one JSON object:

    {"concurrency", "requests", "rate", "p50_ms", "p99_ms", "statuses",
     "cpu": {"loadgen": share of one core, "<watched>": ...}, "machine_busy": 0..1}

(open loop adds "offered_rate", "max_ms", "late" and "connections").

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


def request_bytes(host: str, port: int, path: str, key: str, i: int) -> bytes:
    body = (f'{{"portal":"suwon","username":"2020{i % 10000:04d}","password":"pw-{key}"}}').encode()
    head = (
        f"POST {path} HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nIdempotency-Key: {key}\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, req: bytes) -> int:
    """Send one request and read its whole answer; the status."""
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
    return status


async def worker(
    host: str, port: int, path: str, prefix: str, win: Window, stop: asyncio.Event
) -> None:
    reader, writer = await asyncio.open_connection(host, port)
    i = 0
    try:
        while not stop.is_set():
            i += 1
            req = request_bytes(host, port, path, f"{prefix}-{i}", i)
            t0 = time.perf_counter()
            status = await exchange(reader, writer, req)
            lat = time.perf_counter() - t0
            if win.open and not win.closed:
                win.latencies.append(lat)
                win.statuses[status] = win.statuses.get(status, 0) + 1
    finally:
        writer.close()


Conn = tuple[asyncio.StreamReader, asyncio.StreamWriter]


async def open_loop(args: argparse.Namespace, host: str, port: int, path: str) -> dict[str, object]:
    """Requests due every 1/rate seconds for warmup + duration; each on an idle connection, or a
    new one (up to --max-connections), or the first to free up. Latency from the due time."""
    watched = {n: int(pid) for n, _, pid in (w.partition("=") for w in args.watch)}
    loop = asyncio.get_running_loop()
    idle: asyncio.Queue[Conn] = asyncio.Queue()
    opened = 0
    win = Window()
    late = 0
    tasks: set[asyncio.Task[None]] = set()
    start = loop.time() + 0.1
    measure_from = start + args.warmup
    measure_to = measure_from + args.duration
    # The schedule's end on the wall clock, for a caller watching what the server does after it.
    end_at = time.time() + (measure_to - loop.time())

    async def connection() -> Conn:
        nonlocal opened
        if not idle.empty():
            return idle.get_nowait()
        if opened < args.max_connections:
            opened += 1
            return await asyncio.open_connection(host, port)
        return await idle.get()

    async def one(i: int, due: float) -> None:
        conn = await connection()
        status = await exchange(*conn, request_bytes(host, port, path, f"{args.key_prefix}-{i}", i))
        done = loop.time()
        idle.put_nowait(conn)
        if measure_from <= due < measure_to:
            win.latencies.append(done - due)
            win.statuses[status] = win.statuses.get(status, 0) + 1

    cpu = CpuWindow({"loadgen": os.getpid(), **watched})
    total = int((args.warmup + args.duration) * args.rate)
    for i in range(total):
        due = start + i / args.rate
        wait = due - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        elif wait < -0.005:
            late += 1  # this process could not keep up with the schedule
        if i == int(args.warmup * args.rate):
            cpu.start()
        task = asyncio.create_task(one(i, due))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    cpu.stop()
    result = await finish(set(tasks), win, cpu, args.duration)
    while not idle.empty():
        idle.get_nowait()[1].close()
    extra = {"max_ms": max(win.latencies, default=0.0) * 1000, "late": late, "end_at": end_at}
    return {"offered_rate": args.rate, **result, **extra, "connections": opened}


async def finish(
    tasks: set[asyncio.Task[None]], win: Window, cpu: CpuWindow, wall_s: float
) -> dict[str, object]:
    """Wait for the requests still out, then the figures of the measured window."""
    done, pending = await asyncio.wait(tasks, timeout=30) if tasks else (set(), set())
    for t in pending:
        t.cancel()
    errors = [repr(t.exception()) for t in done if not t.cancelled() and t.exception()]
    lat_ms = [x * 1000 for x in win.latencies]
    return {
        "requests": len(lat_ms),
        "rate": len(lat_ms) / wall_s,
        "ok_rate": sum(v for s, v in win.statuses.items() if 200 <= s < 300) / wall_s,
        "p50_ms": percentile(lat_ms, 50),
        "p99_ms": percentile(lat_ms, 99),
        "statuses": {str(k): v for k, v in sorted(win.statuses.items())},
        "cpu": cpu.shares(),
        "machine_busy": cpu.machine_busy,
        "errors": errors[:3],
    }


async def main_async(args: argparse.Namespace) -> dict[str, object]:
    u = urlsplit(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    if args.rate:
        return await open_loop(args, host, port, u.path)
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
    return {"concurrency": args.concurrency, **await finish(set(tasks), win, cpu, cpu.wall_s)}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--url", required=True, help="http://127.0.0.1:PORT/v1/portal-link-jobs")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--rate", type=float, help="open loop: requests per second, due on a schedule")
    p.add_argument("--max-connections", type=int, default=256, help="open loop: connection cap")
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
