"""Chaos under load: SIGKILL and restart daemons at random moments, then count.

A loader submits portal-link jobs (each for a student of its own, with a unique
Idempotency-Key) and websites at a steady rate. A client retries a request with the same
key after a connection error or a 503, as a real one would, until it gets its 2xx or
gives up (a client that gave up without a 2xx has no accepted job). Meanwhile the harness
SIGKILLs a random daemon at a random moment and starts it again, `cycles` times (seeded:
the seed is printed). Then the loader stops, the harness waits for quiescence, and counts
Jepsen-style:

- accepted: a 202 (job) / 200-201 (website) reached the client;
- succeeded / failed / dead: the terminal state each accepted one reached;
- lost: accepted but missing, or not terminal at quiescence;
- duplicated effects: a job whose result was stored twice (two `job_succeeded`), or that
  was run again after it finished (a portal login for its student after `finished_at`);
  a website classified twice (two `website_classified`, its category written twice:
  `version > 1`, an AI call for it after its category was stored, or two AI calls for it
  at the same time: two holders of its row).

At-least-once re-runs that are *not* duplicated effects (a run killed after fetching
but before storing, then run again) are reported as `refetched` / `ai repeat calls`.

Long profile (documented in docs/reliability.md)::

    python -m tests.reliability.chaos --backend postgres --cycles 100 --seed 7 --daemons 2
    python -m tests.reliability.chaos --backend sqlite --cycles 100 --seed 7

The command starts what it needs (a moto server, a Postgres database of its own on
OUTBOXD_TEST_PG_DSN's server, the fakes) and exits 1 when anything was lost or applied
twice.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import random
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from tests.reliability.harness import (
    CONNECTION_ERRORS,
    JOB_TERMINAL,
    RELAY_TERMINAL,
    WORK_TERMINAL,
    Db,
    Fakes,
    daemon_config,
    http,
    log_events,
    new_daemon,
    student_number,
    write_keys_file,
)
from tests.support.waits import eventually_sync_while_moving

Kind = Literal["job", "site"]


@dataclass
class Item:
    kind: Kind
    n: int
    key: str
    state: Literal["pending", "accepted", "unacked", "rejected"] = "pending"
    ref: str | None = None  # job id / domain
    tries: int = 0
    last: str = ""
    dispatch: str | None = None  # a job's outbox status in its 202 (SENT normally)
    accepted_at: float | None = None

    @property
    def body(self) -> dict[str, Any]:
        if self.kind == "job":
            return {
                "portal": "suwon",
                "username": student_number(self.n),
                "password": f"pw-{self.n}",
            }
        return {"domain": f"chaos-{self.n}.example", "faviconUrl": None}


@dataclass
class ChaosParams:
    backend: str
    db_url: str
    sqs_endpoint: str
    queue_names: Mapping[str, str]
    workdir: Path
    cycles: int = 10
    seed: int = 1
    daemons: int = 1
    job_rate: float = 5.0  # submissions per second
    site_rate: float = 2.5
    up_s: tuple[float, float] = (0.8, 2.2)  # load between two kills
    down_s: tuple[float, float] = (0.0, 0.4)  # how long a killed daemon stays down
    give_up_s: float = 25.0  # a client's patience for one submission
    # Quiescence: the backlog left when the load stops drains at the consumer's pace, and
    # it is larger the slower the machine restarts daemons (decision 0029). The wait goes
    # on while items keep coming to rest; nothing coming to rest for `quiesce_timeout_s`
    # ends it (what is left is lost), and so does `quiesce_cap_s` in all.
    quiesce_timeout_s: float = 90.0
    quiesce_cap_s: float = 200.0
    # Slow enough that a kill usually lands with jobs and a provider call in flight.
    portal_delay_s: float = 0.03
    ai_delay_s: float = 0.15
    # "cluster": the claimer's slots and the portal's session leases go through the database.
    pace_scope: str = "instance"


@dataclass
class KindCounts:
    accepted: int = 0
    succeeded: int = 0
    failed: int = 0
    dead: int = 0
    lost: int = 0
    duplicated: int = 0

    def tally(self, status: str | None, outcomes: Mapping[str, str]) -> bool:
        """One accepted item, counted by its stored status (`outcomes`: status -> the
        field it counts in); False when the status is none of them: the item is lost."""
        self.accepted += 1
        name = outcomes.get(status or "")
        if name is None:
            self.lost += 1
            return False
        setattr(self, name, getattr(self, name) + 1)
        return True


JOB_OUTCOMES = {"SUCCEEDED": "succeeded", "FAILED": "failed", "DEAD": "dead"}
SITE_OUTCOMES = {"COMPLETED": "succeeded", "FAILED": "failed"}


@dataclass
class ChaosReport:
    params: ChaosParams
    label: str = "chaos"
    kills: int = 0
    jobs: KindCounts = field(default_factory=KindCounts)
    sites: KindCounts = field(default_factory=KindCounts)
    unacked: int = 0
    rejected: list[str] = field(default_factory=list)
    stuck_rows: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    refetched: int = 0
    ai_repeat_calls: int = 0
    guards_fired: Counter[str] = field(default_factory=Counter)
    client_failures: Counter[str] = field(default_factory=Counter)
    load_s: float = 0.0
    quiesce_s: float = 0.0
    queue_left: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            self.jobs.lost == 0
            and self.sites.lost == 0
            and self.jobs.duplicated == 0
            and self.sites.duplicated == 0
            and not self.rejected
            and not self.stuck_rows
            and not self.problems
        )

    def table(self) -> str:
        p = self.params
        head = (
            f"{self.label}: backend={p.backend} daemons={p.daemons} kills={self.kills} "
            f"seed={p.seed} load={self.load_s:.1f}s quiescence={self.quiesce_s:.1f}s"
        )
        cols = ("accepted", "succeeded", "failed", "dead", "lost", "duplicated")
        lines = [head, f"{'':<12}" + "".join(f"{c:>11}" for c in cols)]
        for name, k in (("portal jobs", self.jobs), ("websites", self.sites)):
            lines.append(f"{name:<12}" + "".join(f"{getattr(k, c):>11}" for c in cols))
        lines.append(
            f"unacked (client gave up): {self.unacked}; refetched jobs (at-least-once "
            f"re-runs): {self.refetched}; ai repeat calls: {self.ai_repeat_calls}; "
            f"stale-holder guards fired: {dict(self.guards_fired) or 0}; "
            f"queue left: {self.queue_left or '-'}"
        )
        lines.append(f"client-side failures (retried): {dict(self.client_failures) or 0}")
        for what in (self.rejected, self.stuck_rows, self.problems):
            lines.extend("  !! " + line for line in what[:20])
        return "\n".join(lines)


class Cluster:
    """The daemons and which of them are up (their base URLs), shared with the loader."""

    def __init__(self, daemons: list[DaemonProcess]) -> None:
        self.daemons = daemons
        self._lock = threading.Lock()
        self._up: dict[int, str] = {}

    def start_all(self) -> None:
        for i, d in enumerate(self.daemons):
            self.mark_up(i, d.start())

    def mark_up(self, i: int, base: str) -> None:
        with self._lock:
            self._up[i] = base

    def mark_down(self, i: int) -> None:
        with self._lock:
            self._up.pop(i, None)

    def pick(self, rng: random.Random) -> str | None:
        with self._lock:
            bases = list(self._up.values())
        return rng.choice(bases) if bases else None

    def any_base(self) -> str:
        with self._lock:
            return next(iter(self._up.values()))


class Loader:
    """Steady-rate submissions, each retried (same key) until a 2xx or the client gives up."""

    def __init__(self, cluster: Cluster, params: ChaosParams) -> None:
        self.cluster = cluster
        self.params = params
        self.items: list[Item] = []
        # Every failed attempt (connection error, 503, other): (wall time, latency, what).
        self.failures: list[tuple[float, float, str]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._running = threading.Event()
        self._running.set()
        self._pool = ThreadPoolExecutor(max_workers=12, thread_name_prefix="loader")
        self._futures: list[Any] = []
        self._thread = threading.Thread(target=self._schedule, daemon=True)
        self._run_tag = uuid.uuid4().hex[:8]

    def accepted_since(self, at: float, kind: Kind | None = None) -> list[Item]:
        """Items accepted at wall time `at` or later (of one kind, or any)."""
        return [
            i
            for i in list(self.items)
            if i.accepted_at is not None
            and i.accepted_at >= at
            and (kind is None or i.kind == kind)
        ]

    def pause(self) -> None:
        """No new submissions (those in flight go on)."""
        self._running.clear()

    def resume(self) -> None:
        self._running.set()

    def _failed(self, started: float, what: str) -> None:
        with self._lock:
            self.failures.append((time.time(), time.monotonic() - started, what))

    def start(self) -> None:
        self._thread.start()

    def _schedule(self) -> None:
        counters = {"job": 0, "site": 0}
        rates: dict[Kind, float] = {"job": self.params.job_rate, "site": self.params.site_rate}
        next_at = {k: time.monotonic() for k in rates}
        while not self._stop.wait(0.01):  # a tick; stop_and_drain() ends it at once
            now = time.monotonic()
            if not self._running.is_set():
                next_at = {k: now for k in rates}
                continue
            for kind, rate in rates.items():
                if rate > 0 and now >= next_at[kind]:
                    next_at[kind] += 1.0 / rate
                    n = counters[kind]
                    counters[kind] += 1
                    item = Item(kind, n, f"chaos-{self._run_tag}-{kind}-{n}")
                    self.items.append(item)
                    self._futures.append(self._pool.submit(self._submit, item))

    def _submit(self, item: Item) -> None:
        rng = random.Random(item.key)
        deadline = time.monotonic() + self.params.give_up_s
        path = "/v1/portal-link-jobs" if item.kind == "job" else "/v1/websites"
        headers = {"Idempotency-Key": item.key} if item.kind == "job" else {}
        ok_codes = (202,) if item.kind == "job" else (200, 201)
        retry_in = 0.0
        while time.monotonic() < deadline:
            # A careful client: a pause before each retry (none before the first try).
            time.sleep(retry_in)
            base = self.cluster.pick(rng)
            if base is None:  # every daemon is down
                retry_in = 0.05
                continue
            item.tries += 1
            started = time.monotonic()
            try:
                resp = http("POST", base, path, item.body, headers, timeout_s=8.0)
            except CONNECTION_ERRORS as exc:
                item.last = f"{type(exc).__name__}"
                self._failed(started, item.last)
                retry_in = 0.1
                continue
            if resp.status in ok_codes:
                body = resp.json()
                item.ref = body["jobId"] if item.kind == "job" else body["domain"]
                if item.kind == "job":
                    item.dispatch = (body.get("dispatch") or {}).get("status")
                item.accepted_at = time.time()
                item.state = "accepted"
                return
            item.last = f"HTTP {resp.status}: {resp.text[:200]}"
            self._failed(started, f"HTTP {resp.status} {_code(resp.text)}")
            if resp.status >= 500:  # a careful client retries a 5xx with the same key
                retry_in = 0.2
                continue
            item.state = "rejected"
            return
        item.state = "unacked"

    def stop_and_drain(self) -> None:
        self._stop.set()
        self._thread.join(10)
        for f in self._futures:
            f.result(timeout=self.params.give_up_s + 30)
        self._pool.shutdown(wait=True)


def _code(text: str) -> str:
    try:
        return str(json.loads(text).get("code"))
    except (ValueError, AttributeError):
        return "?"


def _terminal_snapshot(db: Db) -> dict[str, Any]:
    return {
        "jobs": db.rows(
            "SELECT id, idempotency_key, status, attempts, finished_at, result, lease_until,"
            " updated_at, error_code FROM jobs"
        ),
        "sites": db.rows(
            "SELECT w.id, w.domain, w.category, w.version, w.updated_at, o.status AS work_status,"
            " o.attempt_count FROM websites w LEFT JOIN work_outbox o ON o.website_id = w.id"
        ),
        "relay": db.rows("SELECT id, job_id, task_id, status FROM relay_outbox"),
    }


def _at_rest(snap: Mapping[str, Any]) -> int:
    """How many rows are at rest: a count that grows while the backlog drains."""
    return (
        sum(r["status"] in JOB_TERMINAL for r in snap["jobs"])
        + sum(r["work_status"] in WORK_TERMINAL for r in snap["sites"])
        + sum(r["status"] in RELAY_TERMINAL for r in snap["relay"])
    )


def _quiescent(snap: Mapping[str, Any], accepted_jobs: set[str], domains: set[str]) -> bool:
    jobs = {r["id"]: r for r in snap["jobs"]}
    sites = {r["domain"]: r for r in snap["sites"]}
    return (
        all(j in jobs for j in accepted_jobs)
        and all(r["status"] in JOB_TERMINAL for r in jobs.values())
        and all(d in sites for d in domains)
        and all(r["work_status"] in WORK_TERMINAL for r in sites.values())
        and all(r["status"] in RELAY_TERMINAL for r in snap["relay"])
    )


def run_chaos(params: ChaosParams, fakes: Fakes, log: Any = print) -> ChaosReport:
    rng = random.Random(params.seed)
    fakes.set_portal(delay_s=params.portal_delay_s)
    fakes.set_ai(delay_s=params.ai_delay_s)
    log(
        f"chaos: seed={params.seed} backend={params.backend} daemons={params.daemons}"
        f" pace_scope={params.pace_scope}"
    )
    keys_file = write_keys_file(params.workdir / "keys")
    pace = {"pace_scope": params.pace_scope}
    config = daemon_config(
        params.db_url,
        params.sqs_endpoint,
        params.queue_names,
        fakes,
        keys_file,
        claimer=pace,
        scrapers={"suwon": pace},
    )
    daemons = [new_daemon(params.workdir, config, f"d{i}") for i in range(params.daemons)]
    cluster = Cluster(daemons)
    report = ChaosReport(params)
    db = Db(params.db_url)
    try:
        cluster.start_all()
        loader = Loader(cluster, params)
        started = time.monotonic()
        loader.start()
        for up_s, i, down_s in _kill_plan(rng, params, len(daemons)):
            time.sleep(up_s)  # load runs
            if i is None:
                break
            cluster.mark_down(i)
            daemons[i].kill()  # SIGKILL: no cleanup at all
            report.kills += 1
            time.sleep(down_s)
            cluster.mark_up(i, daemons[i].start())
            if report.kills % 10 == 0:
                log(f"chaos: {report.kills} kills, {len(loader.items)} submitted")
        loader.stop_and_drain()
        report.load_s = time.monotonic() - started

        settle_and_count(report, loader.items, db, fakes, daemons, cluster.any_base())
        report.client_failures.update(what for _t, _lat, what in loader.failures)
        # Killed daemons refuse or reset connections; a 5xx other than 503 is a bug.
        report.problems.extend(
            f"{n} x {what}"
            for what, n in report.client_failures.items()
            if what.startswith("HTTP 5") and not what.startswith("HTTP 503")
        )
        for d in daemons:
            if d.running():
                code = d.terminate(timeout_s=30)
                if code != 0:
                    report.problems.append(f"{d.config_path.stem} exited {code} on SIGTERM")
    finally:
        for d in daemons:
            d.kill()
        db.close()
    return report


def _kill_plan(
    rng: random.Random, params: ChaosParams, daemons: int
) -> list[tuple[float, int | None, float]]:
    """The seed's chaos: per cycle, how long the load runs, which daemon is then killed
    and how long it stays down; last, the load running on with no kill."""
    plan: list[tuple[float, int | None, float]] = []
    for _ in range(params.cycles):
        up_s = rng.uniform(*params.up_s)
        i = rng.randrange(daemons)
        plan.append((up_s, i, rng.uniform(*params.down_s)))
    plan.append((rng.uniform(*params.up_s), None, 0.0))
    return plan


def wait_for_rest(
    snapshot: Callable[[], dict[str, Any]],
    items: list[Item],
    params: ChaosParams,
    interval: float = 0.5,
) -> dict[str, Any]:
    """The last snapshot of a wait for quiescence: every accepted item terminal and every
    row at rest, or the wait given up: nothing came to rest for `quiesce_timeout_s` (or
    `quiesce_cap_s` passed). Not a fixed time from the end of the load: a backlog still
    draining is waited for, a row that stopped moving is not (decision 0029)."""
    accepted = [i for i in items if i.state == "accepted"]
    job_ids = {i.ref for i in accepted if i.kind == "job" and i.ref}
    domains = {i.ref for i in accepted if i.kind == "site" and i.ref}
    snap = snapshot()

    def quiescent() -> bool:
        nonlocal snap
        snap = snapshot()
        return _quiescent(snap, job_ids, domains)

    with contextlib.suppress(AssertionError):  # not quiescent: the counts say what is not
        eventually_sync_while_moving(
            quiescent,
            lambda: _at_rest(snap),
            params.quiesce_timeout_s,
            params.quiesce_cap_s,
            interval=interval,
        )
    return snap


def settle_and_count(
    report: ChaosReport,
    items: list[Item],
    db: Db,
    fakes: Fakes,
    daemons: list[DaemonProcess],
    base: str,
) -> None:
    """Wait for quiescence (every accepted item terminal, every row at rest), then count."""
    q_started = time.monotonic()
    snap = wait_for_rest(lambda: _terminal_snapshot(db), items, report.params)
    report.quiesce_s = time.monotonic() - q_started
    with contextlib.suppress(Exception):
        stats = http("GET", base, "/v1/admin/stats").json()
        report.queue_left = stats.get("queues") or {}
    _count(report, items, snap, fakes, daemons)


# What a lost job's story shows of each of its log lines (besides the event and its time).
_STORY_FIELDS = ("message_id", "receive_count", "attempt", "retry_in_s", "delay_s", "error_code")


def _job_story(row: Mapping[str, Any], events: list[dict[str, Any]]) -> str:
    """A job that did not come to rest, in one line: its row (attempts, its lease and last
    change, relative to now) and every log line that names it, with the daemon start each
    came from, so a lost job can be traced from the report alone."""
    now = time.time()
    lease = row.get("lease_until")
    parts = [
        f"attempts={row.get('attempts')}",
        f"lease={'-' if lease is None else f'{float(lease) - now:+.1f}s'}",
        f"updated={float(row.get('updated_at') or now) - now:+.1f}s",
        f"error={row.get('error_code') or '-'}",
    ]
    start, lines = 0, []
    for e in events:
        if e.get("event") == "daemon_starting":
            start += 1
        if e.get("job_id") != row["id"]:
            continue
        extra = ",".join(f"{k}={str(e[k])[:8]}" for k in _STORY_FIELDS if k in e)
        at = f"{float(e['ts']) - now:+.1f}s" if "ts" in e else "?"
        lines.append(f"{e.get('event')}[{extra}]#{start}@{at}")
    return " ".join(parts) + " | " + (" ".join(lines) or "no log line names it")


def _count(
    report: ChaosReport,
    items: list[Item],
    snap: Mapping[str, Any],
    fakes: Fakes,
    daemons: list[DaemonProcess],
) -> None:
    jobs = {r["id"]: r for r in snap["jobs"]}
    sites = {r["domain"]: r for r in snap["sites"]}
    events = list(log_events(daemons))
    succeeded_events = Counter(e.get("job_id") for e in events if e["event"] == "job_succeeded")
    classified_events = Counter(
        e.get("domain") for e in events if e["event"] == "website_classified"
    )
    for e in events:
        if e["event"] in ("job_outcome_lost_race", "classification_outcome_lost_race"):
            report.guards_fired[e["event"]] += 1
    logins = fakes.logins()
    fetches = fakes.fetches()
    ai_calls = fakes.ai_calls()
    ok_calls: dict[str, list[dict[str, Any]]] = {}
    all_calls: dict[str, list[dict[str, Any]]] = {}
    for c in ai_calls:
        all_calls.setdefault(c["domain"], []).append(c)
        if c["status"] == 200:
            ok_calls.setdefault(c["domain"], []).append(c)

    for item in items:
        if item.state == "unacked":
            report.unacked += 1
        elif item.state == "rejected":
            report.rejected.append(f"{item.kind} {item.key}: {item.last}")
        if item.state != "accepted" or item.ref is None:
            continue
        is_job = item.kind == "job"
        what = "job" if is_job else "website"
        counts = report.jobs if is_job else report.sites
        row = (jobs if is_job else sites).get(item.ref)
        status = row["status" if is_job else "work_status"] if row else None
        if not counts.tally(status, JOB_OUTCOMES if is_job else SITE_OUTCOMES):
            report.problems.append(f"lost {what} {item.ref} ({item.key}): {status}")
            if is_job and row is not None:
                report.problems.append("  " + _job_story(row, events))
            continue
        dup: list[str] = []
        if is_job:
            job = row
            sno = student_number(item.n)
            if succeeded_events[item.ref] > 1:
                dup.append(f"stored {succeeded_events[item.ref]} times")
            finished_at = float(job["finished_at"] or 0.0) if job else 0.0
            late = [t for t in logins.get(sno, []) if finished_at and t > finished_at]
            if late:
                dup.append(f"portal login {late[0] - finished_at:.2f}s after it finished")
            if status == "SUCCEEDED" and (
                not job or f'"studentNumber":"{sno}"' not in str(job["result"]).replace(" ", "")
            ):
                dup.append("result is not its student's record")
            if len(fetches.get(sno, [])) > 1:
                report.refetched += 1
        else:
            site = row
            assert site is not None
            if classified_events[item.ref] > 1:
                dup.append(f"classified {classified_events[item.ref]} times")
            if int(site["version"]) > 1:
                dup.append(f"category written {site['version']} times")
            if status == "COMPLETED" and site["category"] is None:
                dup.append("COMPLETED without a category")
            calls = ok_calls.get(item.ref, [])
            if len(calls) > 1:
                report.ai_repeat_calls += len(calls) - 1
            every = sorted(all_calls.get(item.ref, []), key=lambda c: c["start"])
            for a, b in itertools.pairwise(every):
                if b["start"] < a["end"]:  # two holders of one row at once
                    dup.append("two provider calls at once")
                    break
            late_calls = [c for c in calls if c["start"] > float(site["updated_at"])]
            if site["category"] is not None and late_calls:
                dup.append(
                    f"AI called {late_calls[0]['start'] - float(site['updated_at']):.2f}s "
                    "after the category was stored"
                )
        if dup:
            counts.duplicated += 1
            report.problems.append(f"{what} {item.ref}: " + "; ".join(dup))

    # Not only what a client saw: every row must have come to rest.
    for r in snap["jobs"]:
        if r["status"] not in JOB_TERMINAL:
            report.stuck_rows.append(f"job {r['id']} ({r['idempotency_key']}) {r['status']}")
    for r in snap["sites"]:
        if r["work_status"] not in WORK_TERMINAL:
            report.stuck_rows.append(f"work row of {r['domain']} {r['work_status']}")
    for r in snap["relay"]:
        if r["status"] not in RELAY_TERMINAL:
            report.stuck_rows.append(f"relay row {r['id']} (job {r['job_id']}) {r['status']}")


# ------------------------------------------------------------------ standalone (long profile)


@contextlib.contextmanager
def _standalone_world(backend: str, workdir: Path) -> Iterator[tuple[str, MotoServer]]:
    moto = MotoServer(workdir / "moto.log")
    moto.start()
    pg_name: str | None = None
    try:
        if backend == "postgres":
            from tests.support import postgres as pg

            reason = pg.unreachable_reason()
            if reason is not None:
                raise SystemExit(f"chaos: Postgres unreachable ({pg.ADMIN_DSN}): {reason}")
            pg_name, db_url = pg.create_database()
        else:
            db_url = f"sqlite:///{workdir / 'chaos.db'}"
        yield db_url, moto
    finally:
        moto.stop()
        if pg_name is not None:
            from tests.support import postgres as pg

            pg.drop_database(pg_name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.reliability.chaos", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--backend", choices=("sqlite", "postgres"), default="sqlite")
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--seed", type=int, default=None, help="default: random (printed)")
    parser.add_argument("--daemons", type=int, default=1)
    parser.add_argument("--job-rate", type=float, default=5.0)
    parser.add_argument("--site-rate", type=float, default=2.5)
    parser.add_argument("--workdir", type=Path, default=None, help="kept for inspection")
    parser.add_argument("--pace-scope", choices=("instance", "cluster"), default="instance")
    args = parser.parse_args(argv)
    if args.backend == "sqlite" and args.daemons != 1:
        parser.error("SQLite is one instance per file: --daemons 1")
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="outboxd-chaos-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"chaos: workdir {workdir}", flush=True)
    with _standalone_world(args.backend, workdir) as (db_url, moto):
        fakes = Fakes(workdir / "fakes", n_students=int(args.cycles * 6 * args.job_rate) + 500)
        try:
            params = ChaosParams(
                backend=args.backend,
                db_url=db_url,
                sqs_endpoint=moto.endpoint_url,
                queue_names={"jobs_queue": "chaos-jobs", "tasks_queue": "chaos-tasks.fifo"},
                workdir=workdir,
                cycles=args.cycles,
                seed=seed,
                daemons=args.daemons,
                job_rate=args.job_rate,
                site_rate=args.site_rate,
                quiesce_timeout_s=180.0,
                quiesce_cap_s=1800.0,
                pace_scope=args.pace_scope,
            )
            report = run_chaos(params, fakes, log=lambda s: print(s, flush=True))
        finally:
            fakes.close()
    print(report.table(), flush=True)
    return 0 if report.ok else 1


if __name__ == "__main__":
    sys.exit(main())
