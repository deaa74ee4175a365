"""Shared helpers for the benchmarks: statistics, tables, processes, databases, machine facts.

Everything here runs in the project's virtualenv. The load generator (`loadgen.py`) and the
peers' worker (`peers_worker.py`) import nothing from here: they run as separate processes,
the latter in another virtualenv.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
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
PAGE = os.sysconf("SC_PAGE_SIZE")


# ---------------------------------------------------------------------------- statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Linear interpolation between closest ranks; NaN for no values."""
    if not values:
        return math.nan
    s = sorted(values)
    if len(s) == 1:
        return s[0]
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def median(values: Sequence[float]) -> float:
    return percentile(values, 50)


def ratio(num: float, den: float) -> float:
    return num / den if den and not math.isnan(den) and not math.isnan(num) else math.nan


# ---------------------------------------------------------------------------- formatting


def f_rate(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x:,.0f}"


def f_ms(x: float) -> str:
    if x is None or math.isnan(x):
        return "-"
    return f"{x:.2f}" if x < 100 else f"{x:,.0f}"


def f_pct(x: float) -> str:
    return "-" if x is None or math.isnan(x) else f"{x * 100:.0f}%"


def f_mib(n: float) -> str:
    return "-" if n is None or math.isnan(n) else f"{n / 2**20:.1f}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("PASS" if ok else "MISS")


def table(title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]], note: str = "") -> str:
    cells = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in cells:
        for i, c in enumerate(r):
            widths[i] = max(widths[i], len(c))

    def line(r: Sequence[str]) -> str:
        out = []
        for i, c in enumerate(r):
            # Text left, numbers right.
            numeric = c[:1].isdigit() or (c[:1] in "-." and c[1:2].isdigit())
            out.append(c.rjust(widths[i]) if numeric else c.ljust(widths[i]))
        return "| " + " | ".join(out) + " |"

    text = [
        f"\n### {title}\n",
        line(list(headers)),
        "|" + "|".join("-" * (w + 2) for w in widths) + "|",
    ]
    text += [line(r) for r in cells]
    if note:
        text.append("")
        text.append(note)
    return "\n".join(text)


def emit(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


# ---------------------------------------------------------------------------- machine


def loadavg() -> tuple[float, float, float]:
    return os.getloadavg()


def machine_info() -> dict[str, Any]:
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "cores": os.cpu_count(),
        "loadavg": [round(x, 2) for x in loadavg()],
        "python": platform.python_version(),
        "kernel": platform.release(),
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


def proc_rss(pid: int) -> int:
    """VmRSS in bytes (0 if the process is gone)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def proc_ctx_switches(pid: int) -> int:
    total = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches")):
                total += int(line.split()[1])
    return total


def children_of(pid: int) -> list[int]:
    out: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out += [int(x) for x in (task / "children").read_text().split()]
    return out


def machine_jiffies() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot, from /proc/stat."""
    parts = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = parts[3] + (parts[4] if len(parts) > 4 else 0)
    total = sum(parts[:8])
    return total - idle, total


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
        busy, total = b1 - self._m0[0], t1 - self._m0[1]
        self.machine_busy = busy / total if total else math.nan

    def pct(self, name: str) -> float:
        """CPU of one process as a share of one core."""
        return self.cpu_s.get(name, math.nan) / self.wall_s if self.wall_s else math.nan


# ---------------------------------------------------------------------------- processes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Child:
    """A subprocess that announces readiness by writing a JSON port file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        workdir: Path,
        env: Mapping[str, str] | None = None,
        timeout_s: float = 60.0,
    ) -> None:
        self.name = name
        self.port_file = workdir / f"{name}.port.json"
        self.port_file.unlink(missing_ok=True)
        self.log_path = workdir / f"{name}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")}
        full_env.update(env or {})
        full_env.setdefault("PYTHONPATH", str(ROOT))
        with self.log_path.open("ab") as sink:
            self.proc = subprocess.Popen(
                [*argv, "--port-file", str(self.port_file)],
                stdout=sink,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                cwd=ROOT,
                env=full_env,
            )
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                tail = self.log_path.read_text("utf-8", "replace")[-3000:]
                self.stop()
                raise RuntimeError(f"{name} did not start:\n{tail}")
            time.sleep(0.05)
        self.info: dict[str, Any] = json.loads(self.port_file.read_text())

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


class MotoChild:
    """moto's SQS server as a child process (as the tests and the embedded default run it)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.log_path = workdir / "moto.log"
        # PurgeQueue between points (see purge_queue) without moto's 60 s rule.
        env = {**os.environ, "MOTO_SQS_ENFORCE_STRICT_QUEUE_PURGE_BEHAVIOUR": "false"}
        with self.log_path.open("ab") as sink:
            self.proc = subprocess.Popen(
                [PY, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                stdout=sink,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                env=env,
            )
        import urllib.request

        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"moto did not start; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"{self.endpoint_url}/moto-api/", timeout=1):  # noqa: S310
                    break
            except OSError:
                time.sleep(0.1)

    @property
    def endpoint_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


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


class StubChild(Child):
    def __init__(self, workdir: Path) -> None:
        super().__init__("sqs_stub", [PY, "-m", "bench.sqs_stub"], workdir)

    @property
    def endpoint_url(self) -> str:
        return str(self.info["endpoint_url"])


@contextlib.contextmanager
def workdir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=f"outboxd-bench-{prefix}-"))
    try:
        yield path
    finally:
        if not os.environ.get("OUTBOXD_BENCH_KEEP"):
            subprocess.run(["rm", "-rf", str(path)], check=False)


def run_loadgen(
    base_url: str,
    *,
    path: str,
    concurrency: int,
    duration_s: float,
    warmup_s: float,
    server_pids: Mapping[str, int],
    tag: str,
) -> dict[str, Any]:
    """One load run from a separate process; its JSON (rate, latencies, CPU of everything)."""
    argv = [
        PY,
        str(BENCH / "loadgen.py"),
        "--url",
        base_url + path,
        "--concurrency",
        str(concurrency),
        "--duration",
        str(duration_s),
        "--warmup",
        str(warmup_s),
        "--key-prefix",
        f"{tag}-{uuid.uuid4().hex[:8]}",
    ]
    for name, pid in server_pids.items():
        argv += ["--watch", f"{name}={pid}"]
    out = subprocess.run(
        argv, capture_output=True, text=True, timeout=duration_s + warmup_s + 120, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"loadgen failed ({out.returncode}):\n{out.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.stdout)
    return result


# ---------------------------------------------------------------------------- databases


def pg_dsn_for(db_name: str) -> str:
    base, _, _ = PG_ADMIN_DSN.rpartition("/")
    return f"{base}/{db_name}"


async def pg_create(tag: str) -> tuple[str, str]:
    """A fresh database of our own: outboxd_bench_<tag>_<pid>."""
    import asyncpg

    name = f"outboxd_bench_{tag}_{os.getpid()}_{uuid.uuid4().hex[:4]}"
    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=10)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    return name, pg_dsn_for(name)


async def pg_drop(name: str) -> None:
    import asyncpg

    if not name.startswith("outboxd_bench_"):
        raise ValueError(f"refusing to drop {name}: not a benchmark database")
    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=10)
    try:
        await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def pg_available() -> str | None:
    import asyncpg

    try:
        conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    await conn.close()
    return None


async def pg_version() -> str:
    import asyncpg

    conn = await asyncpg.connect(PG_ADMIN_DSN, timeout=5)
    try:
        return str(await conn.fetchval("SHOW server_version"))
    finally:
        await conn.close()


@contextlib.asynccontextmanager
async def database(backend: str, tag: str, wd: Path) -> Any:
    """(url, cleanup) for a fresh, migrated database of the backend."""
    if backend == "sqlite":
        path = wd / f"{tag}.db"
        yield f"sqlite:///{path}"
        return
    name, dsn = await pg_create(tag)
    try:
        yield dsn
    finally:
        await pg_drop(name)


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
    p.add_argument(
        "--backends",
        default="sqlite,postgres",
        help="comma-separated: sqlite,postgres (default both)",
    )
    return p


async def backends_arg(text: str) -> list[str]:
    wanted = [b.strip() for b in text.split(",") if b.strip()]
    bad = set(wanted) - {"sqlite", "postgres"}
    if bad:
        raise SystemExit(f"unknown backend(s): {', '.join(sorted(bad))}")
    if "postgres" in wanted:
        reason = await pg_available()
        if reason is not None:
            emit(f"(postgres unreachable at {PG_ADMIN_DSN}: {reason}; running sqlite only)")
            wanted = [b for b in wanted if b != "postgres"]
    return wanted


def save(path: Path | None, data: Mapping[str, Any]) -> None:
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"machine": machine_info(), **data}
    path.write_text(json.dumps(payload, indent=2, default=_json_default))


def _json_default(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, Path):
        return str(x)
    raise TypeError(type(x))


def goal(name: str, value: float, target: float, ok: bool | None, text: str) -> dict[str, Any]:
    """One goal line for the summary: `text` renders value and target."""
    return {"name": name, "value": value, "target": target, "pass": ok, "text": text}
