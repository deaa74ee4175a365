"""Relay: outbox → SQS messages/s in batches of 10, beside a bare send_message_batch loop.

Per backend and per SQS endpoint (the stub in `bench/sqs_stub.py`, and moto), in one run,
trials interleaved:

- bare: an aiobotocore client calling `send_message_batch` with 10 entries, in a loop;
- adapter: our `SqsQueues.send_batch` in a loop (no database);
- relay: `Relay.relay_once` until the pre-filled outbox is empty (claim, publish, mark SENT);
- relay, no SQS: the same with a publisher that acknowledges in-process (database and
  bookkeeping alone; once per backend).

    python -m bench.relay [--quick] [--backends sqlite,postgres] [--json-out F]
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench import profile
from bench.common import (
    CpuWindow,
    MotoChild,
    StubChild,
    backends_arg,
    base_parser,
    database,
    emit,
    f_pct,
    f_rate,
    goal,
    machine_line,
    median,
    open_migrated_store,
    purge_queue,
    quiet_logging,
    ratio,
    save,
    table,
    verdict,
    workdir,
)
from bench.roundtrips import counting

BATCH = 10


async def prefill(backend: str, url: str, n: int) -> None:
    """n jobs, each with a PENDING relay row due now (bulk: COPY / executemany)."""
    now = time.time() - 1
    sealed = os.urandom(96)
    jobs, relays = [], []
    for i in range(n):
        jid, oid = str(uuid.uuid4()), str(uuid.uuid4())
        jobs.append(
            (
                jid,
                "portal_link",
                "suwon",
                "bench",
                f"relay-{jid}",
                "k1:00",
                "QUEUED",
                "k1",
                sealed,
                now,
                now,
            )
        )
        relays.append((oid, "job", jid, "PENDING", now + i * 1e-6, jid, now))
    job_cols = [
        "id",
        "kind",
        "portal",
        "user_id",
        "idempotency_key",
        "fingerprint",
        "status",
        "key_id",
        "sealed",
        "created_at",
        "updated_at",
    ]
    relay_cols = ["id", "kind", "job_id", "status", "next_attempt_at", "dedup_id", "created_at"]
    if backend == "postgres":
        import asyncpg

        conn = await asyncpg.connect(url)
        try:
            await conn.copy_records_to_table("jobs", records=jobs, columns=job_cols)
            await conn.copy_records_to_table("relay_outbox", records=relays, columns=relay_cols)
            await conn.execute("ANALYZE jobs; ANALYZE relay_outbox")
        finally:
            await conn.close()
        return
    import sqlite3

    db = sqlite3.connect(url.removeprefix("sqlite:///"), isolation_level=None)
    try:
        db.execute("BEGIN IMMEDIATE")
        db.executemany(
            f"INSERT INTO jobs ({','.join(job_cols)}) VALUES ({','.join('?' * len(job_cols))})",
            jobs,
        )
        db.executemany(
            f"INSERT INTO relay_outbox ({','.join(relay_cols)}) "
            f"VALUES ({','.join('?' * len(relay_cols))})",
            relays,
        )
        db.execute("COMMIT")
        db.execute("ANALYZE")
    finally:
        db.close()


class InstantPublisher:
    """Acknowledges every message in-process: the relay's own cost, without SQS."""

    async def send_batch(self, kind: str, messages: Sequence[Any]) -> Any:
        from outboxd.queue.sqs import BatchResult

        return BatchResult(successful={m.entry_id: str(uuid.uuid4()) for m in messages}, failed={})


def _settings(endpoint: str, tag: str) -> Any:
    from outboxd.config import SqsSettings

    return SqsSettings(
        endpoint_url=endpoint, jobs_queue=f"relay-{tag}-jobs", tasks_queue=f"relay-{tag}-tasks.fifo"
    )


async def run_relay(
    store: Any,
    publisher: Any,
    backend: str,
    url: str,
    n: int,
    pids: dict[str, int],
    parallel: int = 1,
) -> dict[str, Any]:
    """relay_once until the outbox is empty; `parallel` loops at once (what-if: the daemon
    runs one)."""
    from outboxd.config import RelaySettings
    from outboxd.daemon.relay import Relay
    from outboxd.observability import Metrics

    await prefill(backend, url, n)
    relay = Relay(store, publisher, RelaySettings(batch_size=BATCH), Metrics())
    win = CpuWindow({"self": os.getpid(), **pids})
    win.start()
    claimed = 0

    async def loop() -> None:
        nonlocal claimed
        while True:
            k = await relay.relay_once()
            if not k:
                break
            claimed += k

    await asyncio.gather(*(loop() for _ in range(parallel)))
    win.stop()
    counts = {(s.table, s.status): s.count for s in await store.status_counts()}
    pending = counts.get(("relay_outbox", "PENDING"), 0) + counts.get(
        ("relay_outbox", "RETRYABLE_FAILED"), 0
    )
    return {
        "rate": claimed / win.wall_s,
        "messages": claimed,
        "left_unsent": pending,
        "cpu": win.pct("self"),
        "sqs_cpu": win.pct("sqs"),
        "machine": win.machine_busy,
    }


async def count_trips(store: Any, backend: str, url: str) -> float:
    """Database round trips of one relay_once over 10 due rows (instant publisher)."""
    from outboxd.config import RelaySettings
    from outboxd.daemon.relay import Relay
    from outboxd.observability import Metrics

    await prefill(backend, url, BATCH)
    relay = Relay(store, InstantPublisher(), RelaySettings(batch_size=BATCH), Metrics())
    with counting() as c:
        n = await relay.relay_once()
    assert n == BATCH, n
    return float(c.total)


async def run_bare(endpoint: str, tag: str, n: int, pids: dict[str, int]) -> dict[str, Any]:
    """aiobotocore alone: one client, send_message_batch of 10 in a loop."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession

    session = AioSession()
    # The same botocore settings as SqsQueues (queue/sqs.py), so only our code differs.
    config = AioConfig(
        connect_timeout=2.0,
        read_timeout=5.0,
        retries={"mode": "standard", "total_max_attempts": 3},
        max_pool_connections=32,
    )
    async with session.create_client(
        "sqs",
        endpoint_url=endpoint,
        region_name="us-east-1",
        config=config,
        aws_access_key_id="bench",
        aws_secret_access_key="bench",
    ) as client:
        qurl = (await client.create_queue(QueueName=f"bare-{tag}"))["QueueUrl"]
        await client.purge_queue(QueueUrl=qurl)
        # Warm: the first call loads models and opens the connection.
        await client.send_message_batch(QueueUrl=qurl, Entries=[{"Id": "w", "MessageBody": "w"}])
        win = CpuWindow({"self": os.getpid(), **pids})
        win.start()
        sent = 0
        while sent < n:
            entries = []
            for _ in range(BATCH):
                oid, jid = str(uuid.uuid4()), str(uuid.uuid4())
                body = json.dumps({"type": "portal_link", "jobId": jid, "outboxId": oid})
                entries.append({"Id": oid, "MessageBody": body})
            resp = await client.send_message_batch(QueueUrl=qurl, Entries=entries)
            sent += len(resp.get("Successful", []))
        win.stop()
    return {
        "rate": sent / win.wall_s,
        "messages": sent,
        "cpu": win.pct("self"),
        "sqs_cpu": win.pct("sqs"),
        "machine": win.machine_busy,
    }


async def run_adapter(queues: Any, n: int, pids: dict[str, int]) -> dict[str, Any]:
    from outboxd.queue.sqs import OutgoingMessage

    win = CpuWindow({"self": os.getpid(), **pids})
    win.start()
    sent = 0
    while sent < n:
        msgs = []
        for _ in range(BATCH):
            oid, jid = str(uuid.uuid4()), str(uuid.uuid4())
            body = json.dumps({"type": "portal_link", "jobId": jid, "outboxId": oid})
            msgs.append(OutgoingMessage(oid, body))
        res = await queues.send_batch("jobs", msgs)
        sent += len(res.successful)
    win.stop()
    return {
        "rate": sent / win.wall_s,
        "messages": sent,
        "cpu": win.pct("self"),
        "sqs_cpu": win.pct("sqs"),
        "machine": win.machine_busy,
    }


async def main_async() -> int:
    from outboxd.queue.sqs import SqsQueues

    p = base_parser(__doc__ or "")
    p.add_argument("--no-moto", action="store_true")
    p.add_argument("--profile", action="store_true", help="py-spy the relay against the stub")
    args = p.parse_args()
    backends = await backends_arg(args.backends)
    trials = 2 if args.quick else 3
    sizes = {"stub": 2000, "moto": 300} if args.quick else {"stub": 10000, "moto": 1000}
    emit(f"\n## Relay  ({machine_line()})")
    emit(f"trials={trials}; messages per point: {sizes}; batches of {BATCH}")
    sink = quiet_logging()
    results: dict[str, Any] = {}
    profiles: list[str] = []
    trips: dict[str, float] = {}
    with workdir("relay") as wd:
        servers: dict[str, Any] = {"stub": StubChild(wd)}
        if not args.no_moto:
            servers["moto"] = MotoChild(wd)
        try:
            for backend in backends:
                async with database(backend, "relay", wd) as url:
                    store = await open_migrated_store(url, Path(wd))
                    queues = {}
                    try:
                        for name, srv in servers.items():
                            q = SqsQueues(
                                _settings(srv.endpoint_url, f"{backend}-{name}"), srv.endpoint_url
                            )
                            await q.start()
                            queues[name] = q
                        res: dict[str, list[dict[str, Any]]] = {}
                        trips[backend] = await count_trips(store, backend, url)
                        for trial in range(trials):
                            res.setdefault("relay, no SQS", []).append(
                                await run_relay(
                                    store, InstantPublisher(), backend, url, sizes["stub"], {}
                                )
                            )
                            for name, srv in servers.items():
                                pids = {"sqs": srv.pid}
                                n = sizes[name]
                                # moto slows as unreceived messages pile up: start each
                                # point on an empty queue.
                                await asyncio.to_thread(
                                    purge_queue, srv.endpoint_url, queues[name].queue_url("jobs")
                                )
                                res.setdefault(f"{name}: bare send_message_batch", []).append(
                                    await run_bare(srv.endpoint_url, f"{backend}-{trial}", n, pids)
                                )
                                res.setdefault(f"{name}: SqsQueues.send_batch", []).append(
                                    await run_adapter(queues[name], n, pids)
                                )
                                spy = None
                                raw = wd / f"profile-relay-{backend}-{name}.txt"
                                if args.profile and trial == 0 and name == "stub":
                                    spy = profile.record_pid(os.getpid(), None, raw)
                                res.setdefault(f"{name}: Relay.relay_once", []).append(
                                    await run_relay(store, queues[name], backend, url, n, pids)
                                )
                                if spy is not None:
                                    profile.stop(spy)
                                    profiles.append(
                                        profile.summarize(
                                            raw, title=f"py-spy: Relay.relay_once, {backend}, stub"
                                        )
                                    )
                                if name == "stub":
                                    res.setdefault(
                                        "stub: 4 × Relay.relay_once at once (what-if)", []
                                    ).append(
                                        await run_relay(
                                            store, queues[name], backend, url, n, pids, parallel=4
                                        )
                                    )
                        results[backend] = res
                    finally:
                        for q in queues.values():
                            await q.close()
                        await store.close()
        finally:
            for srv in servers.values():
                srv.stop()
    sink.close()
    goals = []
    for backend, res in results.items():
        rows = []
        for name, rs in res.items():
            endpoint = name.split(":")[0]
            bare = median([r["rate"] for r in res.get(f"{endpoint}: bare send_message_batch", [])])
            rate = median([r["rate"] for r in rs])
            rows.append(
                [
                    name,
                    f_rate(rate),
                    f_pct(median([r["cpu"] for r in rs])),
                    f_pct(median([r.get("sqs_cpu", float("nan")) for r in rs])),
                    f_pct(median([r["machine"] for r in rs])),
                    f_pct(ratio(rate, bare)) if "no SQS" not in name else "-",
                    str(sum(r.get("left_unsent", 0) for r in rs)),
                ]
            )
        emit(
            table(
                f"Relay, {backend} (messages/s, medians of trials)",
                ["variant", "msg/s", "bench CPU", "SQS CPU", "machine", "vs bare", "left unsent"],
                rows,
                "bench CPU: the relay's process (one core = 100%); SQS CPU: the stub's or moto's. "
                f"One relay_once of {BATCH} rows makes {trips[backend]:g} database round trips "
                "(statements, or hops to the SQLite thread); the bare loop none.",
            )
        )
        relay_rate = median([r["rate"] for r in res["stub: Relay.relay_once"]])
        bare_rate = median([r["rate"] for r in res["stub: bare send_message_batch"]])
        r = ratio(relay_rate, bare_rate)
        goals.append(
            goal(
                f"relay ≥ 80% of the bare batch-send loop against the stub ({backend})",
                r,
                0.8,
                r >= 0.8,
                f"{f_rate(relay_rate)} vs {f_rate(bare_rate)} msg/s = {f_pct(r)}",
            )
        )
    for text in profiles:
        emit("\n" + text)
    emit("\nGoals:")
    for g in goals:
        emit(f"  [{verdict(g['pass'])}] {g['name']}: {g['text']}")
    save(
        args.json_out,
        {
            "bench": "relay",
            "quick": args.quick,
            "results": results,
            "round_trips_per_batch": trips,
            "goals": goals,
        },
    )
    return 0


def main() -> int:
    return asyncio.run(main_async())


if __name__ == "__main__":
    raise SystemExit(main())
