"""The HTTP server under test, in a process of its own (the load generator is another).

    python -m bench.api_server --mode outboxd --db URL [--sqs URL] --port-file PATH
    python -m bench.api_server --mode bare --port-file PATH

`outboxd`: the real API, wired with `build_api_deps` as the daemon wires it, on an
aiohttp server; `--sqs` turns dispatch on (synchronous publish through the relay's
`publish_now` to that endpoint), without it dispatch is off (`queues=None,
dispatcher=None`: the job stays QUEUED for a relay, as with roles = ["api"] and no SQS).
Logs are the daemon's JSON lines, written to `--log` (default /dev/null).

`bare`: the ceiling: an aiohttp handler that reads the JSON body and answers 202 with a
small JSON object, nothing else.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.common import quiet_logging, serve


async def bare_handler(request: web.Request) -> web.Response:
    body = json.loads(await request.read())
    if not isinstance(body, dict):
        return web.json_response({"error": "not an object"}, status=400)
    return web.json_response({"jobId": str(uuid.uuid4()), "status": "QUEUED"}, status=202)


async def build_outboxd_app(
    args: argparse.Namespace, cleanups: list[Any], info: dict[str, Any]
) -> web.Application:
    from outboxd.config import Settings
    from outboxd.daemon.api import create_app
    from outboxd.daemon.app import build_api_deps, open_configured_store
    from outboxd.daemon.relay import Relay
    from outboxd.observability import Metrics
    from outboxd.queue.sqs import SqsQueues
    from outboxd.security import KeyRing

    sink = quiet_logging(Path(args.log) if args.log else None)
    cleanups.append(sink.close)
    tag = uuid.uuid4().hex[:8]
    settings = Settings.from_mapping(
        {
            "server": {"host": "127.0.0.1", "port": 0},
            "storage": {"url": args.db, "pool_size": args.pool_size},
            "sqs": {
                "endpoint_url": args.sqs or "embedded",
                "create_queues": True,
                "jobs_queue": f"bench-{tag}-jobs",
                "tasks_queue": f"bench-{tag}-tasks.fifo",
            },
        },
        env={},
        base_dir=Path(args.workdir),
    )
    store = await open_configured_store(settings)
    cleanups.append(store.close)
    keys = KeyRing([os.urandom(32)])
    metrics = Metrics()
    queues = relay = None
    if args.sqs:
        queues = SqsQueues(settings.sqs, args.sqs, max_connections=64)
        await queues.start()
        cleanups.append(queues.close)
        relay = Relay(store, queues, settings.relay, metrics)
        info["jobs_queue_url"] = queues.queue_url("jobs")
    deps = build_api_deps(settings, store, keys, metrics, queues=queues, dispatcher=relay)
    return create_app(deps)


async def main(args: argparse.Namespace) -> None:
    cleanups: list[Any] = []
    info: dict[str, Any] = {"pid": os.getpid()}
    try:
        if args.mode == "bare":
            app = web.Application()
            app.router.add_post("/v1/portal-link-jobs", bare_handler)
        else:
            app = await build_outboxd_app(args, cleanups, info)
        await serve(app, Path(args.port_file), lambda url: {**info, "base_url": url})
    finally:
        for fn in reversed(cleanups):
            result = fn()
            if asyncio.iscoroutine(result):
                await result


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=("outboxd", "bare"), required=True)
    p.add_argument("--db", help="storage.url (outboxd mode)")
    p.add_argument("--sqs", help="SQS endpoint URL: dispatch on (outboxd mode)")
    p.add_argument("--pool-size", type=int, default=16)
    p.add_argument("--workdir", default=".")
    p.add_argument("--log", help="where the JSON logs go (default: /dev/null)")
    p.add_argument("--port-file", required=True)
    asyncio.run(main(p.parse_args()))
