"""Relay: outbox → SQS messages/s in batches of 10, beside a bare send_message_batch loop.

Per backend and per SQS endpoint (the stub in `bench/servers.py`, and moto), in one run,
trials interleaved:

- bare: an aiobotocore client calling `send_message_batch` with 10 entries, in a loop;
- bare JSON client: the same loop on outboxd's own `SqsMessagePlane`, which the relay sends
  with (the ceiling the relay goal uses is the faster of the two bare loops);
- relay: `Relay.relay_pass` until the pre-filled outbox is empty (claim, publish, mark SENT),
  in the lanes and rounds the daemon runs on that backend (`relay_shape`), after an untimed
  warm-up of a quarter of the rows (at most 500), as the bare loops are warmed;
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

from bench import fmt
from bench.common import (
    Bench,
    CpuWindow,
    Results,
    SqsEndpoint,
    database,
    emit,
    med,
    open_migrated_store,
    purge_queue,
    quiet_logging,
    ratio,
    sqs_servers,
    table,
    workdir,
    write_raw,
)

BATCH = 10
WARM_ROWS = 500
JOB_COLS = ["id", "kind", "portal", "user_id", "idempotency_key", "fingerprint", "status"]
JOB_COLS += ["key_id", "sealed", "created_at", "updated_at"]
RELAY_COLS = ["id", "kind", "job_id", "status", "next_attempt_at", "dedup_id", "created_at"]


async def prefill(backend: str, url: str, n: int) -> None:
    """n jobs, each with a PENDING relay row due now (bulk: COPY / executemany), with ids
    as the service makes them (time-ordered)."""
    from outboxd.ids import new_id

    now, sealed = time.time() - 1, os.urandom(96)
    jobs: list[tuple[Any, ...]] = []
    relays: list[tuple[Any, ...]] = []
    for i in range(n):
        jid, oid = new_id(), new_id()
        jobs.append((jid, "portal_link", "suwon", "bench", f"relay-{jid}", "k1:00", "QUEUED"))
        jobs[-1] += ("k1", sealed, now, now)
        relays.append((oid, "job", jid, "PENDING", now + i * 1e-6, jid, now))
    await write_raw(backend, url, [("jobs", JOB_COLS, jobs), ("relay_outbox", RELAY_COLS, relays)])


class InstantPublisher:
    """Acknowledges every message in-process: the relay's own cost, without SQS."""

    async def send_batch(self, kind: str, messages: Sequence[Any]) -> Any:
        from outboxd.queue.sqs import BatchResult

        return BatchResult(successful={m.entry_id: str(uuid.uuid4()) for m in messages}, failed={})


def _result(win: CpuWindow, sent: int) -> Results:
    return {
        "rate": sent / win.wall_s,
        "messages": sent,
        "cpu": win.pct("self"),
        "sqs_cpu": win.pct("sqs"),
        "machine": win.machine_busy,
    }


async def run_relay(
    store: Any, publisher: Any, backend: str, url: str, n: int, pids: dict[str, int]
) -> Results:
    """relay_pass until the outbox is empty, as the daemon's relay loop runs it (its lanes too)."""
    from outboxd.config import RelaySettings
    from outboxd.metrics import Metrics
    from outboxd.workers.relay import Relay

    settings = RelaySettings(batch_size=BATCH)
    relay = Relay.shaped(backend, store, publisher, settings, Metrics())
    # Warm, as the bare loops are, and as the daemon's relay is after its first seconds:
    # connections open, and the send window past its slow start (it starts at two calls).
    await prefill(backend, url, min(WARM_ROWS, n // 4))
    while await relay.relay_pass():
        pass
    await prefill(backend, url, n)
    win = CpuWindow({"self": os.getpid(), **pids})
    win.start()
    claimed = 0
    while k := await relay.relay_pass():
        claimed += k
    win.stop()
    counts = {(s.table, s.status): s.count for s in await store.status_counts()}
    pending = sum(counts.get(("relay_outbox", s), 0) for s in ("PENDING", "RETRYABLE_FAILED"))
    return {**_result(win, claimed), "left_unsent": pending}


async def run_bare(endpoint: str, tag: str, n: int, pids: dict[str, int]) -> Results:
    """aiobotocore alone: one client, send_message_batch of 10 in a loop."""
    from aiobotocore.config import AioConfig
    from aiobotocore.session import AioSession

    session = AioSession()
    # The same botocore settings as SqsQueues' sending client (queue/sqs.py), so only our
    # code differs: that client skips botocore's parameter validation (send_batch checks
    # its entries itself), and so does this loop.
    config = AioConfig(
        connect_timeout=2.0,
        read_timeout=5.0,
        retries={"mode": "standard", "total_max_attempts": 3},
        max_pool_connections=32,
        warm_up_loader_caches=True,
        parameter_validation=False,
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
            resp = await client.send_message_batch(QueueUrl=qurl, Entries=_bare_entries())
            sent += len(resp.get("Successful", []))
        win.stop()
    return _result(win, sent)


def _bare_entries() -> list[dict[str, str]]:
    entries = []
    for _ in range(BATCH):
        oid, jid = str(uuid.uuid4()), str(uuid.uuid4())
        body = json.dumps({"type": "portal_link", "jobId": jid, "outboxId": oid})
        entries.append({"Id": oid, "MessageBody": body})
    return entries


async def run_bare_json(endpoint: str, qurl: str, n: int, pids: dict[str, int]) -> Results:
    """outboxd's own SQS JSON client alone (queue/message_plane.py, what SqsQueues sends
    with): SendMessageBatch of 10 in a loop, no database, no relay."""
    from outboxd.queue.failures import REQUEST_RETRY
    from outboxd.queue.message_plane import Credentials, SqsClientView, SqsMessagePlane
    from outboxd.queue.sqs import CONNECT_TIMEOUT_S, CONTROL_READ_TIMEOUT_S

    async def creds() -> Credentials:
        return Credentials("bench", "bench")

    client = SqsMessagePlane(
        SqsClientView(endpoint, "us-east-1", creds),
        connect_timeout_s=CONNECT_TIMEOUT_S,
        read_timeout_s=CONTROL_READ_TIMEOUT_S,
        retry=REQUEST_RETRY,
        max_connections=32,
    )

    async def send(entries: list[dict[str, str]]) -> dict[str, Any]:
        params = {"QueueUrl": qurl, "Entries": entries}
        return await client.call("SendMessageBatch", params)

    try:
        await send([{"Id": "w", "MessageBody": "w"}])  # warm: opens the connection
        win = CpuWindow({"self": os.getpid(), **pids})
        win.start()
        sent = 0
        while sent < n:
            sent += len((await send(_bare_entries())).get("Successful", []))
        win.stop()
    finally:
        await client.close()
    return _result(win, sent)


async def run_backend(
    backend: str, wd: Path, servers: dict[str, SqsEndpoint], trials: int, sizes: dict[str, int]
) -> dict[str, list[Results]]:
    from outboxd.config import SqsSettings
    from outboxd.queue.sqs import SqsQueues

    res: dict[str, list[Results]] = {}
    async with database(backend, "relay", wd) as url:
        store = await open_migrated_store(url, wd)
        queues = {}
        try:
            for name, srv in servers.items():
                tag = f"relay-{backend}-{name}"
                settings = SqsSettings(
                    endpoint_url=srv.url,
                    jobs_queue=f"{tag}-jobs",
                    tasks_queue=f"{tag}-tasks.fifo",
                )
                queues[name] = q = SqsQueues(settings, srv.url)
                await q.start()
            for trial in range(trials):
                r = await run_relay(store, InstantPublisher(), backend, url, sizes["stub"], {})
                res.setdefault("relay, no SQS", []).append(r)
                for name, srv in servers.items():
                    pids, n = {"sqs": srv.pid}, sizes[name]
                    # moto slows as unreceived messages pile up: each point starts empty.
                    qurl = queues[name].queue_url("jobs")
                    await asyncio.to_thread(purge_queue, srv.url, qurl)
                    r = await run_bare(srv.url, f"{backend}-{trial}", n, pids)
                    res.setdefault(f"{name}: bare send_message_batch", []).append(r)
                    await asyncio.to_thread(purge_queue, srv.url, qurl)
                    r = await run_bare_json(srv.url, qurl, n, pids)
                    res.setdefault(f"{name}: bare JSON-client loop", []).append(r)
                    # The bare loop filled the relay's queue: empty it again before the relay.
                    await asyncio.to_thread(purge_queue, srv.url, qurl)
                    r = await run_relay(store, queues[name], backend, url, n, pids)
                    res.setdefault(f"{name}: Relay.relay_pass", []).append(r)
        finally:
            for q in queues.values():
                await q.close()
            await store.close()
    return res


async def main_async() -> int:
    bench = Bench.parse("relay", __doc__, {"--no-moto": {"action": "store_true"}})
    args = bench.args
    backends = await bench.backends()
    trials = 2 if args.quick else 3
    sizes = {"stub": 8000, "moto": 300} if args.quick else {"stub": 10000, "moto": 1000}
    bench.heading("Relay")
    emit(f"trials={trials}; messages per point: {sizes}; batches of {BATCH}")
    sink = quiet_logging()
    results: dict[str, Any] = {}
    with workdir("relay") as wd:
        servers = sqs_servers(wd, moto=not args.no_moto)
        try:
            for backend in backends:
                results[backend] = await run_backend(backend, wd, servers, trials, sizes)
        finally:
            for srv in servers.values():
                srv.stop()
    sink.close()
    for backend, res in results.items():
        rows = []
        for name, rs in res.items():
            bare = med(res.get(f"{name.split(':')[0]}: bare send_message_batch", []), "rate")
            rows.append(
                [
                    name,
                    fmt.rate(med(rs, "rate")),
                    fmt.pct(med(rs, "cpu")),
                    fmt.pct(med(rs, "sqs_cpu")),
                    fmt.pct(med(rs, "machine")),
                    fmt.pct(ratio(med(rs, "rate"), bare)),
                    str(sum(r.get("left_unsent", 0) for r in rs)),
                ]
            )
        emit(
            table(
                f"Relay, {backend} (messages/s, medians of trials)",
                ["variant", "msg/s", "bench CPU", "SQS CPU", "machine", "vs bare", "left unsent"],
                rows,
                "bench CPU: the relay's process (one core = 100%); SQS CPU: the stub's or moto's.",
            )
        )
    bench.save(results=results)
    return 0


if __name__ == "__main__":
    raise SystemExit(asyncio.run(main_async()))
