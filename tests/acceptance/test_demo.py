"""`./dev demo`, the README's first success: a portal job SUCCEEDED against the fake portal on
the embedded default, its timeline, and a second job cancelled."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_demo_ends_with_a_succeeded_and_a_cancelled_job() -> None:
    before = set((ROOT / "var").glob("demo-*")) if (ROOT / "var").exists() else set()
    done = subprocess.run(
        [sys.executable, "-m", "testkit.demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        stdin=subprocess.DEVNULL,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("demo: ")]
    assert done.returncode == 0, done.stdout + done.stderr
    assert any(" is SUCCEEDED after " in line for line in lines), lines
    assert any("timeline: accepted, dispatched, started, progress" in line for line in lines), lines
    assert lines[-2].endswith("ended CANCELLED"), lines
    # Each request is shown as the curl command that makes it, Prefer: wait=30 included.
    assert "-H 'Prefer: wait=30'" in done.stdout
    # Nothing is left behind on success.
    assert set((ROOT / "var").glob("demo-*")) == before
