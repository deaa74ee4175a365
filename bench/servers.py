"""The servers the load is aimed at, each in a process of its own (the load generator is another).

    python -m bench.servers outboxd --db URL [--sqs URL] --port-file PATH
    python -m bench.servers bare --port-file PATH
    python -m bench.servers bare-store --db URL --port-file PATH
    python -m bench.servers sqs-stub --port-file PATH

`outboxd`: the real API, wired with `build_api_deps` as the daemon wires it, on an
aiohttp server; `--sqs` turns dispatch on (synchronous publish through the relay's
`publish_now` to that endpoint), without it dispatch is off (`queues=None,
dispatcher=None`: the job stays QUEUED for a relay, as with roles = ["api"] and no SQS).
`--relay` also runs the relay loop in the same process, shaped for the backend as the
daemon runs it (roles api and relay), for what a publish on the request missed.
Logs are the daemon's JSON lines, written to `--log` (default /dev/null). Once built, it
sets the garbage collector as the daemon does after start (`outboxd.daemon.memory`), and
so does `bare-store`.

`bare`: the ceiling for HTTP: an aiohttp handler that reads the JSON body and answers 202
with a small JSON object, nothing else.

`bare-store`: the ceiling for HTTP over our storage layer: the bare handler, plus the one
call the storage-layer benchmark times, `SqlStore.create_portal_job` (group commit
included), with the same fixed sealed bytes and fingerprint. No authentication, no
validation, sealing or logging: what aiohttp and our storage layer reach together in one
process, which no API can pass.

`sqs-stub`: the ceiling for SQS: it speaks the JSON protocol botocore uses (`POST /`,
`X-Amz-Target: AmazonSQS.<Operation>`) just enough for `SqsQueues.start()` and the relay
(CreateQueue, GetQueueUrl, Get/SetQueueAttributes, PurgeQueue, SendMessage[Batch]) and
acknowledges every send at once; messages are counted and dropped, signatures not
checked. Against it a publish costs only the client's and our own work (moto spends
milliseconds per message itself). `GET /stub/counts`: the messages taken and the send
requests answered so far (their ratio is how full the batches were).

Each writes `{"base_url" or "endpoint_url", ...}` to PATH once listening and serves until
SIGTERM or SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.common import quiet_logging
from outboxd.config_file import settings_from_mapping

CONTENT_TYPE = "application/x-amz-json-1.0"
ACCOUNT = "000000000000"


class QueueDoesNotExist(Exception):
    pass


def _entry(body: str, entry_id: str | None = None) -> dict[str, str]:
    md5 = hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()
    out = {"MessageId": str(uuid.uuid4()), "MD5OfMessageBody": md5}
    return out if entry_id is None else {"Id": entry_id, **out}


class Stub:
    def __init__(self) -> None:
        self.base_url = ""
        self.queues: dict[str, dict[str, str]] = {}
        self.sent = 0
        self.calls = 0  # SendMessage and SendMessageBatch requests

    def _queue(self, body: dict[str, Any]) -> str:
        name = str(body.get("QueueName") or str(body.get("QueueUrl", "")).rsplit("/", 1)[-1])
        if name not in self.queues:
            raise QueueDoesNotExist(name)
        return name

    def answer(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        if op == "CreateQueue":
            attrs = {str(k): str(v) for k, v in (body.get("Attributes") or {}).items()}
            self.queues.setdefault(str(body["QueueName"]), {}).update(attrs)
        name = self._queue(body)
        if op in ("CreateQueue", "GetQueueUrl"):
            return {"QueueUrl": f"{self.base_url}/{ACCOUNT}/{name}"}
        if op == "GetQueueAttributes":
            attrs = {
                "QueueArn": f"arn:aws:sqs:us-east-1:{ACCOUNT}:{name}",
                "ApproximateNumberOfMessages": "0",
                "ApproximateNumberOfMessagesNotVisible": "0",
                **self.queues[name],
            }
            wanted = body.get("AttributeNames") or ["All"]
            return {"Attributes": {k: v for k, v in attrs.items() if {"All", k} & set(wanted)}}
        if op == "SetQueueAttributes":
            self.queues[name].update({str(k): str(v) for k, v in body["Attributes"].items()})
        if op == "SendMessage":
            self.sent += 1
            self.calls += 1
            return _entry(body["MessageBody"])
        if op == "SendMessageBatch":
            entries = body.get("Entries") or []
            self.sent += len(entries)
            self.calls += 1
            ok = [_entry(e["MessageBody"], e["Id"]) for e in entries]
            return {"Successful": ok, "Failed": []}
        if op in ("SetQueueAttributes", "PurgeQueue"):
            return {}
        raise NotImplementedError(op)


STUB = web.AppKey("stub", Stub)


async def handle(request: web.Request) -> web.Response:
    op = request.headers.get("X-Amz-Target", "").removeprefix("AmazonSQS.")
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    try:
        result = request.app[STUB].answer(op, json.loads(await request.read() or b"{}"))
    except QueueDoesNotExist:
        headers["x-amzn-query-error"] = "AWS.SimpleQueueService.NonExistentQueue;Sender"
        fault = {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "no such queue"}
        return web.json_response(fault, status=400, content_type=CONTENT_TYPE, headers=headers)
    except NotImplementedError:
        fault = {"__type": "com.amazonaws.sqs#UnsupportedOperation", "message": op}
        return web.json_response(fault, status=400, content_type=CONTENT_TYPE, headers=headers)
    return web.json_response(result, content_type=CONTENT_TYPE, headers=headers)


async def counts(request: web.Request) -> web.Response:
    """Messages taken and send requests answered so far (messages per call = the batching)."""
    stub = request.app[STUB]
    return web.json_response({"sent": stub.sent, "calls": stub.calls})


async def bare_handler(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    if not isinstance(body, dict):
        return web.json_response({"error": "not an object"}, status=400)
    return web.json_response({"jobId": str(uuid.uuid4()), "status": "QUEUED"}, status=202)


def _settings(args: argparse.Namespace, cleanups: list[Any], more: dict[str, Any]) -> Any:
    """The daemon's settings for `--db` (plus `more` sections), its JSON logs to `--log`."""

    sink = quiet_logging(Path(args.log) if args.log else None)
    cleanups.append(sink.close)
    return settings_from_mapping(
        {
            "server": {"host": "127.0.0.1", "port": 0},
            "storage": {"url": args.db, "pool_size": args.pool_size},
            **more,
        },
        env={},
        base_dir=Path(args.workdir),
    )


async def build_bare_store_app(args: argparse.Namespace, cleanups: list[Any]) -> web.Application:
    import time

    from bench.measure import new_portal_job
    from outboxd.daemon.startup import open_configured_store
    from outboxd.ids import new_id

    settings = _settings(args, cleanups, {})
    store = await open_configured_store(settings)
    cleanups.append(store.close)

    async def handler(request: web.Request) -> web.Response:
        body = json.loads(await request.read())
        if not isinstance(body, dict):
            return web.json_response({"error": "not an object"}, status=400)
        job_id = new_id()
        new = new_portal_job(job_id, new_id(), request.headers["Idempotency-Key"])
        await store.create_portal_job(new, now=time.time())
        return web.json_response({"jobId": job_id, "status": "QUEUED"}, status=202)

    app = web.Application()
    app.router.add_post("/v1/portal-link-jobs", handler)
    return app


async def build_outboxd_app(
    args: argparse.Namespace, cleanups: list[Any], info: dict[str, Any]
) -> web.Application:
    from outboxd.daemon.components import build_api_deps
    from outboxd.daemon.startup import open_configured_store
    from outboxd.http.app import create_app
    from outboxd.metrics import Metrics
    from outboxd.queue.sqs import SqsQueues
    from outboxd.security import KeyRing
    from outboxd.workers.relay import Relay

    tag = uuid.uuid4().hex[:8]
    sqs = {
        "endpoint_url": args.sqs or "embedded",
        "create_queues": True,
        "jobs_queue": f"bench-{tag}-jobs",
        "tasks_queue": f"bench-{tag}-tasks.fifo",
    }
    settings = _settings(args, cleanups, {"sqs": sqs})
    store = await open_configured_store(settings)
    cleanups.append(store.close)
    keys = KeyRing([os.urandom(32)])
    metrics = Metrics()
    queues = relay = None
    if args.sqs:
        queues = SqsQueues(settings.sqs, args.sqs, max_connections=64)
        await queues.start()
        cleanups.append(queues.close)
        stop = asyncio.Event()
        relay = Relay.shaped(store.backend, store, queues, settings.relay, metrics, stop)
        info["jobs_queue_url"] = queues.queue_url("jobs")
        if args.relay:
            loop_task = asyncio.ensure_future(relay.run(stop))

            async def stop_relay() -> None:
                stop.set()
                await loop_task
                await relay.drain(2.0)

            cleanups.append(stop_relay)
    deps = build_api_deps(settings, store, keys, metrics, queues=queues, dispatcher=relay)
    return create_app(deps)


async def serve(app: web.Application, port_file: Path, info: dict[str, Any]) -> str:
    """Serve on a free loopback port, write info and the base URL to `port_file` (what
    testkit's FakeProcess waits for), and run until SIGTERM or SIGINT."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    if app.get(STUB) is None:
        from outboxd.http.app import trim_middleware_chain

        trim_middleware_chain(app)  # as the daemon's API server does once set up
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    base_url = info["base_url"] = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    if app.get(STUB) is not None:
        app[STUB].base_url = info["endpoint_url"] = base_url
    tmp = port_file.with_name(port_file.name + ".tmp")
    tmp.write_text(json.dumps(info))
    tmp.replace(port_file)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
    return base_url


async def main(args: argparse.Namespace) -> None:
    cleanups: list[Any] = []
    info: dict[str, Any] = {"pid": os.getpid()}
    try:
        if args.mode in ("outboxd", "bare-store"):
            from outboxd.daemon.memory import settle_after_start

            if args.mode == "outboxd":
                app = await build_outboxd_app(args, cleanups, info)
            else:
                app = await build_bare_store_app(args, cleanups)
            # As the daemon does once it has started; the bare handler over the storage
            # layer too, so that what the two differ by is the API's own work.
            settle_after_start()
        else:
            app = web.Application()
            if args.mode == "bare":
                app.router.add_post("/v1/portal-link-jobs", bare_handler)
            else:
                app[STUB] = Stub()
                app.router.add_post("/", handle)
                app.router.add_get("/stub/counts", counts)
        await serve(app, Path(args.port_file), info)
    finally:
        for fn in reversed(cleanups):
            result = fn()
            if asyncio.iscoroutine(result):
                await result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("mode", choices=("outboxd", "bare", "bare-store", "sqs-stub"))
    p.add_argument("--db", help="storage.url (outboxd and bare-store)")
    p.add_argument("--sqs", help="SQS endpoint URL: dispatch on (outboxd mode)")
    p.add_argument("--relay", action="store_true", help="run the relay loop too (with --sqs)")
    p.add_argument("--pool-size", type=int, default=16)
    p.add_argument("--workdir", default=".")
    p.add_argument("--log", help="where the JSON logs go (default: /dev/null)")
    p.add_argument("--port-file", required=True)
    asyncio.run(main(p.parse_args()))
