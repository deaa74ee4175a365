"""The aiobotocore adapter for SQS, and queue bootstrap (DLQs, redrive policies).

Everything outside this module sees typed dataclasses and `QueueError`; botocore's
untyped responses and its zoo of exceptions stay in here.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import json
import os
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, TypeVar
from urllib.parse import urlsplit

import aiohttp
import structlog
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore.exceptions import BotoCoreError, ClientError

from outboxd.config import SqsSettings, is_loopback_host
from outboxd.queue.sqs_json import Credentials, CredentialSource, SqsFault, SqsJsonClient

QueueKind = Literal["jobs", "tasks"]
KINDS: tuple[QueueKind, ...] = ("jobs", "tasks")

# Our own limit, checked before sending. SQS has accepted up to 1 MiB since 2025 (moto
# follows), but messages are ids and a type; 256 KiB is the contract
# (docs/contract.md#queue-sqs) and the limit every SQS-compatible server still enforces.
MAX_MESSAGE_BYTES = 256 * 1024
MAX_BATCH_ENTRIES = 10  # SendMessageBatch / ReceiveMessage hard limit
MAX_WAIT_TIME_S = 20  # ReceiveMessage WaitTimeSeconds hard limit
# Kept longer than the main queues' default 4 days: in a standard queue a message keeps
# its original enqueue time when it moves to the DLQ, so a short DLQ retention could
# drop it soon after arriving, before anyone looked (AWS's own advice).
DLQ_RETENTION_S = 14 * 24 * 3600
LOOPBACK_DUMMY_CREDENTIAL = "outboxd"
LOOPBACK_DEFAULT_REGION = "us-east-1"

# --- client configuration ---------------------------------------------------------------
# One botocore client for the queues' bootstrap and attributes, and two JSON clients
# (queue/sqs_json.py) for the calls per message, because a long poll and a send want
# opposite read timeouts: a receive legitimately waits up to 20 s for the first byte,
# while a send, delete or visibility change that has not answered in a few seconds is
# stuck, and the relay / consumer should learn that quickly and apply their own backoff.
CONNECT_TIMEOUT_S = 2.0  # loopback or the regional endpoint: 2 s without a TCP handshake is down
CONTROL_READ_TIMEOUT_S = 5.0
# Must exceed the longest long poll, or the client cuts every empty poll as a read timeout
# (and retries it); 10 s margin covers a slow answer after the full wait.
POLL_READ_TIMEOUT_S = MAX_WAIT_TIME_S + 10.0
# botocore's "standard" mode, which the JSON clients follow too, retries transient errors
# (connection reset/refused, 5xx, throttling) with jittered exponential backoff (rand x
# 1 s, then rand x 2 s). Attempts stay few because the relay and the consumer already
# retry with their own, longer backoff: the client only smooths over a blip, such as a
# pooled keep-alive connection the server closed.
# So a dead endpoint costs at most ~3 s of backoff plus the connect timeouts.
# `total_max_attempts`, not `max_attempts`: in a client Config the latter counts
# *retries* (3 would mean 4 attempts), unlike AWS_MAX_ATTEMPTS.
CONTROL_RETRIES: dict[str, Any] = {"mode": "standard", "total_max_attempts": 3}
# A failed receive is simply polled again by the consumer's loop; one retry suffices.
POLL_RETRIES: dict[str, Any] = {"mode": "standard", "total_max_attempts": 2}
# The pool caps concurrent requests per client (botocore's default is 10). Consumer
# handlers each heartbeat/delete, the relay sends, /readyz pings; callers that know the
# consumer concurrency can pass more.
DEFAULT_MAX_CONNECTIONS = 32

_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")  # SendMessageBatch's rule for entry ids
_ERROR_TEXT_MAX = 300

log = structlog.get_logger(__name__)


class QueueError(Exception):
    """An SQS or transport failure. str() is short and never holds credentials.

    `code` is SQS's error code when SQS answered (e.g. "ReceiptHandleIsInvalid"),
    None for transport failures (refused, timed out) and local ones.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class OutgoingMessage:
    entry_id: str
    body: str
    group_id: str | None = None  # FIFO only; ignored for the standard jobs queue
    dedup_id: str | None = None  # FIFO only; ignored for the standard jobs queue


@dataclass(frozen=True)
class BatchResult:
    successful: dict[str, str]  # entry_id -> MessageId
    failed: dict[str, str]  # entry_id -> "Code: Message"


@dataclass(frozen=True)
class ReceivedMessage:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int  # ApproximateReceiveCount, 1 on the first delivery


@dataclass(frozen=True)
class QueueDepth:
    visible: int
    in_flight: int
    dlq_visible: int


def dlq_name(name: str) -> str:
    """`<name>-dlq`, or `<base>-dlq.fifo` for a FIFO queue (a FIFO DLQ must be FIFO too)."""
    if name.endswith(".fifo"):
        return f"{name.removesuffix('.fifo')}-dlq.fifo"
    return f"{name}-dlq"


def is_loopback_endpoint(endpoint_url: str | None) -> bool:
    if endpoint_url is None:
        return False
    host = urlsplit(endpoint_url).hostname
    return host is not None and is_loopback_host(host)


def resolve_region(
    settings: SqsSettings, endpoint_url: str | None, session: Any = None
) -> str | None:
    """sqs.region, else AWS_REGION, else botocore's (AWS_DEFAULT_REGION, ~/.aws/config).

    Reads local configuration only, never the network. A loopback endpoint (moto, the
    embedded server) ignores the region, so any valid one is returned for it.
    """
    if settings.region:
        return settings.region
    region = os.environ.get("AWS_REGION") or (session or AioSession()).get_config_variable("region")
    if region:
        return str(region)
    if is_loopback_endpoint(endpoint_url):
        return LOOPBACK_DEFAULT_REGION
    return None


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_MAX else text[: _ERROR_TEXT_MAX - 1] + "…"


def _raise_queue_error(operation: str, exc: BaseException) -> NoReturn:
    if isinstance(exc, SqsFault):
        raise QueueError(_short(f"SQS {operation} failed: {exc}"), exc.code) from exc
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        message = str(error.get("Message") or "")
        raise QueueError(_short(f"SQS {operation} failed: {code}: {message}"), code) from exc
    # botocore's transport messages name the endpoint URL, never keys or signatures.
    detail = str(exc) or type(exc).__name__
    raise QueueError(_short(f"SQS {operation} failed: {type(exc).__name__}: {detail}")) from exc


# Exactly what a call to SQS can raise besides our own errors. asyncio.CancelledError is
# deliberately absent: a shutdown cancelling a long poll must stay a cancellation.
_SQS_FAILURES = (
    SqsFault,
    BotoCoreError,
    ClientError,
    aiohttp.ClientError,
    TimeoutError,
    OSError,
)


@asynccontextmanager
async def _sqs_call(operation: str) -> AsyncIterator[None]:
    try:
        yield
    except _SQS_FAILURES as exc:
        _raise_queue_error(operation, exc)


def _error_code(exc: BaseException) -> str | None:
    if isinstance(exc, SqsFault):
        return exc.code
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code")
        return str(code) if code is not None else None
    return None


# CreateQueue answers this when the queue exists with different attributes. botocore
# reports the query-protocol code ("QueueAlreadyExists") for SQS's JSON protocol; the
# JSON name is accepted too in case a server does not send the compatibility header.
_QUEUE_EXISTS_CODES = frozenset(
    {"QueueAlreadyExists", "QueueNameExists", "AWS.SimpleQueueService.QueueNameExists"}
)
# A call on a queue URL whose queue is gone: deleted, or a local server (moto, the
# embedded one) restarted with nothing in memory. Query-protocol and JSON names.
_MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
_T = TypeVar("_T")


class SqsQueues:
    """The jobs (standard) and tasks (FIFO) queues and their DLQs, over aiobotocore.

    `start()` before use, `close()` after; every SQS or transport failure raises QueueError.
    """

    def __init__(
        self,
        settings: SqsSettings,
        endpoint_url: str | None,
        *,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        on_recreated: Callable[[float], Awaitable[object]] | None = None,
    ) -> None:
        self._on_recreated = on_recreated
        if endpoint_url == "embedded":
            raise ValueError('endpoint_url "embedded" must be resolved to a URL by the caller')
        if not settings.tasks_queue.endswith(".fifo"):
            raise ValueError("sqs.tasks_queue must end in .fifo")
        if settings.jobs_queue.endswith(".fifo"):
            raise ValueError("sqs.jobs_queue must be a standard queue (no .fifo)")
        self._settings = settings
        self._endpoint_url = endpoint_url
        self._max_connections = max_connections
        self._stack: AsyncExitStack | None = None
        # aiobotocore clients are untyped; the Any stays inside this class.
        self._client: Any = None  # queue bootstrap and attributes
        # The calls per message, on SQS's JSON protocol (queue/sqs_json.py): sends,
        # deletes and visibility on one, long-poll receives on the other.
        self._wire: SqsJsonClient | None = None
        self._poll_wire: SqsJsonClient | None = None
        self._urls: dict[tuple[QueueKind, bool], str] = {}
        self._recreate_lock = asyncio.Lock()
        self._recreated_at = 0.0
        self.region: str | None = None  # resolved by start()

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Create the clients and resolve the four queue URLs (creating them if configured).

        On failure everything opened is closed again, so start() may simply be retried.
        """
        if self._stack is not None:
            return
        stack = AsyncExitStack()
        try:
            async with _sqs_call("client setup"):
                session = AioSession()
                region = self._resolve_region(session)
                self.region = region
                credentials = await self._credential_overrides(session)
                common: dict[str, Any] = {
                    "region_name": region,
                    "endpoint_url": self._endpoint_url,
                    **credentials,
                }
                self._client = await stack.enter_async_context(
                    session.create_client("sqs", config=self._config(), **common)
                )
                source = await self._credential_source(session, credentials)
                # The endpoint as botocore resolved it (sqs.endpoint_url, or the region's).
                endpoint = str(self._client.meta.endpoint_url)
                self._wire, self._poll_wire = (
                    SqsJsonClient(
                        endpoint,
                        region,
                        source,
                        connect_timeout_s=CONNECT_TIMEOUT_S,
                        max_connections=self._max_connections,
                    )
                    for _ in range(2)
                )
                for wire in (self._wire, self._poll_wire):
                    stack.push_async_callback(wire.close)
            self._stack = stack
            if self._settings.create_queues:
                await self.ensure_queues()
            else:
                await self._resolve_urls()
        except BaseException:
            self._stack = None
            self._client = self._wire = self._poll_wire = None
            self._urls.clear()
            await stack.aclose()
            raise

    async def close(self) -> None:
        """Close both clients and their connection pools; idempotent."""
        stack, self._stack = self._stack, None
        self._client = self._wire = self._poll_wire = None
        self._urls.clear()
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> SqsQueues:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _config(self) -> AioConfig:
        return AioConfig(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=CONTROL_READ_TIMEOUT_S,
            retries=dict(CONTROL_RETRIES),
            max_pool_connections=self._max_connections,
            # Loading the SQS service model from disk is blocking file I/O and JSON
            # parsing; do it in a thread rather than on the event loop.
            warm_up_loader_caches=True,
            # Every call is built in this module from typed values: botocore's walk of
            # the request against the service model checks nothing we do not.
            parameter_validation=False,
        )

    def _resolve_region(self, session: Any) -> str:
        region = resolve_region(self._settings, self._endpoint_url, session)
        if region is None:
            raise QueueError("no AWS region configured: set sqs.region (or AWS_REGION)")
        return region

    async def _credential_overrides(self, session: Any) -> dict[str, str]:
        """Dummy keys for a loopback server when the standard chain finds none.

        Real credentials, wherever the chain finds them, are never replaced. For a
        loopback endpoint the instance-metadata and container providers are dropped
        first: they would try link-local HTTP for seconds on a laptop, and a role's
        credentials mean nothing to a local server anyway.
        """
        if not is_loopback_endpoint(self._endpoint_url):
            return {}
        resolver = session.get_component("credential_provider")
        for method in ("iam-role", "container-role"):
            resolver.remove(method)
        if await session.get_credentials() is not None:
            return {}
        return {
            "aws_access_key_id": LOOPBACK_DUMMY_CREDENTIAL,
            "aws_secret_access_key": LOOPBACK_DUMMY_CREDENTIAL,
        }

    async def _credential_source(self, session: Any, overrides: dict[str, str]) -> CredentialSource:
        """What the JSON client signs with: the same credentials as the botocore client
        (the overrides, or the chain's), read afresh per request so that refreshable
        ones (a role's) renew as botocore would renew them."""
        if overrides:
            fixed = Credentials(overrides["aws_access_key_id"], overrides["aws_secret_access_key"])

            async def static() -> Credentials:
                return fixed

            return static
        chain = await session.get_credentials()

        async def current() -> Credentials:
            if chain is None:
                raise QueueError("no AWS credentials found (environment, files or role)")
            frozen = await chain.get_frozen_credentials()
            return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

        return current

    # --- bootstrap ---------------------------------------------------------------------

    def _names(self, kind: QueueKind) -> tuple[str, str]:
        name = self._settings.jobs_queue if kind == "jobs" else self._settings.tasks_queue
        return name, dlq_name(name)

    async def _resolve_urls(self) -> None:
        client = self._require_client()
        for kind in KINDS:
            for dlq, name in zip((False, True), self._names(kind), strict=True):
                async with _sqs_call(f"GetQueueUrl {name}"):
                    resp = await client.get_queue_url(QueueName=name)
                self._urls[(kind, dlq)] = str(resp["QueueUrl"])

    async def ensure_queues(self) -> None:
        """Create both queues and their DLQs, or converge existing ones; idempotent.

        DLQs first, since a redrive policy names its DLQ's ARN. A queue that exists with
        other mutable attributes (visibility timeout, redrive policy) is updated in place.
        Safe to run from several instances at once: CreateQueue with equal attributes
        returns the existing queue.
        """
        client = self._require_client()
        for kind in KINDS:
            name, dead_name = self._names(kind)
            fifo = kind == "tasks"
            fifo_attrs = (
                # We always pass a dedup id (the task's), so content-based dedup stays
                # off: two tasks with equal bodies are still two tasks.
                {"FifoQueue": "true", "ContentBasedDeduplication": "false"} if fifo else {}
            )
            dlq_url = await self._ensure_queue(
                dead_name,
                {**fifo_attrs, "MessageRetentionPeriod": str(DLQ_RETENTION_S)},
            )
            async with _sqs_call(f"GetQueueAttributes {dead_name}"):
                resp = await client.get_queue_attributes(
                    QueueUrl=dlq_url, AttributeNames=["QueueArn"]
                )
            dlq_arn = str(resp["Attributes"]["QueueArn"])
            redrive = json.dumps(
                {
                    "deadLetterTargetArn": dlq_arn,
                    "maxReceiveCount": self._settings.max_receive_count,
                }
            )
            main_url = await self._ensure_queue(
                name,
                {
                    **fifo_attrs,
                    "VisibilityTimeout": str(self._settings.visibility_timeout_s),
                    "RedrivePolicy": redrive,
                },
            )
            self._urls[(kind, True)] = dlq_url
            self._urls[(kind, False)] = main_url

    async def _recreating_missing(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call()`; if SQS says its queue does not exist and `sqs.create_queues` is on,
        create the queues again (ensure_queues) and make the call once more.

        Without this a queue lost while the daemon runs (an SQS-compatible server that
        restarted empty) would fail every send and receive until a restart.
        """
        try:
            return await call()
        except QueueError as exc:
            if exc.code not in _MISSING_QUEUE_CODES or not self._settings.create_queues:
                raise
            failed_at = time.time()
            async with self._recreate_lock:
                # Several calls notice the loss at once; the first recreates, the
                # others only retry. A second recreation would also republish rows
                # published to the new queue in between: duplicates for nothing.
                if self._recreated_at < failed_at:
                    log.warning("sqs_queue_missing_recreating", error=str(exc))
                    recreating_at = time.time()
                    await self.ensure_queues()
                    self._recreated_at = time.time()
                    # A queue that was gone took its messages along: what they carried
                    # (published before it was recreated) must be published again, or
                    # those jobs stay RUNNING forever.
                    if self._on_recreated is not None:
                        await self._on_recreated(recreating_at)
        return await call()

    async def _ensure_queue(self, name: str, attributes: dict[str, str]) -> str:
        client = self._require_client()
        try:
            resp = await client.create_queue(QueueName=name, Attributes=attributes)
            return str(resp["QueueUrl"])
        except _SQS_FAILURES as exc:
            if _error_code(exc) not in _QUEUE_EXISTS_CODES:
                _raise_queue_error(f"CreateQueue {name}", exc)
        # It exists with other attributes: converge. FifoQueue cannot change (and cannot
        # differ here, the .fifo suffix decides it), so it is left out of the update.
        async with _sqs_call(f"GetQueueUrl {name}"):
            url = str((await client.get_queue_url(QueueName=name))["QueueUrl"])
        mutable = {k: v for k, v in attributes.items() if k != "FifoQueue"}
        async with _sqs_call(f"SetQueueAttributes {name}"):
            await client.set_queue_attributes(QueueUrl=url, Attributes=mutable)
        log.info("sqs_queue_attributes_converged", queue=name, attributes=sorted(mutable))
        return url

    # --- messages ----------------------------------------------------------------------

    def queue_url(self, kind: QueueKind, dlq: bool = False) -> str:
        try:
            return self._urls[(kind, dlq)]
        except KeyError:
            raise QueueError("SQS queues are not resolved: call start() first") from None

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        """SendMessageBatch. Per-entry failures (including oversize bodies) land in `failed`.

        Raises ValueError for caller bugs (more than 10 entries, duplicate or malformed
        entry ids, a FIFO message without group or dedup id) before anything is sent,
        and QueueError when the request as a whole failed, so nothing was sent.
        """
        if len(messages) > MAX_BATCH_ENTRIES:
            raise ValueError(f"at most {MAX_BATCH_ENTRIES} messages per batch, got {len(messages)}")
        fifo = kind == "tasks"
        seen: set[str] = set()
        failed: dict[str, str] = {}
        entries: list[tuple[dict[str, str], int]] = []
        for msg in messages:
            if not _ENTRY_ID.match(msg.entry_id):
                raise ValueError(f"invalid batch entry id {msg.entry_id!r}")
            if msg.entry_id in seen:
                raise ValueError(f"duplicate batch entry id {msg.entry_id!r}")
            seen.add(msg.entry_id)
            if fifo and not (msg.group_id and msg.dedup_id):
                raise ValueError(f"FIFO message {msg.entry_id!r} needs group_id and dedup_id")
            try:
                size = len(msg.body.encode("utf-8"))
            except UnicodeEncodeError:
                failed[msg.entry_id] = "InvalidMessageContents: body is not valid UTF-8"
                continue
            if size > MAX_MESSAGE_BYTES:
                failed[msg.entry_id] = (
                    f"MessageTooLong: body is {size} bytes, the limit is {MAX_MESSAGE_BYTES}"
                )
                continue
            entry = {"Id": msg.entry_id, "MessageBody": msg.body}
            if fifo:
                assert msg.group_id is not None and msg.dedup_id is not None
                entry["MessageGroupId"] = msg.group_id
                entry["MessageDeduplicationId"] = msg.dedup_id
            entries.append((entry, size))

        successful: dict[str, str] = {}
        self.queue_url(kind)  # not started: QueueError before anything else

        async def send(chunk: list[dict[str, str]]) -> Any:
            return await self._call(
                "SendMessageBatch", {"QueueUrl": self.queue_url(kind), "Entries": chunk}
            )

        for i, chunk in enumerate(_chunks_by_size(entries)):
            try:
                resp = await self._recreating_missing(functools.partial(send, chunk))
            except QueueError as exc:
                if i == 0:
                    raise
                # Earlier chunks were sent: report them, so the relay marks those SENT
                # instead of publishing them a second time.
                for entry in chunk:
                    failed[entry["Id"]] = str(exc)
                continue
            bodies = {entry["Id"]: entry["MessageBody"] for entry in chunk}
            for ok in resp.get("Successful", []):
                entry_id = str(ok["Id"])
                md5 = ok.get("MD5OfMessageBody")
                if md5 is not None and md5 != _md5(bodies.get(entry_id, "")):
                    # What SQS stored is not what we sent: publish it again.
                    failed[entry_id] = "MD5OfMessageBody does not match the body sent"
                    continue
                successful[entry_id] = str(ok["MessageId"])
            for bad in resp.get("Failed", []):
                failed[str(bad["Id"])] = f"{bad.get('Code', 'Unknown')}: {bad.get('Message', '')}"
        return BatchResult(successful=successful, failed=failed)

    async def receive(
        self,
        kind: QueueKind,
        max_messages: int,
        wait_time_s: int | None = None,
        visibility_timeout_s: int | None = None,
    ) -> list[ReceivedMessage]:
        """ReceiveMessage (long poll of `wait_time_s`, default sqs.wait_time_s)."""
        return await self._recreating_missing(
            lambda: self._receive(
                self.queue_url(kind), max_messages, wait_time_s, visibility_timeout_s
            )
        )

    async def receive_dlq(
        self, kind: QueueKind, max_messages: int, visibility_timeout_s: int
    ) -> list[ReceivedMessage]:
        """A short poll of the DLQ (for the consumer's sweep of jobs that died there)."""
        return await self._recreating_missing(
            lambda: self._receive(
                self.queue_url(kind, dlq=True), max_messages, 0, visibility_timeout_s
            )
        )

    async def _receive(
        self,
        url: str,
        max_messages: int,
        wait_time_s: int | None,
        visibility_timeout_s: int | None,
    ) -> list[ReceivedMessage]:
        if not 1 <= max_messages <= MAX_BATCH_ENTRIES:
            raise ValueError(f"max_messages must be 1..{MAX_BATCH_ENTRIES}, got {max_messages}")
        wait = self._settings.wait_time_s if wait_time_s is None else wait_time_s
        if not 0 <= wait <= MAX_WAIT_TIME_S:
            # Beyond 20 s SQS refuses, and POLL_READ_TIMEOUT_S assumes this bound.
            raise ValueError(f"wait_time_s must be 0..{MAX_WAIT_TIME_S}, got {wait}")
        params: dict[str, Any] = {
            "QueueUrl": url,
            "MaxNumberOfMessages": max_messages,
            "WaitTimeSeconds": wait,
            "MessageSystemAttributeNames": ["ApproximateReceiveCount"],
        }
        if visibility_timeout_s is not None:
            params["VisibilityTimeout"] = visibility_timeout_s
        resp = await self._call("ReceiveMessage", params, poll=True)
        return [
            ReceivedMessage(
                message_id=str(m["MessageId"]),
                receipt_handle=str(m["ReceiptHandle"]),
                body=str(m.get("Body", "")),
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
            )
            for m in resp.get("Messages", [])
        ]

    async def delete(self, kind: QueueKind, receipt_handle: str) -> None:
        params = {"QueueUrl": self.queue_url(kind), "ReceiptHandle": receipt_handle}
        await self._call("DeleteMessage", params)

    async def change_visibility(self, kind: QueueKind, receipt_handle: str, timeout_s: int) -> None:
        """ChangeMessageVisibility: 0 releases the message now, more extends (heartbeat)."""
        params = {
            "QueueUrl": self.queue_url(kind),
            "ReceiptHandle": receipt_handle,
            "VisibilityTimeout": timeout_s,
        }
        await self._call("ChangeMessageVisibility", params)

    async def depth(self, kind: QueueKind) -> QueueDepth:
        """Approximate counts (SQS's are eventually consistent, moto's exact)."""
        main = await self._attributes(
            self.queue_url(kind),
            ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        dead = await self._attributes(
            self.queue_url(kind, dlq=True), ["ApproximateNumberOfMessages"]
        )
        return QueueDepth(
            visible=int(main.get("ApproximateNumberOfMessages", 0)),
            in_flight=int(main.get("ApproximateNumberOfMessagesNotVisible", 0)),
            dlq_visible=int(dead.get("ApproximateNumberOfMessages", 0)),
        )

    async def ping(self) -> None:
        """One cheap authenticated call on the jobs queue; QueueError if SQS does not answer."""
        await self._attributes(self.queue_url("jobs"), ["QueueArn"])

    async def _attributes(self, url: str, names: list[str]) -> dict[str, Any]:
        async with _sqs_call("GetQueueAttributes"):
            resp = await self._require_client().get_queue_attributes(
                QueueUrl=url, AttributeNames=names
            )
        attrs: dict[str, Any] = resp.get("Attributes", {})
        return attrs

    def _require_client(self) -> Any:
        if self._client is None:
            raise QueueError("SQS client is not started: call start() first")
        return self._client

    async def _call(
        self, operation: str, params: dict[str, Any], *, poll: bool = False
    ) -> dict[str, Any]:
        """One call per message or batch, on the JSON client (the long-poll one for
        receives, with its longer read timeout and single retry)."""
        wire = self._poll_wire if poll else self._wire
        if wire is None:
            raise QueueError("SQS client is not started: call start() first")
        retries = POLL_RETRIES if poll else CONTROL_RETRIES
        async with _sqs_call(operation):
            return await wire.call(
                operation,
                params,
                read_timeout_s=POLL_READ_TIMEOUT_S if poll else CONTROL_READ_TIMEOUT_S,
                attempts=int(retries["total_max_attempts"]),
            )


def _md5(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _chunks_by_size(
    entries: Sequence[tuple[dict[str, str], int]],
) -> list[list[dict[str, str]]]:
    """Split entries so each request's bodies total at most MAX_MESSAGE_BYTES.

    SQS limits the whole batch's payload like a single message; with small messages
    this is always one chunk.
    """
    chunks: list[list[dict[str, str]]] = []
    current: list[dict[str, str]] = []
    total = 0
    for entry, size in entries:
        if current and total + size > MAX_MESSAGE_BYTES:
            chunks.append(current)
            current, total = [], 0
        current.append(entry)
        total += size
    if current:
        chunks.append(current)
    return chunks
