"""Run every benchmark side by side and print a summary with the goals (PASS/MISS).

Called by `bench/run`; each benchmark runs as its own process (`python -m bench.<name>`),
prints its tables as it goes, and leaves JSON in bench/results/<timestamp>/.

    bench/run [--quick] [--only intake,relay,...] [--profile] [--sizes N,N,N]
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.common import (
    BENCH,
    PY,
    ROOT,
    emit,
    f_ms,
    f_pct,
    f_rate,
    loadavg,
    machine_line,
    median,
    table,
    verdict,
)

ORDER = ("intake", "relay", "peers", "claimer", "e2e", "footprint")


def code_version() -> str:
    """The commit under test, and whether src/ differs from it (read-only git calls)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    dirty = subprocess.run(
        ["git", "status", "--porcelain", "--", "src"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    return (head or "?") + (" (src/ modified)" if dirty else "")


def run_one(name: str, outdir: Path, args: argparse.Namespace) -> int:
    argv = [PY, "-m", f"bench.{name}", "--json-out", str(outdir / f"{name}.json")]
    if args.quick:
        argv.append("--quick")
    if args.backends and name in ("intake", "relay", "claimer", "e2e"):
        argv += ["--backends", args.backends]
    if args.profile and name in ("intake", "relay"):
        argv.append("--profile")
    if args.sizes and name == "claimer":
        argv += ["--sizes", args.sizes]
    t0 = time.perf_counter()
    with (outdir / f"{name}.txt").open("w", encoding="utf-8") as log:
        proc = subprocess.Popen(
            argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(line)
            sys.stdout.flush()
            log.write(line)
        code = proc.wait()
    emit(f"({name}: exit {code}, {time.perf_counter() - t0:.0f} s)")
    return code


def _load(outdir: Path, name: str) -> dict[str, Any] | None:
    path = outdir / f"{name}.json"
    if not path.exists():
        return None
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def _med(rs: list[dict[str, Any]], key: str) -> float:
    return median([r[key] for r in rs if r.get(key) is not None])


def key_figures(outdir: Path) -> list[list[str]]:
    rows: list[list[str]] = []
    intake = _load(outdir, "intake")
    if intake:
        res = intake["results"]
        bare_h = {int(c): _med(v, "rate") for c, v in res["bare_http"].items()}
        for backend, b in res["backends"].items():
            st = b["storage"]
            ours = _med(st["ours: create_portal_job"]["16"], "rate")
            bare = _med(st["bare: BEGIN+2 INSERT+COMMIT"]["16"], "rate")
            rows.append(
                [
                    f"intake, storage layer, {backend}, c16",
                    f"{f_rate(ours)} jobs/s",
                    f"bare loop {f_rate(bare)}",
                    f_pct(ours / bare if bare else math.nan),
                ]
            )
            for mode, per_c in b["http"].items():
                for c in ("1", "16", "64"):
                    rate = _med(per_c[c], "ok_rate")
                    rows.append(
                        [
                            f"intake, HTTP, {backend}, {mode}, c{c}",
                            f"{f_rate(rate)} jobs/s, p99 {f_ms(_med(per_c[c], 'p99_ms'))} ms",
                            f"bare HTTP {f_rate(bare_h[int(c)])}",
                            f_pct(rate / bare_h[int(c)]),
                        ]
                    )
    relay = _load(outdir, "relay")
    if relay:
        for backend, res in relay["results"].items():
            for ep in ("stub", "moto"):
                if f"{ep}: Relay.relay_once" not in res:
                    continue
                rr = median([r["rate"] for r in res[f"{ep}: Relay.relay_once"]])
                bb = median([r["rate"] for r in res[f"{ep}: bare send_message_batch"]])
                rows.append(
                    [
                        f"relay, {backend}, {ep}",
                        f"{f_rate(rr)} msg/s",
                        f"bare {f_rate(bb)}",
                        f_pct(rr / bb if bb else math.nan),
                    ]
                )
    peers = _load(outdir, "peers")
    if peers and "results" in peers:
        for name, rs in peers["results"].items():
            rate = median([r.get("ok_rate", r["rate"]) for r in rs])
            rows.append([f"peers, {name}", f"{f_rate(rate)} jobs/s", "", ""])
    claimer = _load(outdir, "claimer")
    if claimer:
        for backend, res in claimer["results"].items():
            first, last = res["stages"][0], res["stages"][-1]
            rows.append(
                [
                    f"claim+complete p50, {backend}",
                    f"{f_ms(first['claims']['both_p50'])} → {f_ms(last['claims']['both_p50'])} ms",
                    f"{first['rows']:,} → {last['rows']:,} rows",
                    f"{last['claims']['both_p50'] / first['claims']['both_p50']:.2f}×",
                ]
            )
            pr = res["prune"]
            rows.append(
                [
                    f"prune, {backend}",
                    f"{pr['seconds']:.1f} s",
                    f"{sum(pr['before'].values()):,} → {sum(pr['after'].values()):,} rows",
                    "",
                ]
            )
    e2e = _load(outdir, "e2e")
    if e2e:
        from bench.common import percentile

        for backend, r in e2e["results"].items():
            xs = r["accepted_to_started"]
            rows.append(
                [
                    f"accepted → started, {backend}",
                    f"p50 {f_ms(percentile(xs, 50))} ms, p99 {f_ms(percentile(xs, 99))} ms",
                    f"{len(xs)} jobs",
                    "",
                ]
            )
    fp = _load(outdir, "footprint")
    if fp:
        i, ld = fp["results"]["idle"], fp["results"]["load"]
        rows.append(
            [
                "idle daemon",
                f"CPU {i['cpu']:.2%}, RSS {i['rss_max'] / 2**20:.1f} MiB",
                f"moto child {i['moto_rss'] / 2**20:.1f} MiB",
                "",
            ]
        )
        rows.append(
            [
                "daemon under load (c16)",
                f"RSS {ld['rss_max'] / 2**20:.1f} MiB",
                f"{f_rate(ld['ok_rate'])} jobs/s via moto",
                "",
            ]
        )
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--quick", action="store_true", help="a few-minute version")
    p.add_argument("--only", help="comma-separated subset of: " + ",".join(ORDER))
    p.add_argument("--profile", action="store_true", help="py-spy the intake server and relay")
    p.add_argument("--sizes", help="claimer row counts, e.g. 10000,100000,1000000")
    p.add_argument("--backends", help="sqlite,postgres (default: both)")
    args = p.parse_args()
    names = [n.strip() for n in args.only.split(",")] if args.only else list(ORDER)
    unknown = set(names) - set(ORDER)
    if unknown:
        p.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ") + ("-quick" if args.quick else "")
    outdir = BENCH / "results" / stamp
    outdir.mkdir(parents=True, exist_ok=True)
    start_line, la0, t0 = machine_line(), loadavg(), time.perf_counter()
    commit = code_version()
    emit(f"# outboxd benchmarks ({'quick' if args.quick else 'full'} run)")
    emit(f"start: {start_line}  commit {commit}")
    emit(f"results: {outdir}")
    codes = {name: run_one(name, outdir, args) for name in names}
    la1 = loadavg()
    emit(
        f"\n# Summary ({'quick' if args.quick else 'full'} run, "
        f"{(time.perf_counter() - t0) / 60:.1f} min)"
    )
    emit(f"start: {start_line}  commit {commit}")
    end_commit = code_version()
    emit(f"end:   {machine_line()}  commit {end_commit}")
    if end_commit != commit:
        emit("WARNING: the code changed during the run; benchmarks ran on different versions")
    emit(
        "loadavg start → end: "
        + " ".join(f"{x:.2f}" for x in la0)
        + " → "
        + " ".join(f"{x:.2f}" for x in la1)
        + " (2 cores: above 2 means other work was queued for the CPU)"
    )
    emit(
        table(
            "Key figures (medians; ratios measured in this run)",
            ["measure", "ours", "beside", "ratio"],
            key_figures(outdir),
        )
    )
    emit("\n### Goals")
    for name in names:
        data = _load(outdir, name)
        for g in (data or {}).get("goals", []):
            emit(f"- [{verdict(g['pass'])}] {g['name']}: {g['text']}")
    failed = [n for n, c in codes.items() if c != 0]
    if failed:
        emit(f"\nbenchmarks that failed: {', '.join(failed)} (see {outdir}/<name>.txt)")
    (outdir / "summary.json").write_text(
        json.dumps(
            {"start": start_line, "end": machine_line(), "loadavg": [la0, la1], "codes": codes},
            indent=2,
        )
    )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
