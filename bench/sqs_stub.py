"""A minimal SQS-compatible server that acknowledges every send at once.

It speaks the SQS JSON protocol botocore 1.43 uses (`POST /`, `X-Amz-Target:
AmazonSQS.<Operation>`, `Content-Type: application/x-amz-json-1.0`) and answers just
enough for `SqsQueues.start()` and the relay: CreateQueue, GetQueueUrl,
GetQueueAttributes, SetQueueAttributes, PurgeQueue, SendMessage, SendMessageBatch.
Messages are counted and dropped; nothing can be received. Signatures are not checked.

The point is a ceiling: against it, a publish costs only the client's and our own work,
so the relay can be compared with a bare `send_message_batch` loop (moto spends
milliseconds per message itself).

    python -m bench.sqs_stub --port-file PATH [--port N]

writes `{"endpoint_url": ...}` to PATH once listening, serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from aiohttp import web

CONTENT_TYPE = "application/x-amz-json-1.0"
ACCOUNT = "000000000000"
REGION = "us-east-1"

Handler = Callable[["Stub", dict[str, Any]], dict[str, Any]]


class SqsFault(Exception):
    def __init__(self, code: str, message: str, query_code: str, status: int = 400) -> None:
        super().__init__(message)
        self.code = code
        self.query_code = query_code
        self.status = status


def _md5(text: str) -> str:
    return hashlib.md5(text.encode("utf-8"), usedforsecurity=False).hexdigest()


class Stub:
    def __init__(self) -> None:
        self.base_url = ""
        self.queues: dict[str, dict[str, str]] = {}
        self.sent = 0

    def _url(self, name: str) -> str:
        return f"{self.base_url}/{ACCOUNT}/{name}"

    def _name(self, body: dict[str, Any]) -> str:
        url = str(body.get("QueueUrl", ""))
        name = url.rsplit("/", 1)[-1]
        if name not in self.queues:
            raise SqsFault(
                "com.amazonaws.sqs#QueueDoesNotExist",
                "The specified queue does not exist.",
                "AWS.SimpleQueueService.NonExistentQueue",
            )
        return name

    def create_queue(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body["QueueName"])
        attrs = {str(k): str(v) for k, v in (body.get("Attributes") or {}).items()}
        self.queues.setdefault(name, {}).update(attrs)
        return {"QueueUrl": self._url(name)}

    def get_queue_url(self, body: dict[str, Any]) -> dict[str, Any]:
        name = str(body["QueueName"])
        if name not in self.queues:
            raise SqsFault(
                "com.amazonaws.sqs#QueueDoesNotExist",
                "The specified queue does not exist.",
                "AWS.SimpleQueueService.NonExistentQueue",
            )
        return {"QueueUrl": self._url(name)}

    def get_queue_attributes(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._name(body)
        attrs = {
            "QueueArn": f"arn:aws:sqs:{REGION}:{ACCOUNT}:{name}",
            "ApproximateNumberOfMessages": "0",
            "ApproximateNumberOfMessagesNotVisible": "0",
            **self.queues[name],
        }
        wanted = body.get("AttributeNames") or ["All"]
        if "All" not in wanted:
            attrs = {k: v for k, v in attrs.items() if k in wanted}
        return {"Attributes": attrs}

    def set_queue_attributes(self, body: dict[str, Any]) -> dict[str, Any]:
        name = self._name(body)
        self.queues[name].update({str(k): str(v) for k, v in body["Attributes"].items()})
        return {}

    def purge_queue(self, body: dict[str, Any]) -> dict[str, Any]:
        self._name(body)
        return {}

    def send_message(self, body: dict[str, Any]) -> dict[str, Any]:
        self._name(body)
        self.sent += 1
        return {"MessageId": str(uuid.uuid4()), "MD5OfMessageBody": _md5(body["MessageBody"])}

    def send_message_batch(self, body: dict[str, Any]) -> dict[str, Any]:
        self._name(body)
        entries = body.get("Entries") or []
        self.sent += len(entries)
        return {
            "Successful": [
                {
                    "Id": e["Id"],
                    "MessageId": str(uuid.uuid4()),
                    "MD5OfMessageBody": _md5(e["MessageBody"]),
                }
                for e in entries
            ],
            "Failed": [],
        }


OPERATIONS: dict[str, Handler] = {
    "CreateQueue": Stub.create_queue,
    "GetQueueUrl": Stub.get_queue_url,
    "GetQueueAttributes": Stub.get_queue_attributes,
    "SetQueueAttributes": Stub.set_queue_attributes,
    "PurgeQueue": Stub.purge_queue,
    "SendMessage": Stub.send_message,
    "SendMessageBatch": Stub.send_message_batch,
}

STUB = web.AppKey("stub", Stub)


async def handle(request: web.Request) -> web.Response:
    stub = request.app[STUB]
    target = request.headers.get("X-Amz-Target", "")
    op = target.removeprefix("AmazonSQS.")
    headers = {"x-amzn-RequestId": str(uuid.uuid4())}
    try:
        fn = OPERATIONS.get(op)
        if fn is None:
            raise SqsFault(
                "com.amazonaws.sqs#UnsupportedOperation",
                f"{op or target!r} is not supported by the stub",
                "AWS.SimpleQueueService.UnsupportedOperation",
            )
        try:
            body = json.loads(await request.read() or b"{}")
        except ValueError:
            raise SqsFault(
                "com.amazonaws.sqs#InvalidParameterValue",
                "body is not JSON",
                "InvalidParameterValue",
            ) from None
        result = fn(stub, body)
    except SqsFault as fault:
        headers["x-amzn-query-error"] = f"{fault.query_code};Sender"
        return web.Response(
            status=fault.status,
            text=json.dumps({"__type": fault.code, "message": str(fault)}),
            content_type=CONTENT_TYPE,
            headers=headers,
        )
    return web.Response(text=json.dumps(result), content_type=CONTENT_TYPE, headers=headers)


async def stats(request: web.Request) -> web.Response:
    stub = request.app[STUB]
    return web.json_response({"sent": stub.sent, "queues": sorted(stub.queues)})


def make_app(stub: Stub) -> web.Application:
    app = web.Application()
    app[STUB] = stub
    app.router.add_post("/", handle)
    app.router.add_get("/stats", stats)
    return app


async def serve(port_file: Path | None, port: int) -> None:
    stub = Stub()
    runner = web.AppRunner(make_app(stub), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port)
    await site.start()
    sockets = getattr(site._server, "sockets", None) or []
    bound = int(sockets[0].getsockname()[1]) if sockets else port
    stub.base_url = f"http://127.0.0.1:{bound}"
    if port_file is not None:
        tmp = port_file.with_name(port_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"endpoint_url": stub.base_url}))
        tmp.replace(port_file)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main() -> int:
    p = argparse.ArgumentParser(description="A minimal SQS-compatible stub on loopback.")
    p.add_argument("--port-file", type=Path)
    p.add_argument("--port", type=int, default=0)
    args = p.parse_args()
    asyncio.run(serve(args.port_file, args.port))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
