"""Run every benchmark side by side and print a summary with the goals (PASS/MISS).

Called by `bench/run`; each benchmark runs as its own process (`python -m bench.<name>`),
prints its tables as it goes, and leaves JSON in bench/results/<timestamp>/. The summary
reads those back: key figures, then one line per goal of docs/performance.md.

    bench/run [--quick] [--only intake,relay,...] [--sizes N,N,N] [--backends ...] [--baseline REV]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from bench import fmt
from bench.common import (
    BENCH,
    PY,
    ROOT,
    Results,
    emit,
    machine_line,
    med,
    median,
    percentile,
    ratio,
    table,
)
from bench.door import OFF as DOOR_OFF
from bench.door import ON as DOOR_ON
from bench.door import PEERS as DOOR_PEERS
from bench.door import paired as door_paired
from bench.intake import BARE, BASELINE, OURS
from bench.sqsreq import describe, per_job

ORDER = (
    "intake",
    "sustained",
    "relay",
    "peers",
    "door",
    "claimer",
    "e2e",
    "waiters",
    "pgcost",
    "sqsreq",
    "footprint",
)
STUB, OFF = "dispatch stub", "dispatch off"
BARE_JSON = "stub: bare JSON-client loop"


def git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    return out.stdout.strip()


def code_version() -> str:
    """The commit under test, and whether src/ differs from it (read-only git calls)."""
    dirty = git("status", "--porcelain", "--", "src")
    return (git("rev-parse", "--short", "HEAD") or "?") + (" (src/ modified)" if dirty else "")


def run_one(name: str, outdir: Path, args: argparse.Namespace) -> int:
    argv = [PY, "-m", f"bench.{name}", "--json-out", str(outdir / f"{name}.json")]
    if args.quick:
        argv.append("--quick")
    if args.backends and name in ("intake", "sustained", "relay", "claimer", "e2e", "waiters"):
        argv += ["--backends", args.backends]
    if args.sizes and name == "claimer":
        argv += ["--sizes", args.sizes]
    if args.baseline and name == "intake":
        argv += ["--baseline", args.baseline]
    t0 = time.perf_counter()
    with (outdir / f"{name}.txt").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        assert proc.stdout is not None
        for raw in proc.stdout:
            line = raw.decode("utf-8", "replace")
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
        code = proc.wait()
    emit(f"({name}: exit {code}, {time.perf_counter() - t0:.0f} s)")
    return code


def load_all(outdir: Path) -> dict[str, Results]:
    out: dict[str, Results] = {}
    for name in ORDER:
        path = outdir / f"{name}.json"
        if path.exists():
            out[name] = json.loads(path.read_text()).get("results") or {}
    return out


def key_figures(r: dict[str, Results]) -> list[list[str]]:
    rows: list[list[str]] = []
    intake = r.get("intake", {})
    bare_h = {c: med(v, "rate") for c, v in intake.get("bare_http", {}).items()}
    for backend, b in intake.get("backends", {}).items():
        ours, bare = med(b["storage"][OURS]["16"], "rate"), med(b["storage"][BARE]["16"], "rate")
        rate = f"{fmt.rate(ours)} jobs/s"
        rows.append([f"intake, storage layer, {backend}, c16", rate, f"bare loop {fmt.rate(bare)}"])
        rows[-1].append(fmt.pct(ratio(ours, bare)))
        for mode, per_c in b["http"].items():
            for c in ("16", "64"):  # c1 is in the intake table
                rs = per_c[c]
                rate = f"{fmt.rate(med(rs, 'ok_rate'))} jobs/s, p99 {fmt.ms(med(rs, 'p99_ms'))} ms"
                rows.append([f"intake, HTTP, {backend}, {mode}, c{c}", rate])
                vs_bare = fmt.pct(ratio(med(rs, "ok_rate"), bare_h[c]))
                rows[-1] += [f"bare HTTP {fmt.rate(bare_h[c])}", vs_bare]
    for backend, res in r.get("relay", {}).items():
        for ep in ("stub", "moto"):
            if f"{ep}: Relay.relay_pass" in res:
                rr = med(res[f"{ep}: Relay.relay_pass"], "rate")
                bb = med(res[f"{ep}: bare send_message_batch"], "rate")
                rows.append([f"relay, {backend}, {ep}", f"{fmt.rate(rr)} msg/s"])
                rows[-1] += [f"bare {fmt.rate(bb)}", fmt.pct(ratio(rr, bb))]
                if f"{ep}: bare JSON-client loop" in res:
                    own = med(res[f"{ep}: bare JSON-client loop"], "rate")
                    rows.append([f"relay, {backend}, {ep}", f"{fmt.rate(rr)} msg/s"])
                    rows[-1] += [f"bare JSON client {fmt.rate(own)}", fmt.pct(ratio(rr, own))]
    for name, rs in r.get("peers", {}).items():
        peer_rate = med(rs, "ok_rate" if "ok_rate" in rs[0] else "rate")
        rows.append([f"peers, {name}", f"{fmt.rate(peer_rate)} jobs/s", "", ""])
    for name, rs in r.get("door", {}).items():
        rate = f"{fmt.rate(med(rs, 'ok_rate'))} jobs/s, p99 {fmt.ms(med(rs, 'p99_ms'))} ms"
        rows.append([f"the door, c16, {name}", rate, "", ""])
    for backend, res in r.get("claimer", {}).items():
        first, last, pr = res["stages"][0], res["stages"][-1], res["prune"]
        p0, p1 = first["claims"]["both_p50"], last["claims"]["both_p50"]
        growth = f"{ratio(p1, p0):.2f}×"
        rows.append([f"claim+complete p50, {backend}", f"{fmt.ms(p0)} → {fmt.ms(p1)} ms"])
        rows[-1] += [f"{first['rows']:,} → {last['rows']:,} rows", growth]
        rows.append([f"prune, {backend}", f"{pr['seconds']:.1f} s"])
        rows[-1] += [f"{sum(pr['before'].values()):,} → {sum(pr['after'].values()):,} rows", ""]
    for backend, res in r.get("e2e", {}).items():
        xs = res["accepted_to_started"]
        lat = f"p50 {fmt.ms(percentile(xs, 50))} ms, p99 {fmt.ms(percentile(xs, 99))} ms"
        rows.append([f"accepted → started, {backend}", lat, f"{len(xs)} jobs", ""])
    for backend, res in r.get("waiters", {}).items():
        grew = res["rss_held"] - res["rss_before"]
        done = res["all_answered_s"]
        text = f"RSS +{fmt.mib(grew)} MiB, /healthz p99 {fmt.ms(res['healthz_p99_ms'])} ms"
        rows.append([f"{res['held']:,} held waiters, {backend}", text])
        rows[-1] += [
            f"all answered {'never' if done is None else f'{done:.2f} s'} after the change"
        ]
        rows[-1].append("")
    for label, res in r.get("pgcost", {}).get("runs", {}).items():
        pj = res["per_job"]
        text = f"{pj['wal_bytes']:,.0f} WAL bytes, {pj['xact_commit']:.1f} commits"
        rows.append([f"one job's life on Postgres, {label}", text])
        rows[-1] += [f"{pj['tup_inserted']:.0f} rows in, {pj['tup_updated']:.0f} updated", ""]
    sqsreq = r.get("sqsreq", {})
    for label, res in sqsreq.get("runs", {}).items():
        name = "this commit" if label == "this" else label
        text = f"{describe(res)}, {res['empty_receives']} empty receives"
        rows.append([f"SQS requests per job, c16, {name}", text, "", ""])
    if "footprint" in r:
        i, ld = r["footprint"]["idle"], r["footprint"]["load"]
        idle = f"CPU {i['cpu']:.2%}, RSS {fmt.mib(i['rss_max'])} MiB"
        rows.append(["idle daemon", idle, f"moto child {fmt.mib(i['moto_rss'])} MiB", ""])
        if "e2e" in r["footprint"]:
            e = r["footprint"]["e2e"]
            text = f"{fmt.rate(e['rate'])} jobs SUCCEEDED/s, run p50 {fmt.ms(e['run_p50_ms'])} ms"
            cpu = f"daemon CPU {fmt.pct(e['cpu'])}, moto {fmt.pct(e['moto_cpu'])}"
            rows.append(["embedded default end to end (c16, fake portal)", text, cpu, ""])
        load = f"{fmt.rate(ld['ok_rate'])} jobs/s via moto"
        rows.append(["daemon under load (c16)", f"RSS {fmt.mib(ld['rss_max'])} MiB", load, ""])
    return rows


def goals(r: dict[str, Results]) -> list[tuple[bool, str, str]]:
    """(passed, goal, what was measured) for each goal; a goal not measured is missed."""
    out: list[tuple[bool, str, str]] = []

    def line(goal: str, parts: list[tuple[bool, str]]) -> None:
        ok = bool(parts) and all(p for p, _ in parts)
        texts = [f"{t} ({'met' if p else 'missed'})" for p, t in parts]
        out.append((ok, goal, "; ".join(texts) or "not measured in this run"))

    intake = r.get("intake", {}).get("backends", {})
    parts = []
    for backend, b in intake.items():
        on = {c: med(b["http"][STUB][c], "ok_rate") for c in ("16", "64") if STUB in b["http"]}
        off = {c: med(b["http"][OFF][c], "ok_rate") for c in ("16", "64")}
        if not on:
            continue
        # c16 is bound by batch fill (decision 0027): shown, no longer judged.
        r16, r64 = ratio(on["16"], off["16"]), ratio(on["64"], off["64"])
        text = f"{backend} c64 {fmt.rate(on['64'])}/{fmt.rate(off['64'])} = {fmt.pct(r64)} "
        text += f"(c16 {fmt.pct(r16)})"
        parts.append((r64 >= 0.7, text))
    line("guard: HTTP intake with dispatch on (stub SQS) ≥ 0.7× dispatch off at c64", parts)

    parts = []
    for backend, res in r.get("relay", {}).items():
        rr = med(res["stub: Relay.relay_pass"], "rate")
        boto = med(res["stub: bare send_message_batch"], "rate")
        # The ceiling is what this machine can send: the faster of the two bare loops
        # (aiobotocore's, and the JSON client's the relay itself sends with).
        own = med(res.get("stub: bare JSON-client loop", []), "rate") if BARE_JSON in res else 0.0
        bb = max(boto, own)
        text = f"{backend} {fmt.rate(rr)} vs {fmt.rate(bb)} msg/s = {fmt.pct(ratio(rr, bb))}"
        text += f" (bare aiobotocore {fmt.rate(boto)}, bare JSON client {fmt.rate(own)}"
        if "relay, no SQS" in res:
            # What the database and the bookkeeping alone allow (no SQS at all): a ceiling
            # of the relay's own, beside the machine's.
            alone = med(res["relay, no SQS"], "rate")
            text += f"; the relay with no SQS {fmt.rate(alone)} = {fmt.pct(ratio(alone, bb))}"
        text += ")"
        parts.append((ratio(rr, bb) >= 0.7, text))
    line("guard: relay ≥ 0.7× the faster bare batch-send loop against the stub", parts)


    parts = []
    for backend, res in r.get("sustained", {}).items():
        ol = res["open_loop"]
        bound = res["offered_rate"]  # a second's worth of requests
        drain = res["drain_s"]
        ok = ol["p99_ms"] <= 20 and res["backlog_max"] <= bound and drain is not None
        ok = ok and drain <= 1.0 and ol["ok_rate"] >= 0.95 * res["offered_rate"]
        text = f"{backend} {fmt.rate(res['offered_rate'])} req/s offered "
        text += f"({fmt.pct(ratio(res['offered_rate'], res['capacity']['ok_rate']))} of capacity), "
        text += f"{fmt.rate(ol['ok_rate'])} answered, p99 {fmt.ms(ol['p99_ms'])} ms, backlog max "
        text += f"{res['backlog_max']}, all SENT {'never' if drain is None else f'{drain:.2f} s'}"
        text += " after the end"
        parts.append((ok, text))
    goal = "sustained: open loop at 60% of capacity (dispatch on) for 30 s, p99 ≤ 20 ms"
    line(goal + ", backlog ≤ 1 s of requests, every job SENT within 1 s of the end", parts)

    parts = []
    for backend, b in intake.items():
        for mode in ("off", "stub"):
            base = b["http"].get(f"{BASELINE} {mode}")
            if base is None:
                continue
            for c in ("16", "64"):
                ours, theirs = b["http"][f"dispatch {mode}"][c], base[c]
                # Trial i of ours ran right beside trial i of the baseline: judge by the
                # median of those paired ratios, and show their spread.
                trials = zip(ours, theirs, strict=True)
                pairs = sorted(ratio(o["ok_rate"], t["ok_rate"]) for o, t in trials)
                paired = median(pairs)
                text = f"{backend} dispatch {mode} c{c} {fmt.rate(med(ours, 'ok_rate'))} vs "
                text += f"{fmt.rate(med(theirs, 'ok_rate'))}, paired {fmt.pct(paired)} "
                text += f"({fmt.pct(pairs[0])}-{fmt.pct(pairs[-1])})"
                parts.append((paired >= 0.9, text))
    if parts:
        rev = r.get("intake", {}).get("baseline", "?")
        line(f"intake and dispatch ≥ 0.9× the baseline {rev}, interleaved (c16, c64)", parts)

    parts = []
    peers = r.get("peers", {})
    if peers:
        ours = med(peers["ours: SqlStore.create_portal_job"], "rate")
        for label, need in (("pgqueuer enqueue", 3.0), ("procrastinate defer_async", 3.0)):
            theirs = med(peers[label], "rate")
            text = f"{fmt.rate(ours)} vs {label} {fmt.rate(theirs)} = {ratio(ours, theirs):.2f}×"
            parts.append((ratio(ours, theirs) >= need, text))
    goal = "guard: storage-layer intake ≥ 3× pgqueuer enqueue and ≥ 3× procrastinate defer_async"
    line(goal + " (Postgres)", parts)

    parts = []
    door = r.get("door", {})
    if door:
        # Each trial of ours ran right beside the same trial of each peer: paired ratios.
        for mode, need in ((DOOR_OFF, 1.5), (DOOR_ON, 1.0)):
            for label in DOOR_PEERS.values():
                pairs = door_paired(door[mode], door[label])
                text = f"{mode} {fmt.rate(med(door[mode], 'ok_rate'))} vs {label} "
                text += f"{fmt.rate(med(door[label], 'ok_rate'))} = {median(pairs):.2f}× "
                text += f"({pairs[0]:.2f}-{pairs[-1]:.2f})"
                parts.append((median(pairs) >= need, text))
    goal = "the door: the API (Postgres, c16) ≥ 1.5× an aiohttp handler over pgqueuer and over"
    line(goal + " procrastinate with dispatch off, ≥ 1.0× both with dispatch on, paired", parts)

    parts = []
    for backend, res in r.get("waiters", {}).items():
        grew, p99 = res["rss_held"] - res["rss_before"], res["healthz_p99_ms"]
        # Per 10,000 held, should a run hold fewer (the listen backlog, a refused connection).
        per_10k = grew * 10_000 / res["held"] if res["held"] else float("inf")
        answered = res["answered"] == res["held"] and res["all_answered_s"] is not None
        text = f"{backend} {res['held']:,} held, RSS +{fmt.mib(per_10k)} MiB per 10,000, "
        text += f"/healthz p99 {fmt.ms(p99)} ms, {res['answered']:,} answered"
        parts.append((per_10k <= 100 * 2**20 and p99 <= 50 and answered, text))
    goal = "10,000 held Prefer: wait requests add ≤ 100 MiB of RSS, /healthz p99 ≤ 50 ms while"
    line(goal + " held, every one answered after the change", parts)

    parts = []
    if "sqlite" in intake:
        st = intake["sqlite"]["storage"]
        ours, bare = med(st[OURS]["16"], "rate"), med(st[BARE]["16"], "rate")
        text = f"{fmt.rate(ours)} vs {fmt.rate(bare)} jobs/s = {ratio(ours, bare):.2f}×"
        parts.append((ratio(ours, bare) >= 1.5, text))
    line("guard: SQLite storage-layer intake ≥ 1.5× the bare one-transaction-per-job loop", parts)

    parts = []
    runs = r.get("sqsreq", {}).get("runs", {})
    if "this" in runs:
        this = runs["this"]
        ok = this["succeeded"] == this["jobs"] and per_job(this)["total"] <= 0.6
        text = describe(this)
        for label, res in runs.items():
            if label != "this":
                text += f" vs {label} {per_job(res)['total']:.2f}"
        parts.append((ok, text))
    line("SQS requests per job end to end ≤ 0.6 at c16", parts)

    parts = []
    if "pgcost" in r:
        # Issue #46: half the Postgres work per job. Commits and WAL from the run with group
        # commit on; the rate beside the previous release, each trial a pair run back to back.
        pj = r["pgcost"]["runs"]["group commit on"]["per_job"]
        parts.append((pj["xact_commit"] <= 5, f"{pj['xact_commit']:.2f} commits/job"))
        parts.append((pj["wal_bytes"] <= 4500, f"{pj['wal_bytes']:,.0f} WAL bytes/job"))
        prev = r["pgcost"]["previous"]
        pairs = sorted(t["ratio"] for t in prev["trials"])
        ours = median([t["ours"]["jobs_per_s"] for t in prev["trials"]])
        theirs = median([t["previous"]["jobs_per_s"] for t in prev["trials"]])
        text = f"whole life {fmt.rate(ours)} vs {prev['previous']}'s {fmt.rate(theirs)} jobs/s, "
        text += f"paired {prev['paired_ratio']:.2f}× ({pairs[0]:.2f}-{pairs[-1]:.2f}×)"
        parts.append((prev["paired_ratio"] >= 1.6, text))
    goal = "one job's whole life on Postgres (group commit on): ≤ 5 commits, ≤ 4,500 WAL bytes"
    line(goal + ", jobs/s ≥ 1.6× the previous release's (5f8e556), paired trials", parts)

    parts = []
    for backend, res in r.get("e2e", {}).items():
        p50 = percentile(res["accepted_to_started"], 50)
        parts.append((p50 <= 15, f"{backend} p50 {fmt.ms(p50)} ms"))
    if "footprint" in r:
        i = r["footprint"]["idle"]
        parts.append((i["cpu"] < 0.01, f"idle CPU {i['cpu']:.2%}"))
        parts.append((i["rss_max"] < 120 * 2**20, f"idle RSS {fmt.mib(i['rss_max'])} MiB"))
    line("guard: accepted → handler started p50 ≤ 15 ms; idle CPU < 1%; idle RSS < 120 MiB", parts)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="a few-minute version")
    p.add_argument("--only", help="comma-separated subset of: " + ",".join(ORDER))
    p.add_argument("--sizes", help="claimer row counts, e.g. 10000,100000,1000000")
    p.add_argument("--backends", help="sqlite,postgres (default: both)")
    p.add_argument("--baseline", help="intake: another commit's API beside this one's (REV)")
    args = p.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(ORDER)
    if set(names) - set(ORDER):
        p.error(f"unknown benchmark(s) in {args.only}")
    kind = "quick" if args.quick else "full"
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ("-quick" if args.quick else "")
    outdir = BENCH / "results" / stamp
    outdir.mkdir(parents=True, exist_ok=True)
    start, commit, t0 = machine_line(), code_version(), time.perf_counter()
    emit(f"# outboxd benchmarks ({kind} run)\nstart: {start}  commit {commit}\nresults: {outdir}")
    codes = {name: run_one(name, outdir, args) for name in names}
    emit(f"\n# Summary ({kind} run, {(time.perf_counter() - t0) / 60:.1f} min)")
    end_commit = code_version()
    emit(f"start: {start}  commit {commit}\nend:   {machine_line()}  commit {end_commit}")
    if end_commit != commit:
        emit("WARNING: the code changed during the run; benchmarks ran on different versions")
    emit("(2 cores: a load average above 2 means other work was queued for the CPU)")
    results = load_all(outdir)
    head = ["measure", "ours", "beside", "ratio"]
    emit(table("Key figures (medians; ratios measured in this run)", head, key_figures(results)))
    emit("\n### Goals (docs/performance.md; all measured side by side in this run)")
    verdicts = goals(results)
    for ok, goal, measured in verdicts:
        emit(f"[{'PASS' if ok else 'MISS'}] {goal}: {measured}")
    failed = [n for n, c in codes.items() if c != 0]
    if failed:
        emit(f"\nbenchmarks that failed: {', '.join(failed)} (see {outdir}/<name>.txt)")
    summary = {"start": start, "end": machine_line(), "codes": codes, "goals": verdicts}
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
