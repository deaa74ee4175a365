"""Sampling profiles with py-spy (installed in the peers' virtualenv), summarised as text.

    python -m bench.profile --pid PID --seconds 10            # attach to a running process
    python -m bench.profile --out prof.txt -- python -m ...   # run a command under py-spy

Prints the functions with the most samples on top of the stack (self) and anywhere in
it (inclusive), as shares of the samples where the process was not idle.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from bench.common import BENCH

_FRAME_RE = re.compile(r"^(?P<func>.*?) \((?P<file>[^:()]*)(?::\d+)?\)$")


def py_spy() -> str | None:
    local = BENCH / ".venv-peers" / "bin" / "py-spy"
    if local.exists():
        return str(local)
    return shutil.which("py-spy")


def record_pid(
    pid: int, seconds: float | None, out: Path, rate: int = 200
) -> subprocess.Popen[bytes]:
    """Start sampling a process for `seconds` (None: until stop()); then summarize(out)."""
    exe = py_spy()
    if exe is None:
        raise RuntimeError("py-spy is not installed (bench/run installs it in bench/.venv-peers)")
    argv = [
        exe,
        "record",
        "--pid",
        str(pid),
        "--rate",
        str(rate),
        "--format",
        "raw",
        "--output",
        str(out),
        "--nonblocking",
    ]
    if seconds is not None:
        argv += ["--duration", str(max(1, round(seconds)))]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(0.3)  # let it attach before the interesting part starts
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    """End an open-ended recording; py-spy writes its output on SIGINT."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)


def _short(frame: str) -> str:
    m = _FRAME_RE.match(frame.strip())
    if not m:
        return frame.strip()
    file = m.group("file")
    for marker in ("site-packages/", "/src/", "/lib/python3.11/"):
        if marker in file:
            file = file.split(marker, 1)[1]
            break
    return f"{m.group('func')} ({file})"


def summarize(raw: Path, top: int = 15, title: str = "") -> str:
    self_c: Counter[str] = Counter()
    incl_c: Counter[str] = Counter()
    total = 0
    for line in raw.read_text(encoding="utf-8", errors="replace").splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        n = int(count_text)
        frames = [_short(f) for f in stack.split(";") if f and not f.startswith("process ")]
        frames = [f for f in frames if not f.startswith("thread ")]
        if not frames:
            continue
        total += n
        self_c[frames[-1]] += n
        for f in set(frames):
            incl_c[f] += n
    if not total:
        return f"{title}: no samples"
    lines = [f"{title} ({total} samples)" if title else f"{total} samples", "  self:"]
    lines += [f"    {n / total:6.1%}  {f}" for f, n in self_c.most_common(top)]
    lines.append("  inclusive (outboxd, drivers, aiohttp, structlog, botocore):")
    interesting = (
        "outboxd",
        "aiosqlite",
        "asyncpg",
        "aiohttp",
        "structlog",
        "botocore",
        "aiobotocore",
        "sqlite3",
        "json",
    )
    shown = [(f, n) for f, n in incl_c.most_common() if any(k in f for k in interesting)]
    lines += [f"    {n / total:6.1%}  {f}" for f, n in shown[:top]]
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--pid", type=int)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=Path(f"/tmp/outboxd-profile-{os.getpid()}.txt"))
    p.add_argument("--top", type=int, default=20)
    p.add_argument("command", nargs=argparse.REMAINDER)
    args = p.parse_args()
    exe = py_spy()
    if exe is None:
        raise SystemExit("py-spy not found: run bench/run once (it installs bench/.venv-peers)")
    if args.pid:
        record_pid(args.pid, args.seconds, args.out).wait()
    else:
        cmd = [c for c in args.command if c != "--"]
        if not cmd:
            p.error("give --pid or a command after --")
        subprocess.run(
            [
                exe,
                "record",
                "--rate",
                "200",
                "--format",
                "raw",
                "--output",
                str(args.out),
                "--",
                *cmd,
            ],
            check=False,
        )
    sys.stdout.write(summarize(args.out, args.top) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
