"""`./dev demo`: a portal job that succeeds, end to end, in one command.

It starts the fake Suwon portal (testkit/fakes/portal.py) and a daemon on the embedded
default pointed at it, both on loopback, in a scratch folder under var/; submits the sample
student's job, waits for it with `Prefer: wait=30`, prints its result and timeline, then
submits a second job and cancels it. Each request is printed as the curl command that makes
it, so the same can be typed against `./dev serve`. Everything stops at the end.
"""

from __future__ import annotations

import itertools
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path
from typing import Any

from testkit.daemon import SAMPLE_PASSWORD, SAMPLE_SNO, DaemonProcess

ROOT = Path(__file__).resolve().parent.parent
# Each portal answer waits this long, so the second job is still running when it is cancelled.
PORTAL_DELAY_S = 0.3


def main() -> int:
    (ROOT / "var").mkdir(exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="demo-", dir=ROOT / "var"))
    portal = start_portal(work)
    daemon: DaemonProcess | None = None
    code = 1
    try:
        urls = json.loads((work / "portal.json").read_text())
        daemon = DaemonProcess(work, demo_config(urls), name="outboxd")
        say(f"starting outboxd (logs: {daemon.stdout_path.relative_to(ROOT)})")
        base = daemon.start(timeout_s=120)
        code = run_demo(base)
        return code
    finally:
        if daemon is not None and daemon.running():
            daemon.terminate()
        portal.terminate()
        portal.wait(10)
        if code == 0:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"failed; the daemon's and the portal's logs are kept in {work.relative_to(ROOT)}")


def run_demo(base: str) -> int:
    body = {"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD}
    status, job = call(base, "POST", "/v1/portal-link-jobs", body, key="demo-1")
    job_id = job["jobId"]
    say(f"{status}: job {job_id} is {job['status']}, its message {job['dispatch']['status']}")

    status, done = call(base, "GET", f"/v1/jobs/{job_id}", prefer="wait=30")
    say(f"{status}: job {job_id} is {done['status']} after {done['attempts']} attempt(s)")
    if done["status"] != "SUCCEEDED":
        say(f"the job did not succeed: {done.get('error')}")
        return 1
    result = done["result"] or {}
    semesters = result.get("semesters") or []
    student = result.get("student") or {}
    say(f"result: {student.get('name')}, {student.get('department')}, {len(semesters)} semesters")

    _, timeline = call(base, "GET", f"/v1/jobs/{job_id}/events")
    types = [e["type"] for e in timeline["events"]]
    runs = [(t, sum(1 for _ in group)) for t, group in itertools.groupby(types)]
    say("timeline: " + ", ".join(t if n == 1 else f"{t} x{n}" for t, n in runs))

    _, second = call(base, "POST", "/v1/portal-link-jobs", body, key="demo-2")
    second_id = second["jobId"]
    status, cancelled = call(base, "POST", f"/v1/jobs/{second_id}/cancel")
    flag = " (cancel requested)" if cancelled.get("cancelRequested") else ""
    say(f"{status}: job {second_id} is {cancelled['status']}{flag}")
    _, ended = call(base, "GET", f"/v1/jobs/{second_id}", prefer="wait=30")
    say(f"job {second_id} ended {ended['status']}")
    say("done; ./dev serve runs the daemon at http://127.0.0.1:8080 (its console: /ui/)")
    return 0 if ended["status"] == "CANCELLED" else 1


def call(
    base: str,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    key: str | None = None,
    prefer: str | None = None,
) -> tuple[int, dict[str, Any]]:
    headers = {}
    if body is not None:
        headers["Content-Type"] = "application/json"
    if key is not None:
        headers["Idempotency-Key"] = key
    if prefer is not None:
        headers["Prefer"] = prefer
    shown = " ".join(f"-H '{k}: {v}'" for k, v in headers.items())
    data = json.dumps(body) if body is not None else None
    # The password is the fake portal's sample; a real one is never printed or logged.
    payload = f" -d '{data}'" if data else ""
    print(f"\n$ curl -s -X {method} {base}{path} {shown}{payload}".replace("  ", " "), flush=True)
    url = base + path  # the daemon's own loopback http:// URL
    request = urllib.request.Request(  # noqa: S310
        url, data=data.encode() if data else None, headers=headers, method=method
    )
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=60) as resp:  # noqa: S310
            status, text = resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        status, text = exc.code, exc.read().decode()
    answer: dict[str, Any] = json.loads(text) if text else {}
    brief = {k: v for k, v in answer.items() if k not in ("result", "events")}
    print(f"  {status} in {time.monotonic() - started:.1f} s: {json.dumps(brief)}", flush=True)
    return status, answer


def start_portal(work: Path) -> subprocess.Popen[bytes]:
    port_file = work / "portal.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "testkit.fakes.portal", "--port-file", str(port_file),
         "--delay-s", str(PORTAL_DELAY_S)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=(work / "portal.log").open("wb"),
    )
    deadline = time.monotonic() + 20
    while not port_file.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"demo: the fake portal did not start ({work / 'portal.log'})")
        time.sleep(0.05)
    say("fake portal listening on loopback")
    return proc


def demo_config(urls: dict[str, str]) -> dict[str, Any]:
    """The embedded default (config.toml), on a database of the demo's own, any free port,
    and the fake portal instead of the real one."""
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": "sqlite:///demo.db"},
        "sqs": {
            "endpoint_url": "embedded",
            "wait_time_s": 1,
            "jobs_queue": f"demo-{uuid.uuid4().hex[:8]}-jobs",
            "tasks_queue": f"demo-{uuid.uuid4().hex[:8]}-tasks.fifo",
        },
        "scrapers": {"suwon": {**urls, "min_interval_s": 0.05}},
        "daemon": {"shutdown_timeout_s": 5},
        "logging": {"level": "info", "format": "json"},
    }


def say(line: str) -> None:
    print(f"demo: {line}", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
