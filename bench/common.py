"""Shared helpers for the benchmarks: statistics, tables, processes, databases, machine facts.

Only the standard library at import time: the load generator and the peers' worker import
this module too, the latter inside .venv-peers where outboxd is not installed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import IO, Any

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
PY = sys.executable
PG_ADMIN_DSN = os.environ.get(
    "OUTBOXD_BENCH_PG_DSN",
    os.environ.get("OUTBOXD_TEST_PG_DSN", "postgresql://postgres@127.0.0.1:5432/test"),
)
CLK_TCK = os.sysconf("SC_CLK_TCK")
Results = dict[str, Any]
Table = tuple[str, Sequence[str], Sequence[tuple[Any, ...]]]  # name, columns, rows


# ---------------------------------------------------------------------------- numbers


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; NaN for no values (NaNs are left out)."""
    s = sorted(v for v in values if v is not None and not math.isnan(v))
    if not s:
        return math.nan
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def med(results: Sequence[Mapping[str, Any]], key: str) -> float:
    """The median of one field over trial results."""
    return median([r[key] for r in results if r.get(key) is not None])


def ratio(num: float, den: float) -> float:
    return num / den if den and not math.isnan(den) and not math.isnan(num) else math.nan


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> str:
    """A Markdown table: text left, numbers right."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]

    def line(r: Sequence[str]) -> str:
        numeric = [c[:1].isdigit() or (c[:1] in "-." and c[1:2].isdigit()) for c in r]
        out = [c.rjust(w) if n else c.ljust(w) for c, w, n in zip(r, widths, numeric, strict=True)]
        return "| " + " | ".join(out) + " |"

    text = [f"\n### {title}\n", line(list(headers)), "|" + "|".join("-" * (w + 2) for w in widths)]
    text[-1] += "|"
    text += [line(r) for r in cells]
    return "\n".join(text + (["", note] if note else []))


def emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------- machine


def machine_info() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "python": platform.python_version(),
    }


def machine_line() -> str:
    m = machine_info()
    la = " ".join(f"{x:.2f}" for x in m["loadavg"])
    return f"{m['date']}  cores={m['cores']}  loadavg={la}  python {m['python']}"


def proc_cpu_s(pid: int) -> float:
    """utime + stime of one process, in seconds (NaN if it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_status(pid: int, *keys: str) -> int:
    """The sum of some numeric fields of /proc/<pid>/status (0 if the process is gone)."""
    total = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.split(":")[0] in keys:
                total += int(line.split()[1])
    return total


def proc_rss(pid: int) -> int:
    return proc_status(pid, "VmRSS") * 1024


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(parts[:8]) - parts[3] - parts[4], sum(parts[:8])


@dataclass
class CpuWindow:
    """CPU used by some processes and by the whole machine between start() and stop()."""

    pids: Mapping[str, int]
    wall_s: float = 0.0
    cpu_s: dict[str, float] = field(default_factory=dict)
    machine_busy: float = math.nan
    _t0: float = 0.0
    _c0: dict[str, float] = field(default_factory=dict)
    _m0: tuple[int, int] = (0, 0)

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._c0 = {k: proc_cpu_s(p) for k, p in self.pids.items()}
        self._m0 = machine_jiffies()

    def stop(self) -> None:
        self.wall_s = time.perf_counter() - self._t0
        self.cpu_s = {k: proc_cpu_s(p) - self._c0[k] for k, p in self.pids.items()}
        b1, t1 = machine_jiffies()
        self.machine_busy = ratio(b1 - self._m0[0], t1 - self._m0[1])

    def pct(self, name: str) -> float:
        """CPU of one process as a share of one core."""
        return ratio(self.cpu_s.get(name, math.nan), self.wall_s)

    def shares(self) -> dict[str, float]:
        return {k: self.pct(k) for k in self.pids}


# ---------------------------------------------------------------------------- processes


@dataclass
class SqsEndpoint:
    url: str
    pid: int
    stop: Callable[[], None]


def sqs_servers(wd: Path, moto: bool) -> dict[str, SqsEndpoint]:
    """The instant SQS stub (bench/servers.py) and, unless told not to, moto."""
    from testkit.daemon import FakeProcess
    from testkit.moto import MotoServer

    stub = FakeProcess(wd, "bench.servers", "sqs-stub", name="sqs_stub", timeout_s=60)
    servers = {"stub": SqsEndpoint(stub.info["endpoint_url"], stub.pid, stub.stop)}
    if moto:
        server = MotoServer(wd / "moto.log", lenient_purge=True)
        servers["moto"] = SqsEndpoint(server.start(timeout_s=60), server.pid, server.stop)
    return servers


def stub_counts(endpoint_url: str) -> tuple[int, int]:
    """The SQS stub's messages taken and send requests answered so far (bench/servers.py)."""
    import urllib.request

    url = endpoint_url + "/stub/counts"
    with urllib.request.urlopen(url, timeout=10) as resp:  # noqa: S310 (loopback http only)
        counts = json.loads(resp.read())
    return int(counts["sent"]), int(counts["calls"])


def purge_queue(endpoint_url: str, queue_url: str) -> None:
    """Empty a queue: moto's sends slow down as unreceived messages pile up (O(n) scans)."""
    import boto3

    client = boto3.client(
        "sqs",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    try:
        client.purge_queue(QueueUrl=queue_url)
    finally:
        client.close()


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"outboxd-bench-{prefix}-"))
    try:
        yield path
    finally:
        if not os.environ.get("OUTBOXD_BENCH_KEEP"):
            subprocess.run(["rm", "-rf", str(path)], check=False)


def run_loadgen(
    url: str,
    concurrency: int,
    dur: float,
    warm: float,
    pids: Mapping[str, int],
    tag: str,
    rate: float | None = None,
) -> Results:
    """One load run of POST /v1/portal-link-jobs from a separate process (bench/loadgen.py):
    `concurrency` connections in a closed loop, or requests due at `rate` per second."""
    argv = [PY, "-m", "bench.loadgen", "--url", url + "/v1/portal-link-jobs"]
    if rate is None:
        argv += ["--concurrency", str(concurrency)]
    else:
        argv += ["--rate", f"{rate:.1f}"]
    argv += ["--duration", str(dur), "--warmup", str(warm)]
    argv += ["--key-prefix", f"{tag}-{uuid.uuid4().hex[:8]}"]
    for name, pid in pids.items():
        argv += ["--watch", f"{name}={pid}"]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=dur + warm + 120, check=False, cwd=ROOT
    )
    if out.returncode != 0:
        raise RuntimeError(f"loadgen failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: Results = json.loads(out.stdout)
    return result


# ---------------------------------------------------------------------------- databases


async def _pg_admin(sql: str) -> str:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=10)
    try:
        return str(await conn.fetchval(sql) if sql.startswith("SHOW") else await conn.execute(sql))
    finally:
        await conn.close()


async def pg_create(tag: str) -> tuple[str, str]:
    """A fresh database of our own, outboxd_bench_<tag>_<pid>_<hex>: (name, dsn)."""
    name = f"outboxd_bench_{tag}_{os.getpid()}_{uuid.uuid4().hex[:4]}"
    await _pg_admin(f'CREATE DATABASE "{name}"')
    return name, f"{PG_ADMIN_DSN.rpartition('/')[0]}/{name}"


async def pg_drop(name: str) -> None:
    if not name.startswith("outboxd_bench_"):
        raise ValueError(f"refusing to drop {name}: not a benchmark database")
    await _pg_admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


async def pg_version() -> str | None:
    """The server's version, or None when Postgres is unreachable."""
    try:
        return await _pg_admin("SHOW server_version")
    except Exception as exc:
        emit(f"(postgres unreachable at {PG_ADMIN_DSN}: {type(exc).__name__}: {exc})")
        return None


@contextlib.asynccontextmanager
async def database(backend: str, tag: str, wd: Path) -> AsyncIterator[str]:
    """The URL of a fresh database of the backend, dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{wd / tag}.db"
        return
    name, dsn = await pg_create(tag)
    try:
        yield dsn
    finally:
        await pg_drop(name)


async def write_raw(backend: str, url: str, tables: Sequence[Table] = (), sql: str = "") -> None:
    """Bench-only writes past the store: rows loaded in bulk (COPY on Postgres, one
    executemany transaction on SQLite), then `sql` if given, then ANALYZE."""
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            for name, cols, rows in tables:
                await conn.copy_records_to_table(name, records=rows, columns=list(cols))
            await conn.execute(f"{sql}; ANALYZE" if sql else "ANALYZE")
        finally:
            await conn.close()
        return
    path = url.removeprefix("sqlite:///")
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as db:
        db.execute("PRAGMA synchronous=OFF")  # this loader only; the store keeps FULL
        db.execute("BEGIN IMMEDIATE")
        for name, cols, rows in tables:
            marks = ",".join("?" * len(cols))
            db.executemany(f"INSERT INTO {name} ({','.join(cols)}) VALUES ({marks})", rows)
        if sql:
            db.execute(sql)
        db.execute("COMMIT")
        db.execute("ANALYZE")


async def open_migrated_store(url: str, wd: Path, pool_size: int = 16) -> Any:
    from outboxd.storage.store import open_store

    store = await open_store(url, wd, pool_size, 10.0)
    await store.db.migrate()
    return store


def quiet_logging(path: Path | None = None) -> IO[str]:
    """The daemon's JSON logging, rendered as in production but written to a file."""
    from outboxd.observability import configure_logging

    sink = (path or Path(os.devnull)).open("a", encoding="utf-8")
    configure_logging("info", "json", stream=sink)
    return sink


# ---------------------------------------------------------------------------- CLI and results


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="a few-minute version")
    p.add_argument("--json-out", type=Path, help="write the results here as JSON")
    p.add_argument("--backends", default="sqlite,postgres", help="sqlite,postgres (default both)")
    return p


async def backends_arg(text: str) -> list[str]:
    wanted = [b.strip() for b in text.split(",") if b.strip()]
    if set(wanted) - {"sqlite", "postgres"}:
        raise SystemExit(f"unknown backend(s) in {text!r}")
    if "postgres" in wanted and await pg_version() is None:
        wanted.remove("postgres")
    return wanted


def save(path: Path | None, data: Mapping[str, Any]) -> None:
    """The JSON that bench/run_all.py reads back for the summary and the goals."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"machine": machine_info(), **data}, indent=1, default=str))


@dataclass(frozen=True)
class Bench:
    """One benchmark's run, as every bench/<name>.py starts and ends it: base_parser's
    options and its own, the heading of its report, and the JSON run_all reads back."""

    name: str
    args: argparse.Namespace

    @classmethod
    def parse(
        cls, name: str, doc: str | None, options: Mapping[str, Mapping[str, Any]] | None = None
    ) -> Bench:
        """`options`: the benchmark's own, flag -> add_argument's keyword arguments."""
        p = base_parser(doc or "")
        for flag, kwargs in (options or {}).items():
            p.add_argument(flag, **kwargs)
        return cls(name, p.parse_args())

    async def backends(self) -> list[str]:
        """The backends --backends names, Postgres left out when it cannot be reached."""
        return await backends_arg(self.args.backends)

    def heading(self, title: str) -> None:
        emit(f"\n## {title}  ({machine_line()})")

    def save(self, **data: Any) -> None:
        save(self.args.json_out, {"bench": self.name, "quick": self.args.quick, **data})
