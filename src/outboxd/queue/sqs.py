"""SQS for the rest of outboxd: the `SqsQueues` facade and the typed values it speaks in.

SQS is reached through two planes, one view of it (endpoint, region, credentials chain,
CA bundle) shared by both:
- the control plane (queue/control_plane.py, aiobotocore): credentials, region and
  endpoint, creating or resolving the queues and their DLQs, attributes, depth;
- the message plane (queue/message_plane.py, signed JSON): the calls that carry
  messages (send, receive, delete, visibility) and the readiness ping.
Both fail with `QueueError` and retry by the one policy of queue/failures.py. Callers see
only this module: typed dataclasses and QueueError.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import structlog

from outboxd.config import SqsSettings
from outboxd.queue.batches import MAX_BATCH_ENTRIES, by_receipt_handle
from outboxd.queue.control_plane import (
    CONNECT_TIMEOUT_S,
    CONTROL_READ_TIMEOUT_S,
    DLQ_RETENTION_S,
    SqsControlPlane,
    dlq_name,
    is_loopback_endpoint,
    resolve_region,
)
from outboxd.queue.failures import (
    MISSING_QUEUE_CODES,
    POLL_RETRY,
    REQUEST_RETRY,
    QueueError,
    short,
)
from outboxd.queue.message_plane import SqsMessagePlane

__all__ = [
    "CONNECT_TIMEOUT_S",
    "CONTROL_READ_TIMEOUT_S",
    "DEFAULT_MAX_CONNECTIONS",
    "DLQ_RETENTION_S",
    "KINDS",
    "MAX_BATCH_ENTRIES",
    "MAX_MESSAGE_BYTES",
    "MAX_WAIT_TIME_S",
    "POLL_READ_TIMEOUT_S",
    "BatchResult",
    "OutgoingMessage",
    "QueueDepth",
    "QueueError",
    "QueueKind",
    "ReceivedMessage",
    "SqsQueues",
    "dlq_name",
    "is_loopback_endpoint",
    "resolve_region",
]

QueueKind = Literal["jobs", "tasks"]
KINDS: tuple[QueueKind, ...] = ("jobs", "tasks")

# Our own limit, checked before sending. SQS has accepted up to 1 MiB since 2025 (moto
# follows), but messages are ids and a type; 256 KiB is the contract
# (docs/contract.md#queue-sqs) and the limit every SQS-compatible server still enforces.
MAX_MESSAGE_BYTES = 256 * 1024
MAX_WAIT_TIME_S = 20  # ReceiveMessage WaitTimeSeconds hard limit
# Must exceed the longest long poll, or the client cuts every empty poll as a read timeout
# (and retries it); 10 s margin covers a slow answer after the full wait.
POLL_READ_TIMEOUT_S = MAX_WAIT_TIME_S + 10.0
# The pool caps concurrent requests per client (botocore's default is 10). Consumer
# handlers each heartbeat/delete, the relay sends, /readyz pings; callers that know the
# consumer concurrency can pass more.
DEFAULT_MAX_CONNECTIONS = 32

_ENTRY_ID = re.compile(r"^[A-Za-z0-9_-]{1,80}$")  # SendMessageBatch's rule for entry ids
_T = TypeVar("_T")

log = structlog.get_logger(__name__)


# The message attributes a receive asks for (String attributes; a sender sets what it has).
MESSAGE_ATTRIBUTES: tuple[str, ...] = ("traceparent",)


@dataclass(frozen=True)
class OutgoingMessage:
    entry_id: str
    body: str
    group_id: str | None = None  # FIFO only; ignored for the standard jobs queue
    dedup_id: str | None = None  # FIFO only; ignored for the standard jobs queue
    # String message attributes (the job's `traceparent`), beside the body.
    attributes: Mapping[str, str] | None = None


@dataclass(frozen=True)
class BatchResult:
    """What became of each entry of a send_batch (the request as a whole failing raises
    QueueError instead, whose `outage` says why)."""

    successful: dict[str, str]  # entry_id -> MessageId
    failed: dict[str, str]  # entry_id -> "Code: Message"
    # Per failed entry, SQS's SenderFault: True when the message itself was refused (too
    # large, invalid contents; our own size and UTF-8 checks too), False when SQS failed
    # it on its side, or the request carrying it failed.
    sender_fault: dict[str, bool] = field(default_factory=dict)
    # Failed entries whose whole request failed as an outage (QueueError.outage): a later
    # request of a batch split by size, after an earlier one went out.
    outage: frozenset[str] = frozenset()


@dataclass(frozen=True)
class ReceivedMessage:
    message_id: str
    receipt_handle: str
    body: str
    receive_count: int  # ApproximateReceiveCount, 1 on the first delivery
    # The String message attributes of MESSAGE_ATTRIBUTES the message carries.
    attributes: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueDepth:
    visible: int
    in_flight: int
    dlq_visible: int


class SqsQueues:
    """The jobs (standard) and tasks (FIFO) queues and their DLQs.

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
        self._max_connections = max_connections
        self._control = SqsControlPlane(settings, endpoint_url, max_connections=max_connections)
        # Sends, deletes, visibility and pings on one; long-poll receives on the other.
        self._sender: SqsMessagePlane | None = None
        self._poller: SqsMessagePlane | None = None
        self._urls: dict[tuple[QueueKind, bool], str] = {}
        # Why the last start() failed, until one succeeds: every call in between says so.
        self._start_failure: QueueError | None = None
        self._recreate_lock = asyncio.Lock()
        self._recreated_at = 0.0

    @property
    def region(self) -> str | None:
        """Resolved by start()."""
        return self._control.region

    # --- lifecycle ---------------------------------------------------------------------

    async def start(self) -> None:
        """Open both planes and resolve the four queue URLs (creating them if configured,
        else checking their attributes).

        On failure everything opened is closed again, so start() may simply be retried;
        until it succeeds every call raises a QueueError that carries this failure.
        """
        if self._sender is not None:
            return
        try:
            view = await self._control.open()
            self._sender, self._poller = (
                SqsMessagePlane(
                    view,
                    connect_timeout_s=CONNECT_TIMEOUT_S,
                    read_timeout_s=read_timeout_s,
                    retry=retry,
                    max_connections=self._max_connections,
                )
                for read_timeout_s, retry in (
                    (CONTROL_READ_TIMEOUT_S, REQUEST_RETRY),
                    (POLL_READ_TIMEOUT_S, POLL_RETRY),
                )
            )
            if self._settings.create_queues:
                await self.ensure_queues()
            else:
                await self._resolve_urls()
        except BaseException as exc:
            await self._shut()
            if isinstance(exc, QueueError):
                self._start_failure = exc
            raise
        self._start_failure = None

    async def close(self) -> None:
        """Close both planes and their connection pools; idempotent."""
        self._start_failure = None
        await self._shut()

    async def _shut(self) -> None:
        planes = (self._sender, self._poller)
        self._sender = self._poller = None
        self._urls.clear()
        try:
            for plane in planes:
                if plane is not None:
                    await plane.close()
        finally:
            await self._control.close()

    async def __aenter__(self) -> SqsQueues:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def _unavailable(self) -> QueueError:
        failure = self._start_failure
        if failure is None:
            return QueueError("SQS queues are not resolved: call start() first")
        # The real cause (connection refused, a certificate, credentials), not a hint
        # about start(): this lands in /readyz, the relay's lastError and the logs.
        return QueueError(short(f"SQS unavailable: {failure}"), failure.code, status=failure.status)

    # --- bootstrap ---------------------------------------------------------------------

    def _name(self, kind: QueueKind) -> str:
        return self._settings.jobs_queue if kind == "jobs" else self._settings.tasks_queue

    async def _resolve_urls(self) -> None:
        for kind in KINDS:
            self._urls[(kind, False)], self._urls[(kind, True)] = await self._control.resolve_pair(
                self._name(kind)
            )
        for kind in KINDS:
            try:
                await self._control.check_pair(
                    self._name(kind), self._urls[(kind, False)], self._urls[(kind, True)]
                )
            except QueueError as exc:
                # Checking is advice: queues that resolve are used, checked or not.
                log.warning("sqs_queue_check_failed", queue=self._name(kind), error=str(exc))

    async def ensure_queues(self) -> None:
        """Create both queues and their DLQs, or converge existing ones; idempotent
        (SqsControlPlane.ensure_pair)."""
        for kind in KINDS:
            self._urls[(kind, False)], self._urls[(kind, True)] = await self._control.ensure_pair(
                self._name(kind)
            )

    async def _recreating_missing(self, call: Callable[[], Awaitable[_T]]) -> _T:
        """`call()`; if SQS says its queue does not exist and `sqs.create_queues` is on,
        create the queues again (ensure_queues) and make the call once more.

        Without this a queue lost while the daemon runs (an SQS-compatible server that
        restarted empty) would fail every send and receive until a restart.
        """
        try:
            return await call()
        except QueueError as exc:
            if exc.code not in MISSING_QUEUE_CODES or not self._settings.create_queues:
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

    # --- messages ----------------------------------------------------------------------

    def queue_url(self, kind: QueueKind, dlq: bool = False) -> str:
        try:
            return self._urls[(kind, dlq)]
        except KeyError:
            raise self._unavailable() from None

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
        sender_fault: dict[str, bool] = {}
        outage: set[str] = set()
        entries: list[tuple[dict[str, Any], int]] = []
        for msg in messages:
            if not _ENTRY_ID.match(msg.entry_id):
                raise ValueError(f"invalid batch entry id {msg.entry_id!r}")
            if msg.entry_id in seen:
                raise ValueError(f"duplicate batch entry id {msg.entry_id!r}")
            seen.add(msg.entry_id)
            if fifo and not (msg.group_id and msg.dedup_id):
                raise ValueError(f"FIFO message {msg.entry_id!r} needs group_id and dedup_id")
            try:
                # SQS counts attribute names, types and values in a message's size.
                size = len(msg.body.encode("utf-8")) + sum(
                    len(k.encode()) + len(b"String") + len(v.encode())
                    for k, v in (msg.attributes or {}).items()
                )
            except UnicodeEncodeError:
                failed[msg.entry_id] = "InvalidMessageContents: body is not valid UTF-8"
                sender_fault[msg.entry_id] = True
                continue
            if size > MAX_MESSAGE_BYTES:
                failed[msg.entry_id] = (
                    f"MessageTooLong: body is {size} bytes, the limit is {MAX_MESSAGE_BYTES}"
                )
                sender_fault[msg.entry_id] = True
                continue
            entry: dict[str, Any] = {"Id": msg.entry_id, "MessageBody": msg.body}
            if msg.attributes:
                entry["MessageAttributes"] = {
                    k: {"DataType": "String", "StringValue": v} for k, v in msg.attributes.items()
                }
            if fifo:
                assert msg.group_id is not None and msg.dedup_id is not None
                entry["MessageGroupId"] = msg.group_id
                entry["MessageDeduplicationId"] = msg.dedup_id
            entries.append((entry, size))

        successful: dict[str, str] = {}
        self.queue_url(kind)  # not started: QueueError before anything else

        async def send(chunk: list[dict[str, Any]]) -> Any:
            return await self._plane().call(
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
                    sender_fault[entry["Id"]] = not exc.outage
                    if exc.outage:
                        outage.add(entry["Id"])
                continue
            sent_entries = {entry["Id"]: entry for entry in chunk}
            for ok in resp.get("Successful", []):
                entry_id = str(ok["Id"])
                entry = sent_entries.get(entry_id, {})
                md5 = ok.get("MD5OfMessageBody")
                if md5 is not None and md5 != _md5(entry.get("MessageBody", "")):
                    # What SQS stored is not what we sent: publish it again.
                    failed[entry_id] = "MD5OfMessageBody does not match the body sent"
                    sender_fault[entry_id] = False
                    continue
                md5_attributes = ok.get("MD5OfMessageAttributes")
                if md5_attributes is not None and md5_attributes != _md5_attributes(
                    entry.get("MessageAttributes", {})
                ):
                    failed[entry_id] = "MD5OfMessageAttributes does not match the attributes sent"
                    sender_fault[entry_id] = False
                    continue
                successful[entry_id] = str(ok["MessageId"])
            for bad in resp.get("Failed", []):
                entry_id = str(bad["Id"])
                failed[entry_id] = f"{bad.get('Code', 'Unknown')}: {bad.get('Message', '')}"
                sender_fault[entry_id] = bool(bad.get("SenderFault", False))
        return BatchResult(successful, failed, sender_fault, frozenset(outage))

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
        """A short poll of the DLQ (for the consumer's sweep of the work that died there)."""
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
            "MessageAttributeNames": list(MESSAGE_ATTRIBUTES),
        }
        if visibility_timeout_s is not None:
            params["VisibilityTimeout"] = visibility_timeout_s
        resp = await self._plane(poll=True).call("ReceiveMessage", params)
        return [
            ReceivedMessage(
                message_id=str(m["MessageId"]),
                receipt_handle=str(m["ReceiptHandle"]),
                body=str(m.get("Body", "")),
                receive_count=int(m.get("Attributes", {}).get("ApproximateReceiveCount", 1)),
                attributes=_string_attributes(m.get("MessageAttributes")),
            )
            for m in resp.get("Messages", [])
        ]

    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None:
        params = {"QueueUrl": self.queue_url(kind, dlq), "ReceiptHandle": receipt_handle}
        await self._plane().call("DeleteMessage", params)

    async def delete_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], dlq: bool = False
    ) -> dict[str, str]:
        """DeleteMessageBatch of up to 10: the ones SQS failed, receipt handle -> error."""
        entries = [{"ReceiptHandle": h} for h in receipt_handles]
        url = self.queue_url(kind, dlq)
        return await by_receipt_handle(self._plane().call, "DeleteMessageBatch", url, entries)

    async def change_visibility_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], timeout_s: int, dlq: bool = False
    ) -> dict[str, str]:
        """ChangeMessageVisibilityBatch of up to 10, one timeout for all; as delete_batch."""
        entries = [{"ReceiptHandle": h, "VisibilityTimeout": timeout_s} for h in receipt_handles]
        url, call = self.queue_url(kind, dlq), self._plane().call
        return await by_receipt_handle(call, "ChangeMessageVisibilityBatch", url, entries)

    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None:
        """ChangeMessageVisibility: 0 releases the message now, more extends (heartbeat)."""
        params = {
            "QueueUrl": self.queue_url(kind, dlq),
            "ReceiptHandle": receipt_handle,
            "VisibilityTimeout": timeout_s,
        }
        await self._plane().call("ChangeMessageVisibility", params)

    async def depth(self, kind: QueueKind) -> QueueDepth:
        """Approximate counts (SQS's are eventually consistent, moto's exact)."""
        main = await self._control.attributes(
            self.queue_url(kind),
            ["ApproximateNumberOfMessages", "ApproximateNumberOfMessagesNotVisible"],
        )
        dead = await self._control.attributes(
            self.queue_url(kind, dlq=True), ["ApproximateNumberOfMessages"]
        )
        return QueueDepth(
            visible=int(main.get("ApproximateNumberOfMessages", 0)),
            in_flight=int(main.get("ApproximateNumberOfMessagesNotVisible", 0)),
            dlq_visible=int(dead.get("ApproximateNumberOfMessages", 0)),
        )

    async def ping(self) -> None:
        """One signed GetQueueAttributes on the jobs queue, on the message plane that sends:
        QueueError unless a message could go out now (not merely botocore reaching SQS)."""
        params = {"QueueUrl": self.queue_url("jobs"), "AttributeNames": ["QueueArn"]}
        await self._plane().call("GetQueueAttributes", params)

    def _plane(self, poll: bool = False) -> SqsMessagePlane:
        """The sending plane, or the long-poll one (its longer read timeout, one retry)."""
        plane = self._poller if poll else self._sender
        if plane is None:
            raise self._unavailable()
        return plane


def _md5(body: str) -> str:
    return hashlib.md5(body.encode("utf-8"), usedforsecurity=False).hexdigest()


def _md5_attributes(attributes: Mapping[str, Mapping[str, str]]) -> str:
    """SQS's MD5OfMessageAttributes of String attributes: per attribute in name order, the
    name, the data type and the value, each as a 4-byte big-endian length and its UTF-8
    bytes, with a transport byte 1 (string) before the value."""
    digest = hashlib.md5(usedforsecurity=False)
    for name in sorted(attributes):
        attr = attributes[name]
        for part in (name, attr["DataType"]):
            raw = part.encode("utf-8")
            digest.update(len(raw).to_bytes(4, "big") + raw)
        value = attr["StringValue"].encode("utf-8")
        digest.update(b"\x01" + len(value).to_bytes(4, "big") + value)
    return digest.hexdigest()


def _string_attributes(raw: Any) -> dict[str, str]:
    """The String message attributes of a received message (anything else left out)."""
    if not isinstance(raw, dict):
        return {}
    out: dict[str, str] = {}
    for name, attr in raw.items():
        if isinstance(attr, dict) and isinstance(attr.get("StringValue"), str):
            out[str(name)] = attr["StringValue"]
    return out


def _chunks_by_size(
    entries: Sequence[tuple[dict[str, Any], int]],
) -> list[list[dict[str, Any]]]:
    """Split entries so each request's bodies total at most MAX_MESSAGE_BYTES.

    SQS limits the whole batch's payload like a single message; with small messages
    this is always one chunk.
    """
    chunks: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
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
