"""SQS requests per job, end to end, counted at the SQS endpoint; this commit beside an earlier one.

The daemon runs as a subprocess (`outboxd serve`, all roles) on SQLite, against moto (the
server the embedded default starts as its child, here started by the benchmark) through a
counting proxy on loopback (bench/sqscount.py): every SQS call the daemon makes passes the
proxy, which counts it by action. The fake Suwon portal answers at once; its pace is
opened (`scrapers.suwon.min_interval_s = 0`, `max_concurrency` = the consumer's 4) and the
login lock is off (`max_auth_failures = 0`: every job logs in as the one sample student, and
tries under way would otherwise make jobs wait), so neither the portal nor the lock sets
the pace. Everything else is the default: `consumer.max_concurrency = 4`, long polls of
20 s, visibility 60 s, heartbeats every 20 s.

16 clients submit `--jobs` portal jobs (each POST waits for its 202, as a client does),
then the benchmark waits until every job is SUCCEEDED and the jobs queue is empty (every
message deleted), and reads the proxy's counters. Requests per job = the requests of the
window / jobs SUCCEEDED, by action; ReceiveMessage calls answered empty are counted apart
(a long poll that runs out costs a request per 20 s per queue, whatever the load).

The same is run with the daemon of the previous release (`--previous`, default 5f8e556),
built from git history (a scratch worktree, `bench/previous.py`, its `src/` first on
PYTHONPATH, the same virtualenv), in the same run.

    python -m bench.sqsreq [--quick] [--jobs N] [--previous REV] [--json-out F]
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
from testkit.daemon import PORTAL_MODULE, SAMPLE_PASSWORD, SAMPLE_SNO, DaemonProcess, FakeProcess
from testkit.moto import MotoServer

from bench import fmt
from bench.common import Bench, CpuWindow, Results, emit, percentile, table, workdir
from bench.e2e import ready
from bench.previous import short, tree_of

PREVIOUS = "5f8e556"
CLIENTS = 16
# The actions a job's message costs, in the order the table shows them.
ACTIONS = (
    ("send", ("SendMessage", "SendMessageBatch")),
    ("receive", ("ReceiveMessage",)),
    ("delete", ("DeleteMessage", "DeleteMessageBatch")),
    ("visibility", ("ChangeMessageVisibility", "ChangeMessageVisibilityBatch")),
)


def proxy_counts(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + "/counts", timeout=10) as resp:  # noqa: S310 (loopback)
        counts: dict[str, Any] = json.loads(resp.read())
    return counts


def jobs_left(moto_url: str) -> int:
    """Messages still in the jobs queue (visible or in flight), asked of moto directly (the
    proxy does not count it)."""
    import boto3

    client = boto3.client(
        "sqs",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    )
    try:
        url = client.get_queue_url(QueueName="outboxd-jobs")["QueueUrl"]
        names = ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"]
        attrs = client.get_queue_attributes(QueueUrl=url, AttributeNames=names)["Attributes"]
        return sum(int(attrs.get(n, 0)) for n in names)
    finally:
        client.close()


def daemon_config(portal: dict[str, Any], sqs_url: str, tree: Path | None) -> dict[str, Any]:
    suwon: dict[str, Any] = {
        "portal_base_url": portal["portal_base_url"],
        "info_base_url": portal["info_base_url"],
        "min_interval_s": 0.0,
        "max_concurrency": 4,
        "max_auth_failures": 0,
        "max_auth_failures_total": 0,
    }
    if tree is not None:  # an earlier release knows fewer keys, and refuses the others
        known = (tree / "src" / "outboxd" / "config.py").read_text()
        suwon = {k: v for k, v in suwon.items() if f"{k}:" in known}
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": "sqlite:///var/outboxd.db"},
        "sqs": {"endpoint_url": sqs_url},
        "scrapers": {"suwon": suwon},
        "logging": {"level": "info", "format": "json"},
    }


async def submit(base_url: str, n: int, clients: int, tag: str) -> list[dict[str, Any]]:
    """`n` portal jobs from `clients` clients, each POSTing its next when answered."""
    out: list[dict[str, Any]] = []
    counter = iter(range(n))

    async def client(http: aiohttp.ClientSession) -> None:
        for i in counter:
            t0 = time.time()
            async with http.post(
                f"{base_url}/v1/portal-link-jobs",
                json={"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD},
                headers={"Idempotency-Key": f"sqsreq-{tag}-{i}"},
            ) as resp:
                body = await resp.json()
                if resp.status != 202:
                    raise RuntimeError(f"POST answered {resp.status}: {body}")
            out.append({"job_id": body["jobId"], "sent": t0, "answered": time.time()})

    connector = aiohttp.TCPConnector(limit=clients)
    async with aiohttp.ClientSession(connector=connector) as http:
        await asyncio.gather(*(client(http) for _ in range(clients)))
    return out


def run_one(label: str, wd: Path, n: int, tree: Path | None) -> Results:
    from outboxd.security import generate_key

    here = wd / label
    here.mkdir(parents=True)
    moto = MotoServer(here / "moto.log")
    moto_url = moto.start(timeout_s=60)
    proxy = portal = daemon = None
    try:
        proxy = FakeProcess(here, "bench.sqscount", "--upstream", moto_url, timeout_s=60)
        portal = FakeProcess(here, PORTAL_MODULE)
        sqs_url = proxy.info["endpoint_url"]
        env = {"OUTBOXD_SECRET_KEYS": generate_key()}
        if tree is not None:
            env["PYTHONPATH"] = str(tree / "src")
        config = daemon_config(portal.info, sqs_url, tree)
        daemon = DaemonProcess(here / "daemon", config, env=env, name=f"sqsreq-{label}")
        base = ready(daemon)
        time.sleep(1.0)
        before = proxy_counts(sqs_url)
        win = CpuWindow({"daemon": daemon.pid, "moto": moto.pid, "proxy": proxy.pid})
        win.start()
        t0 = time.perf_counter()
        sent = asyncio.run(submit(base, n, CLIENTS, label))
        submitted_s = time.perf_counter() - t0
        ids = {s["job_id"] for s in sent}
        deadline = time.monotonic() + 120
        done: dict[str, float] = {}
        while True:
            for e in daemon.events():
                if e.get("event") == "job_succeeded" and e.get("job_id") in ids:
                    done.setdefault(str(e["job_id"]), time.time())
            if len(done) == len(ids) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        all_done_s = time.perf_counter() - t0
        # Every message deleted: a delete that leaves after its job's outcome counts too.
        while jobs_left(moto_url) and time.monotonic() < deadline:
            time.sleep(0.1)
        win.stop()
        after = proxy_counts(sqs_url)
    finally:
        for proc in (daemon,):
            if proc is not None and proc.running():
                proc.terminate()
        for fake in (portal, proxy):
            if fake is not None:
                fake.stop()
        moto.stop()
    requests = {
        k: after["requests"].get(k, 0) - before["requests"].get(k, 0) for k in after["requests"]
    }
    entries = {
        k: after["entries"].get(k, 0) - before["entries"].get(k, 0) for k in after["entries"]
    }
    latencies = [(s["answered"] - s["sent"]) * 1000 for s in sent]
    return {
        "jobs": n,
        "succeeded": len(done),
        "requests": {k: v for k, v in requests.items() if v},
        "entries": {k: v for k, v in entries.items() if v},
        "empty_receives": after["empty_receives"] - before["empty_receives"],
        "received": after["received"] - before["received"],
        "submitted_s": submitted_s,
        "all_done_s": all_done_s,
        "post_p50_ms": percentile(latencies, 50),
        "cpu": win.shares(),
        "window_s": win.wall_s,
    }


def per_job(r: Results) -> dict[str, float]:
    """Requests per SUCCEEDED job by action group, empty receives left out (they are per
    time); `total` the sum, `other` whatever else was called in the window."""
    jobs = max(1, r["succeeded"])
    reqs = dict(r["requests"])
    reqs["ReceiveMessage"] = reqs.get("ReceiveMessage", 0) - r["empty_receives"]
    out: dict[str, float] = {}
    for group, names in ACTIONS:
        out[group] = sum(reqs.pop(n, 0) for n in names) / jobs
    out["other"] = sum(reqs.values()) / jobs
    out["total"] = sum(out.values())
    return out


def describe(r: Results) -> str:
    pj = per_job(r)
    parts = ", ".join(f"{g} {pj[g]:.2f}" for g, _ in ACTIONS if pj[g] or g != "visibility")
    return f"{pj['total']:.2f} ({parts})"


async def main_async() -> int:
    bench = Bench.parse(
        "sqsreq",
        __doc__,
        {
            "--jobs": {"type": int, "help": "jobs per daemon (default 400, --quick 240)"},
            "--previous": {
                "default": PREVIOUS,
                "help": 'the earlier commit beside this one ("": none)',
            },
        },
    )
    args = bench.args
    n = args.jobs or (240 if args.quick else 400)
    bench.heading("SQS requests per job, end to end")
    emit(
        f"{n} portal jobs from {CLIENTS} clients, each daemon on SQLite against moto through a "
        "counting proxy; fake portal at once, pace open, login lock off; consumer defaults"
    )
    rev = ""
    if args.previous:  # `--previous ""`: this commit alone
        rev = short(args.previous)
    results: dict[str, Any] = {"previous": rev, "runs": {}}
    with workdir("sqsreq") as wd:
        results["runs"]["this"] = await asyncio.to_thread(run_one, "this", wd, n, None)
        if rev:
            with tree_of(rev, wd) as tree:
                assert tree is not None
                results["runs"][rev] = await asyncio.to_thread(run_one, rev, wd, n, tree)
    rows = []
    for label, r in results["runs"].items():
        pj = per_job(r)
        answered = r["requests"].get("ReceiveMessage", 0) - r["empty_receives"]
        batch = {
            k: f"{r['entries'][k] / r['requests'][k]:.1f}" for k in r["entries"] if r["requests"][k]
        }
        rows.append(
            [
                label,
                f"{r['succeeded']}/{r['jobs']}",
                *(f"{pj[g]:.2f}" for g, _ in ACTIONS),
                f"{pj['other']:.2f}",
                f"{pj['total']:.2f}",
                r["empty_receives"],
                f"{r['received'] / max(1, answered):.1f}",
                ", ".join(f"{k} {v}" for k, v in batch.items()) or "-",
                f"{r['succeeded'] / r['all_done_s']:.0f}",
                fmt.pct(r["cpu"]["daemon"]),
                fmt.pct(r["cpu"]["moto"]),
            ]
        )
    head = ["daemon", "SUCCEEDED", "send", "receive", "delete", "visibility", "other", "total"]
    head += ["empty receives", "msgs/receive", "entries/batch", "jobs/s", "daemon CPU"]
    head.append("moto CPU")
    emit(
        table(
            f"SQS requests per SUCCEEDED job, c{CLIENTS} (counted at the endpoint)",
            head,
            rows,
            "Per job: the window's requests by action / jobs SUCCEEDED; receives answered empty "
            "(long polls that ran out, per time) are left out and counted apart. Window: first "
            "POST until every job SUCCEEDED and the jobs queue empty. jobs/s and CPU on a shared "
            "machine: only the counts are robust.\n"
            + "\n".join(
                f"{label}: " + ", ".join(f"{k} {v}" for k, v in sorted(r["requests"].items()))
                for label, r in results["runs"].items()
            ),
        )
    )
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
