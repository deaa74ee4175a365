"""The portal's bad day as a drill (issue #43): three daemons on Postgres, a backlog of
portal jobs, the portal answering 503 for ten minutes, then a thirty-minute maintenance
window, then the catch-up; the report is in docs/drills.md.

Three `outboxd serve` subprocesses (roles api, relay, consumer) share one fresh Postgres
database (created here, dropped at the end), one moto server and queues of their own, with
`scrapers.suwon.pace_scope = "cluster"`, `min_interval_s` 0.2 and `max_concurrency` 2, and
the `breakers.portal` defaults. The fake Suwon portal (testkit/fakes/portal.py) runs on this
script's event loop, so every request it gets is recorded on this process's clock.

Timeline (every duration times `--scale`): the daemons start; at T0 the portal answers 503
to everything and `--jobs` portal jobs (one student each, spread over the three APIs) are
submitted at once; at T1 = T0 + 600 s the portal answers again, and at that minute a
`[[scrapers.suwon.maintenance]]` window of 1800 s opens (cron in UTC, computed from the
schedule, so T1 is on a minute); at T2 = T1 + 1800 s the window ends and the drill waits
until every job is terminal. Measured: jobs by status and attempts, portal requests per
phase (goal: none inside the window), each daemon's log lines and CPU during the outage,
T2 to the last job done, and the pace of the catch-up (the smallest gap between two
requests of all daemons, the most sessions at once).

    python -m bench.drill_portal_outage [--scale 0.05] [--jobs 500] [--json-out F]

A rehearsal: `--scale 0.05 --jobs 60` (about five minutes: the window must start on a
minute). The full drill takes 45-55 minutes on a 2-core machine.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import time
import uuid
from collections import Counter, defaultdict
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
from testkit.daemon import DaemonProcess
from testkit.fakes.portal import FakePortal, Student, sample_student
from testkit.moto import MotoServer

from bench.common import (
    BENCH,
    Bench,
    CpuWindow,
    emit,
    machine_info,
    percentile,
    pg_create,
    pg_drop,
    proc_cpu_s,
    table,
    workdir,
)

OUTAGE_S = 600.0
WINDOW_S = 1800.0
MIN_INTERVAL_S = 0.2
MAX_CONCURRENCY = 2
CLOCK_TOLERANCE_S = 0.02  # arrival jitter at the fake beside the pacer's slot starts
DAEMONS = 3
TERMINAL = ("SUCCEEDED", "FAILED", "DEAD")
LOGIN = "/enpass/login"
STRAGGLE_S = 5.0


def _ts(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat(timespec="seconds")


def students(n: int) -> list[Student]:
    base = sample_student()
    return [replace(base, sno=f"2099{i:05d}", name=f"학생{i}") for i in range(n)]


def daemon_config(
    dsn: str, sqs_url: str, queues: dict[str, str], portal: FakePortal, t1: float, window_s: float
) -> dict[str, Any]:
    at = datetime.fromtimestamp(t1, UTC)
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": dsn},
        "sqs": {"endpoint_url": sqs_url, **queues},
        "scrapers": {
            "suwon": {
                **portal.where(),
                "min_interval_s": MIN_INTERVAL_S,
                "max_concurrency": MAX_CONCURRENCY,
                "pace_scope": "cluster",
                "maintenance": [
                    {"cron": f"{at.minute} {at.hour} * * *", "duration_s": window_s}
                ],  # the time zone: UTC by default
            }
        },
        "daemon": {"roles": ["api", "relay", "consumer"]},
        "logging": {"level": "info", "format": "json"},
    }


async def sleep_until(wall: float) -> None:
    while (left := wall - time.time()) > 0:
        await asyncio.sleep(min(left, 5.0))


async def submit(bases: list[str], people: list[Student]) -> list[str]:
    """One job per student, round robin over the APIs, 16 at a time."""
    ids: list[str] = []
    sem = asyncio.Semaphore(16)
    async with aiohttp.ClientSession() as http:

        async def one(i: int, s: Student) -> None:
            async with (
                sem,
                http.post(
                    f"{bases[i % len(bases)]}/v1/portal-link-jobs",
                    json={"portal": "suwon", "username": s.sno, "password": s.password},
                    headers={"Idempotency-Key": f"drill-{uuid.uuid4().hex}"},
                ) as resp,
            ):
                body = await resp.json()
                if resp.status != 202:
                    raise RuntimeError(f"POST answered {resp.status}: {body}")
                ids.append(str(body["jobId"]))

        await asyncio.gather(*(one(i, s) for i, s in enumerate(people)))
    return ids


async def dependencies(base: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{base}/v1/admin/dependencies") as r:
        body = await r.json()
    return next(i for i in body["items"] if i["name"] == "portal")


async def job_rows(dsn: str) -> list[dict[str, Any]]:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "SELECT id, status, attempts, error_code, finished_at, updated_at FROM jobs"
        )
    finally:
        await conn.close()
    return [dict(r) for r in rows]


def log_lines(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text("utf-8", "replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                out.append(json.loads(line))
    return out


def gaps_of(starts: list[float]) -> list[float]:
    s = sorted(starts)
    return [b - a for a, b in itertools.pairwise(s)]


def most_in_span(starts: list[float], span_s: float) -> int:
    """The most requests starting within any `span_s` seconds: the pace over a stretch, which
    the arrival jitter of single requests hardly moves."""
    s = sorted(starts)
    best, lo = 0, 0
    for hi, t in enumerate(s):
        while t - s[lo] >= span_s:
            lo += 1
        best = max(best, hi - lo + 1)
    return best


def shortest_run(starts: list[float], k: int) -> float:
    """The shortest time from a request to the k-th after it: at least k slots if the pace
    held, whatever the jitter of single arrivals."""
    s = sorted(starts)
    return min((s[i + k] - s[i] for i in range(len(s) - k)), default=math.nan)


def max_overlap(spans: list[tuple[float, float]]) -> int:
    edges = sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans])
    best = cur = 0
    for _, d in edges:
        cur += d
        best = max(best, cur)
    return best


Call = tuple[float, float, str | None, str, int]  # FakePortal.calls: start, end, who, path, status


def sessions_of(calls: list[Call]) -> list[tuple[float, float]]:
    """Each student's requests cut at every login: one span per session (first to last)."""
    by_user: dict[str, list[tuple[float, float, str]]] = defaultdict(list)
    for start, end, user, path, _status in calls:
        if user is not None:
            by_user[user].append((start, end, path))
    spans = []
    for reqs in by_user.values():
        reqs.sort()
        cur: list[float] | None = None
        for start, end, path in reqs:
            if path == LOGIN or cur is None:
                if cur is not None:
                    spans.append((cur[0], cur[1]))
                cur = [start, end]
            else:
                cur[1] = max(cur[1], end)
        if cur is not None:
            spans.append((cur[0], cur[1]))
    return spans


async def run(bench: Bench, wd: Path) -> dict[str, Any]:
    from outboxd.security import generate_key

    args = bench.args
    outage_s, window_s = OUTAGE_S * args.scale, WINDOW_S * args.scale
    people = students(args.jobs)
    portal = FakePortal(people)
    await portal.start()
    mono_to_wall = time.time() - time.monotonic()
    moto = MotoServer(wd / "moto.log")
    sqs_url = await asyncio.to_thread(moto.start, 60)
    tag = uuid.uuid4().hex[:10]
    queues = {"jobs_queue": f"drill{tag}-jobs", "tasks_queue": f"drill{tag}-tasks.fifo"}
    db_name, dsn = await pg_create("drill")
    daemons: list[DaemonProcess] = []
    rows: list[dict[str, Any]] = []
    try:
        # T1 on a minute (the window's cron), far enough for the daemons to start before T0.
        t1 = math.ceil((time.time() + 45 + outage_s) / 60) * 60.0
        t0, t2 = t1 - outage_s, t1 + window_s
        emit(f"T0 (503s) {_iso(t0)}  T1 (window) {_iso(t1)}  T2 (back) {_iso(t2)}")
        config = daemon_config(dsn, sqs_url, queues, portal, t1, window_s)
        env = {"OUTBOXD_SECRET_KEYS": generate_key()}
        daemons = [
            DaemonProcess(wd / f"d{i}", config, env=env, name=f"d{i}") for i in range(DAEMONS)
        ]
        bases = [await asyncio.to_thread(daemons[0].start, 90)]  # migrates first
        bases += [await asyncio.to_thread(d.start, 90) for d in daemons[1:]]
        pids = {f"d{i}": d.pid for i, d in enumerate(daemons)}
        emit(f"daemons up: {bases}; waiting for T0 ({t0 - time.time():.0f} s)")
        await sleep_until(t0)

        # --- the outage
        portal.always_fail_503 = True
        cpu = {"outage": CpuWindow(pids), "window": CpuWindow(pids), "catchup": CpuWindow(pids)}
        cpu["outage"].start()
        cpu0 = {k: proc_cpu_s(p) for k, p in pids.items()}
        ids = await submit(bases, people)
        emit(f"{len(ids)} jobs submitted in {time.time() - t0:.1f} s; portal answering 503")
        states: list[dict[str, Any]] = []

        async def look(phase: str) -> None:
            dep = await dependencies(bases[len(states) % len(bases)])
            states.append({"phase": phase, "at": time.time(), **dep})
            emit(
                f"  {_iso(time.time())} {phase}: portal {dep['state']}, waiting "
                f"{dep.get('waiting')}, failures {dep.get('failuresInARow')}"
            )

        while time.time() < t1 - 1:
            await asyncio.sleep(min(60.0, max(0.5, t1 - 1 - time.time())))
            await look("outage")
        await sleep_until(t1)
        cpu["outage"].stop()
        cpu1 = {k: proc_cpu_s(p) for k, p in pids.items()}

        # --- the maintenance window: the portal answers again, nobody should call it
        portal.always_fail_503 = False
        cpu["window"].start()
        await asyncio.sleep(min(5.0, window_s / 4))
        await look("window")
        while time.time() < t2 - 1:
            await asyncio.sleep(min(120.0, max(0.5, t2 - 1 - time.time())))
            await look("window")
        await sleep_until(t2)
        cpu["window"].stop()

        # --- the catch-up
        cpu["catchup"].start()
        deadline = time.time() + max(600.0, 6.0 * args.jobs)
        last_change, last_done_count = time.time(), -1
        while True:
            rows = await job_rows(dsn)
            done = sum(1 for r in rows if r["status"] in TERMINAL)
            if done != last_done_count:
                last_done_count, last_change = done, time.time()
            if done == len(rows) or time.time() > deadline or time.time() - last_change > 300:
                break
            if int(time.time() - t2) % 60 < 2:
                emit(f"  {_iso(time.time())} catch-up: {done}/{len(rows)} terminal")
            await asyncio.sleep(2.0)
        cpu["catchup"].stop()
        await look("after")
    finally:
        for d in daemons:
            if d.running():
                await asyncio.to_thread(d.terminate)
        await asyncio.to_thread(moto.stop)
        await portal.stop()
        try:
            rows = await job_rows(dsn)
        finally:
            await pg_drop(db_name)
    return analyse(
        bench, rows, ids, portal, mono_to_wall, (t0, t1, t2), daemons, cpu, cpu0, cpu1, states
    )


def analyse(
    bench: Bench,
    rows: list[dict[str, Any]],
    ids: list[str],
    portal: FakePortal,
    mono_to_wall: float,
    times: tuple[float, float, float],
    daemons: list[DaemonProcess],
    cpu: dict[str, CpuWindow],
    cpu0: dict[str, float],
    cpu1: dict[str, float],
    states: list[dict[str, Any]],
) -> dict[str, Any]:
    t0, t1, t2 = times
    calls = [(a + mono_to_wall, b + mono_to_wall, u, p, s) for a, b, u, p, s in portal.calls]
    by_status = Counter(r["status"] for r in rows)
    not_ok = [
        {k: r[k] for k in ("id", "status", "attempts", "error_code")}
        for r in rows
        if r["status"] != "SUCCEEDED"
    ]
    attempts = sum(int(r["attempts"]) for r in rows)
    finished = [float(r["finished_at"]) for r in rows if r["finished_at"] is not None]
    last_done = max(finished) if finished else math.nan

    logs = {f"d{i}": log_lines(d.stdout_path) for i, d in enumerate(daemons)}
    events = sorted(
        (_ts(e["timestamp"]), name, e)
        for name, lines in logs.items()
        for e in lines
        if "timestamp" in e
    )
    down_at = next((t for t, _n, e in events if e.get("event") == "dependency_down"), math.nan)
    ups = [t for t, _n, e in events if e.get("event") == "dependency_up"]
    up_at = next((t for t in ups if t >= t2), ups[-1] if ups else math.nan)
    dep_events = [
        {"at": _iso(t), "daemon": n, **{k: e.get(k) for k in ("event", "level", "dependency")}}
        | {k: e[k] for k in ("error", "down_s", "released") if k in e}
        for t, n, e in events
        if str(e.get("event", "")).startswith("dependency_")
    ]

    def phase(a: float, b: float) -> list[Call]:
        return [c for c in calls if a <= c[0] < b]

    before = phase(0, t0)
    outage = phase(t0, t1)
    # After the breaker opens, runs already past their check still go out for a moment
    # (each instance looks at the row every half second); later requests are the probes.
    settled = down_at + STRAGGLE_S
    opened = [c for c in outage if c[0] < down_at] if not math.isnan(down_at) else outage
    stragglers = [c for c in outage if down_at <= c[0] < settled]
    probes = [c for c in outage if c[0] >= settled]
    window = phase(t1, t2)
    catchup = phase(t2, math.inf)
    first_after = catchup[0][0] if catchup else math.nan

    per_daemon: dict[str, Any] = {}
    for name, lines in logs.items():
        during = [e for e in lines if "timestamp" in e and t0 <= _ts(e["timestamp"]) < t1]
        per_daemon[name] = {
            "lines_outage": len(during),
            "by_level": dict(Counter(str(e.get("level")) for e in during)),
            "by_event": dict(Counter(str(e.get("event")) for e in during).most_common(8)),
            "dependency_down": sum(1 for e in lines if e.get("event") == "dependency_down"),
            "dependency_up": sum(1 for e in lines if e.get("event") == "dependency_up"),
            "lines_total": len(lines),
            "cpu_outage_s": round(cpu1[name] - cpu0[name], 2),
            "cpu_window_s": round(cpu["window"].cpu_s.get(name, math.nan), 2),
            "cpu_catchup_s": round(cpu["catchup"].cpu_s.get(name, math.nan), 2),
        }

    gaps = gaps_of([c[0] for c in catchup])
    floor = MIN_INTERVAL_S - CLOCK_TOLERANCE_S
    sessions = sessions_of(catchup)
    in_flight = max_overlap([(c[0], c[1]) for c in catchup])
    dur = (last_done - first_after) if catchup else math.nan
    return {
        "scale": bench.args.scale,
        "jobs": len(ids),
        "times": {"T0": _iso(t0), "T1": _iso(t1), "T2": _iso(t2)},
        "status": dict(by_status),
        "not_succeeded": not_ok[:50],
        "attempts": attempts,
        "jobs_with_more_than_one_attempt": sum(1 for r in rows if int(r["attempts"]) > 1),
        "requests": {
            "before_T0": len(before),
            "outage": len(outage),
            "outage_until_breaker_opened": len(opened),
            "outage_in_flight_when_opened": len(stragglers),
            "outage_probes": len(probes),
            "outage_probe_times": [_iso(c[0]) for c in probes],
            "window": len(window),
            "window_calls": [(_iso(c[0]), c[3], c[4]) for c in window[:20]],
            "catchup": len(catchup),
            "per_job_catchup": round(len(catchup) / max(1, len(ids)), 2),
        },
        "breaker": {
            "down_at": _iso(down_at) if not math.isnan(down_at) else None,
            "down_after_T0_s": round(down_at - t0, 2),
            "up_at": _iso(up_at) if not math.isnan(up_at) else None,
            "up_after_T2_s": round(up_at - t2, 2),
            "events": dep_events,
            "looks": states,
        },
        "catchup": {
            "first_request_after_T2_s": round(first_after - t2, 2),
            "last_done_after_T2_s": round(last_done - t2, 1),
            "drain_s": round(dur, 1),
            "jobs_per_min": round(len(ids) / dur * 60, 1) if dur and dur > 0 else None,
            "requests_per_s": round(len(catchup) / dur, 2) if dur and dur > 0 else None,
            "min_gap_s": round(min(gaps), 4) if gaps else None,
            "gap_p1_s": round(percentile(gaps, 1), 4),
            "gap_p50_s": round(percentile(gaps, 50), 4),
            "gaps_below_floor": sum(1 for g in gaps if g < floor),
            "floor_s": floor,
            "min_interval_s": MIN_INTERVAL_S,
            "most_in_10s": most_in_span([c[0] for c in catchup], 10.0),
            "allowed_in_10s": int(10.0 / MIN_INTERVAL_S),
            "shortest_50_gaps_s": round(shortest_run([c[0] for c in catchup], 50), 4),
            "starts_after_T2_s": [round(c[0] - t2, 4) for c in catchup],
            "max_sessions_at_once": max_overlap(sessions),
            "sessions": len(sessions),
            "max_requests_in_flight": in_flight,
            "max_concurrency": MAX_CONCURRENCY,
        },
        "daemons": per_daemon,
        "machine_busy": {k: round(w.machine_busy, 3) for k, w in cpu.items()},
    }


def report(r: dict[str, Any]) -> None:
    q, c, b = r["requests"], r["catchup"], r["breaker"]
    emit(
        table(
            "Jobs",
            ["jobs", *TERMINAL, "other", "attempts", "jobs with >1 attempt"],
            [
                (
                    r["jobs"],
                    *(r["status"].get(s, 0) for s in TERMINAL),
                    sum(v for k, v in r["status"].items() if k not in TERMINAL),
                    r["attempts"],
                    r["jobs_with_more_than_one_attempt"],
                )
            ],
            "goal: every job SUCCEEDED, none DEAD or FAILED",
        )
    )
    emit(
        table(
            "Portal requests",
            [
                "before T0",
                "outage",
                "until open",
                "just after",
                "probes",
                "window",
                "catch-up",
                "per job",
            ],
            [
                (
                    q["before_T0"],
                    q["outage"],
                    q["outage_until_breaker_opened"],
                    q["outage_in_flight_when_opened"],
                    q["outage_probes"],
                    q["window"],
                    q["catchup"],
                    q["per_job_catchup"],
                )
            ],
            f"breaker down {b['down_after_T0_s']} s after T0, up {b['up_after_T2_s']} s after "
            f"T2; just after: within {STRAGGLE_S:g} s of its opening; goal: no request inside "
            "the window",
        )
    )
    emit(
        table(
            "Each daemon during the outage",
            ["daemon", "log lines", "by level", "down/up (whole run)", "CPU s", "window CPU s"],
            [
                (
                    n,
                    d["lines_outage"],
                    " ".join(f"{k}={v}" for k, v in sorted(d["by_level"].items())),
                    f"{d['dependency_down']}/{d['dependency_up']}",
                    d["cpu_outage_s"],
                    d["cpu_window_s"],
                )
                for n, d in r["daemons"].items()
            ],
        )
    )
    emit(
        table(
            "Catch-up",
            [
                "first req after T2 s",
                "last done after T2 s",
                "jobs/min",
                "req/s",
                "min gap s",
                "gap p1 s",
                "gaps < floor",
                "most in 10 s",
                "50 gaps s",
                "max sessions",
                "max in flight",
            ],
            [
                (
                    c["first_request_after_T2_s"],
                    c["last_done_after_T2_s"],
                    c["jobs_per_min"],
                    c["requests_per_s"],
                    c["min_gap_s"],
                    c["gap_p1_s"],
                    c["gaps_below_floor"],
                    f"{c['most_in_10s']}/{c['allowed_in_10s']}",
                    c["shortest_50_gaps_s"],
                    c["max_sessions_at_once"],
                    c["max_requests_in_flight"],
                )
            ],
            f"pace: min_interval_s {MIN_INTERVAL_S} (floor {c['floor_s']:.2f} with the "
            "clock tolerance; at most one request a slot in any 10 s; 50 gaps: the shortest "
            "time from a request to the 50th after it, 10 s at this pace), max_concurrency "
            f"{MAX_CONCURRENCY}, cluster scope; "
            f"machine busy: {r['machine_busy']}",
        )
    )
    if r["not_succeeded"]:
        emit("NOT SUCCEEDED: " + json.dumps(r["not_succeeded"][:20]))
    if q["window"]:
        emit("REQUESTS INSIDE THE WINDOW: " + json.dumps(q["window_calls"]))


async def main_async() -> int:
    bench = Bench.parse(
        "drill_portal_outage",
        __doc__,
        {
            "--scale": {"type": float, "default": 1.0, "help": "durations times this"},
            "--jobs": {"type": int, "default": 500, "help": "portal jobs in the backlog"},
        },
    )
    if bench.args.json_out is None:
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        bench.args.json_out = BENCH / "results" / stamp / "drill_portal_outage.json"
    bench.heading(f"Drill: the portal down, then its maintenance window (scale {bench.args.scale})")
    start = machine_info()
    with workdir("drill") as wd:
        emit(f"scratch: {wd}")
        results = await run(bench, wd)
    report(results)
    bench.save(results=results, machine_start=start)
    emit(f"JSON: {bench.args.json_out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
