"""The message plane's JSON-protocol SQS client: its signature is botocore's, its errors
read as botocore reads them, and it retries only what the shared retry policy (botocore's
standard mode) retries.

The retry and error cases run against a real aiohttp server on loopback that answers as
SQS does (a JSON body, `x-amzn-query-error`), so the whole request path is exercised.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

import botocore.auth
import pytest
import pytest_asyncio
from aiohttp import web
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials as BotoCredentials

from outboxd.queue.failures import QueueError, RetryPolicy
from outboxd.queue.message_plane import (
    CONTENT_TYPE,
    Credentials,
    SqsClientView,
    SqsMessagePlane,
    canonical_host,
    proxy_for,
    signed_headers,
)
from tests.support.sqs_proxy import serve

AMZ_DATE = "20261202T071530Z"
BODY = (
    b'{"QueueUrl":"http://127.0.0.1:5000/000000000000/q","Entries":[{"Id":"a","MessageBody":"x"}]}'
)


def botocore_authorization(
    url: str, region: str, creds: Credentials, monkeypatch: pytest.MonkeyPatch
) -> dict[str, str]:
    """What botocore's own SigV4 signer puts on the same request at the same instant."""

    instant = dt.datetime(2026, 12, 2, 7, 15, 30)
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda: instant)
    request = AWSRequest(
        method="POST",
        url=url,
        data=BODY,
        headers={"Content-Type": CONTENT_TYPE, "X-Amz-Target": "AmazonSQS.SendMessageBatch"},
    )
    signer = botocore.auth.SigV4Auth(
        BotoCredentials(creds.access_key, creds.secret_key, creds.token), "sqs", region
    )
    signer.add_auth(request)
    return {k.lower(): v for k, v in request.headers.items()}


@pytest.mark.parametrize(
    ("url", "region", "token"),
    [
        ("http://127.0.0.1:5000/", "us-east-1", None),
        ("https://sqs.eu-west-1.amazonaws.com", "eu-west-1", None),
        ("https://sqs.eu-west-1.amazonaws.com:443/", "eu-west-1", "FwoGZXIvYXdzEJr//token"),
        ("http://[::1]:9324", "us-east-1", None),
    ],
)
def test_signature_matches_botocore(
    url: str, region: str, token: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    creds = Credentials("AKIDEXAMPLE", "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY", token)
    ours = signed_headers(
        host=canonical_host(url),
        region=region,
        target="AmazonSQS.SendMessageBatch",
        body=BODY,
        amz_date=AMZ_DATE,
        credentials=creds,
    )
    theirs = botocore_authorization(url, region, creds, monkeypatch)
    assert ours["authorization"] == theirs["authorization"]
    assert ours["x-amz-date"] == theirs["x-amz-date"] == AMZ_DATE
    assert ours.get("x-amz-security-token") == theirs.get("x-amz-security-token")


def test_signature_covers_the_body_and_the_secret() -> None:
    creds = Credentials("AKIDEXAMPLE", "secret-one")

    def sign(body: bytes, c: Credentials = creds) -> str:
        return signed_headers(
            host="127.0.0.1:5000",
            region="us-east-1",
            target="AmazonSQS.DeleteMessage",
            body=body,
            amz_date=AMZ_DATE,
            credentials=c,
        )["authorization"]

    assert sign(BODY) != sign(BODY + b" ")
    assert sign(BODY) != sign(BODY, Credentials("AKIDEXAMPLE", "secret-two"))
    assert "secret-one" not in sign(BODY)


@dataclass
class FakeSqs:
    """Answers each call with the next of `answers` (status, body, headers), then 200 {}."""

    answers: list[tuple[int, Any, dict[str, str]]] = field(default_factory=list)
    seen: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        self.seen.append(
            {
                "target": request.headers.get("X-Amz-Target"),
                "authorization": request.headers.get("Authorization", ""),
                "host": request.headers.get("Host"),
                "body": json.loads(await request.read()),
            }
        )
        status, body, headers = self.answers.pop(0) if self.answers else (200, {}, {})
        raw = body if isinstance(body, bytes) else json.dumps(body).encode()
        return web.Response(status=status, body=raw, headers=headers, content_type=CONTENT_TYPE)


@pytest_asyncio.fixture
async def fake() -> AsyncIterator[FakeSqs]:
    sqs = FakeSqs()
    async with serve(sqs.handle, "/") as sqs.url:
        yield sqs


MakeClient = Callable[..., SqsMessagePlane]


async def _creds() -> Credentials:
    return Credentials("AKIDTEST", "the-secret", "the-token")


def plane(url: str, attempts: int = 3) -> SqsMessagePlane:
    return SqsMessagePlane(
        SqsClientView(url, "us-east-1", _creds),
        connect_timeout_s=1.0,
        read_timeout_s=5.0,
        retry=RetryPolicy(attempts=attempts, backoff_s=lambda attempt: 0.0),
        max_connections=4,
    )


@pytest_asyncio.fixture
async def make_client(fake: FakeSqs) -> AsyncIterator[MakeClient]:
    clients: list[SqsMessagePlane] = []

    def make(attempts: int = 3) -> SqsMessagePlane:
        clients.append(plane(fake.url, attempts))
        return clients[-1]

    try:
        yield make
    finally:
        for c in clients:
            await c.close()


async def call(client: SqsMessagePlane) -> dict[str, Any]:
    return await client.call(
        "SendMessageBatch", {"QueueUrl": "q", "Entries": [{"Id": "a", "MessageBody": "x"}]}
    )


@pytest.mark.asyncio
async def test_a_call_is_signed_json_to_the_root(fake: FakeSqs, make_client: MakeClient) -> None:
    fake.answers.append((200, {"Successful": [{"Id": "a", "MessageId": "m1"}]}, {}))
    assert await call(make_client()) == {"Successful": [{"Id": "a", "MessageId": "m1"}]}
    [seen] = fake.seen
    assert seen["target"] == "AmazonSQS.SendMessageBatch"
    assert seen["body"] == {"QueueUrl": "q", "Entries": [{"Id": "a", "MessageBody": "x"}]}
    assert seen["host"] == fake.url.removeprefix("http://")
    assert seen["authorization"].startswith("AWS4-HMAC-SHA256 Credential=AKIDTEST/")
    assert "x-amz-security-token" in seen["authorization"]  # the token is signed
    assert "the-secret" not in json.dumps(seen)


@pytest.mark.asyncio
async def test_transient_answers_are_retried_until_attempts_run_out(
    fake: FakeSqs, make_client: MakeClient
) -> None:
    throttled = {"__type": "com.amazonaws.sqs#RequestThrottled", "message": "slow down"}
    fake.answers += [(503, b"<html>busy</html>", {}), (400, throttled, {}), (200, {"ok": 1}, {})]
    assert await call(make_client()) == {"ok": 1}
    assert len(fake.seen) == 3

    fake.seen.clear()
    fake.answers += [(500, {"__type": "InternalError", "message": "boom"}, {})] * 2
    with pytest.raises(QueueError) as info:
        await call(make_client(attempts=2))
    assert (info.value.code, info.value.status, info.value.outage) == ("InternalError", 500, True)
    assert str(info.value) == "SQS SendMessageBatch failed: InternalError: boom"
    assert len(fake.seen) == 2


@pytest.mark.asyncio
async def test_a_refusal_is_not_retried_and_reads_as_botocore_reads_it(
    fake: FakeSqs, make_client: MakeClient
) -> None:
    missing = {"__type": "com.amazonaws.sqs#QueueDoesNotExist", "message": "no such queue"}
    query = {"x-amzn-query-error": "AWS.SimpleQueueService.NonExistentQueue;Sender"}
    too_long = {"__type": "com.amazonaws.sqs#BatchRequestTooLong", "message": "too long"}
    fake.answers += [
        (400, missing, query),
        (400, missing, {}),
        (403, b"denied", {}),
        (400, too_long, {}),
    ]
    errors = []
    for _ in range(4):
        with pytest.raises(QueueError) as info:
            await call(make_client())
        errors.append((info.value.code, info.value.outage))
    # The query-protocol code wins, as botocore reports it; else the JSON type; else the
    # status. A missing queue or a 403 refuses any request (an outage); a request too
    # long is refused for what it carries.
    assert errors == [
        ("AWS.SimpleQueueService.NonExistentQueue", True),
        ("QueueDoesNotExist", True),
        ("HTTP 403", True),
        ("BatchRequestTooLong", False),
    ]
    assert len(fake.seen) == 4  # one request each: a refusal is final


@pytest.mark.asyncio
async def test_an_unreachable_endpoint_raises_after_its_attempts() -> None:
    """Connection refused, after the policy's attempts: an outage, no SQS code, the cause
    named."""
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    client = plane(f"http://127.0.0.1:{port}", attempts=2)
    try:
        with pytest.raises(QueueError) as info:
            await call(client)
    finally:
        await client.close()
    assert info.value.outage and info.value.code is None
    assert "ClientConnectorError" in str(info.value) and f"127.0.0.1:{port}" in str(info.value)


def test_the_proxy_is_the_one_the_environment_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """HTTPS_PROXY / HTTP_PROXY by the endpoint's scheme, NO_PROXY honoured, as botocore does."""
    for var in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    aws = "https://sqs.eu-west-1.amazonaws.com"
    assert proxy_for(aws) is None
    monkeypatch.setenv("https_proxy", "http://proxy.internal:3128")
    assert proxy_for(aws) == "http://proxy.internal:3128"
    assert proxy_for("http://127.0.0.1:5000") is None  # no http_proxy set
    monkeypatch.setenv("no_proxy", "localhost,.amazonaws.com")
    assert proxy_for(aws) is None
