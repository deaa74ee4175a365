"""Stopping a helper process the tests or the benchmarks started (a daemon, moto, a fake)."""

from __future__ import annotations

import subprocess


def terminate(proc: subprocess.Popen[bytes] | subprocess.Popen[str]) -> None:
    """SIGTERM, five seconds' grace, then SIGKILL; a process already gone is left alone."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
