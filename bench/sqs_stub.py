"""A minimal SQS-compatible server that acknowledges every send at once.

It speaks the SQS JSON protocol botocore uses (`POST /`, `X-Amz-Target:
AmazonSQS.<Operation>`, `Content-Type: application/x-amz-json-1.0`) and answers just
enough for `SqsQueues.start()` and the relay: CreateQueue, GetQueueUrl,
GetQueueAttributes, SetQueueAttributes, PurgeQueue, SendMessage, SendMessageBatch.
Messages are counted and dropped; nothing can be received. Signatures are not checked.

The point is a ceiling: against it, a publish costs only the client's and our own work,
so the relay can be compared with a bare `send_message_batch` loop (moto spends
milliseconds per message itself).

    python -m bench.sqs_stub --port-file PATH

writes `{"endpoint_url": ...}` to PATH once listening, serves until SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import uuid
from pathlib import Path
from typing import Any

from aiohttp import web

from bench.common import serve

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
            return _entry(body["MessageBody"])
        if op == "SendMessageBatch":
            entries = body.get("Entries") or []
            self.sent += len(entries)
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


async def main(port_file: Path) -> None:
    stub = Stub()
    app = web.Application()
    app[STUB] = stub
    app.router.add_post("/", handle)

    def info(base_url: str) -> dict[str, str]:
        stub.base_url = base_url
        return {"endpoint_url": base_url}

    await serve(app, port_file, info)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="A minimal SQS-compatible stub on loopback.")
    p.add_argument("--port-file", type=Path, required=True)
    asyncio.run(main(p.parse_args().port_file))
