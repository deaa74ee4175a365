"""What can go wrong talking to SQS, said once for both planes: `QueueError` and whether a
failure is an outage or a refusal, the one mapping of botocore's exceptions and the JSON
protocol's answers to it, and the one retry policy (attempts, jittered backoff, which
failures are transient).

The control plane (queue/control_plane.py, aiobotocore) and the message plane
(queue/message_plane.py, signed JSON) both run every call through `RetryPolicy.run`, so a
connection refused or a throttled answer is retried, classified and worded the same way
whichever half made the call. botocore's own retries are switched off for that reason.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TypeVar

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError
from botocore.exceptions import SSLError as BotoSSLError

from outboxd.errors import OutboxdError

_T = TypeVar("_T")
_ERROR_TEXT_MAX = 300

# What botocore's standard retry mode treats as throttling.
THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
RETRY_STATUSES = frozenset({500, 502, 503, 504})
# A call on a queue URL whose queue is gone: deleted, or a local server (moto, the
# embedded one) restarted with nothing in memory. Query-protocol and JSON names.
MISSING_QUEUE_CODES = frozenset({"AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist"})
# CreateQueue answers this when the queue exists with different attributes. botocore
# reports the query-protocol code ("QueueAlreadyExists") for SQS's JSON protocol; the
# JSON name is accepted too in case a server does not send the compatibility header.
QUEUE_EXISTS_CODES = frozenset(
    {"QueueAlreadyExists", "QueueNameExists", "AWS.SimpleQueueService.QueueNameExists"}
)
# 4xx answers that refuse every request alike, whatever it carries: the queue is gone, the
# credentials or the queue's KMS key do not let us in, too many messages in flight, or an
# answer that is not SQS's. The other 4xx name the request itself (too large, invalid).
_UNREACHABLE_CODES = MISSING_QUEUE_CODES | {
    "InvalidAddress",  # the queue URL's account
    "AccessDenied",
    "AccessDeniedException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "IncompleteSignature",
    "MissingAuthenticationToken",
    "InvalidSecurity",
    "ExpiredToken",
    "ExpiredTokenException",
    "RequestExpired",
    "KmsAccessDenied",
    "KmsDisabled",
    "KmsInvalidState",
    "KmsNotFound",
    "KmsOptInRequired",
    "KmsThrottled",
    "OverLimit",
    "AWS.SimpleQueueService.OverLimit",
    "InvalidResponse",
}
_UNREACHABLE_STATUSES = frozenset({401, 403, 407, 408, 429})


class QueueError(OutboxdError):
    """An SQS or transport failure. str() is short and never holds credentials.

    `code` is SQS's error code when SQS answered (e.g. "ReceiptHandleIsInvalid"), None
    for transport failures (refused, timed out) and local ones; `status` its HTTP status.

    `outage` says which kind of failure it is:
    - True, a failure of the whole request, whatever it carried: the connection refused,
      reset or timed out, DNS, TLS, a 5xx or throttling from the endpoint, credentials
      refused, the queue missing or not resolved because SQS was unreachable at start.
      Sending the same message later, once SQS is back, may well succeed: a relay should
      not count such a failure against the message.
    - False, SQS refused what the request carried: a 4xx naming the message or the call
      (too large, invalid contents, an invalid receipt handle). Sending the same again
      fails the same way.
    (A failed entry of a batch that SQS answered is not a QueueError: see
    `BatchResult.sender_fault`.)
    """

    def __init__(
        self,
        message: str,
        code: str | None = None,
        *,
        outage: bool = True,
        status: int | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.outage = outage
        self.status = status


class SqsFault(Exception):
    """SQS answered with an error (either plane). `code` is the query-protocol code when SQS
    sent one (the `x-amzn-query-error` header, as botocore reports it), else the JSON type,
    else "HTTP <status>"."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status

    @property
    def outage(self) -> bool:
        """Refused whatever the request carried (see QueueError.outage)."""
        if self.code in THROTTLING_CODES or self.code in _UNREACHABLE_CODES:
            return True
        return not 400 <= self.status < 500 or self.status in _UNREACHABLE_STATUSES


def _fault_of(exc: BaseException) -> SqsFault | None:
    """An answer from SQS, whichever plane got it; None for a failure to get one."""
    if isinstance(exc, SqsFault):
        return exc
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        return SqsFault(
            str(error.get("Code") or "Unknown"),
            str(error.get("Message") or ""),
            int(status) if status is not None else 400,
        )
    return None


def _tls_failure(exc: BaseException) -> bool:
    # A certificate SQS's endpoint is not verified against will not verify on a retry.
    return isinstance(exc, (ssl.SSLError, aiohttp.ClientSSLError, BotoSSLError))


def is_transient(exc: BaseException) -> bool:
    """Worth another attempt, as botocore's standard mode reads it: a transport failure
    (connection refused or reset, a timeout), a 5xx or a throttling answer. Not a refusal,
    a missing credential or region, nor a TLS certificate that does not verify."""
    fault = _fault_of(exc)
    if fault is not None:
        return fault.status in RETRY_STATUSES or fault.code in THROTTLING_CODES
    if _tls_failure(exc):
        return False
    return isinstance(
        exc,
        (
            BotoConnectionError,
            HTTPClientError,
            aiohttp.ClientConnectionError,
            aiohttp.ClientPayloadError,
            TimeoutError,
            OSError,
        ),
    )


def short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= _ERROR_TEXT_MAX else text[: _ERROR_TEXT_MAX - 1] + "…"


def queue_error(operation: str, exc: BaseException) -> QueueError:
    """The one translation of whatever an SQS call raised into a QueueError."""
    if isinstance(exc, QueueError):
        return exc
    fault = _fault_of(exc)
    if fault is not None:
        return QueueError(
            short(f"SQS {operation} failed: {fault.code}: {fault.message}"),
            fault.code,
            outage=fault.outage,
            status=fault.status,
        )
    # botocore's and aiohttp's transport messages name the endpoint URL, never keys or
    # signatures. A local failure (no credentials, no region) is an outage too: no
    # request of any content can go out.
    detail = str(exc) or type(exc).__name__
    return QueueError(short(f"SQS {operation} failed: {type(exc).__name__}: {detail}"))


# Exactly what a call to SQS can raise besides a QueueError of our own (which passes
# through untouched: it is never transient). asyncio.CancelledError is deliberately
# absent: a shutdown cancelling a long poll must stay a cancellation.
SQS_FAILURES = (
    SqsFault,
    BotoCoreError,
    ClientError,
    aiohttp.ClientError,
    TimeoutError,
    OSError,
)


def jittered_backoff_s(attempt: int) -> float:
    """Before the retry after failed attempt n (1-based): rand x 2^(n-1) s, at most 20 s
    (botocore's standard mode: rand x 1 s, then rand x 2 s)."""
    return random.random() * min(20.0, 2.0 ** (attempt - 1))


@dataclass(frozen=True)
class RetryPolicy:
    """Up to `attempts` tries of one call, a jittered backoff between them, transient
    failures only; then the failure as a QueueError.

    Attempts stay few because the relay and the consumer already retry with their own,
    longer backoff: this only smooths over a blip, such as a pooled keep-alive connection
    the server closed. So a dead endpoint costs at most ~3 s of backoff plus the
    connect timeouts.
    """

    attempts: int = 3
    backoff_s: Callable[[int], float] = field(default=jittered_backoff_s, compare=False)

    async def run(self, operation: str, call: Callable[[], Awaitable[_T]]) -> _T:
        attempt = 1
        while True:
            try:
                return await call()
            except SQS_FAILURES as exc:
                if not is_transient(exc) or attempt >= self.attempts:
                    raise queue_error(operation, exc) from exc
            await asyncio.sleep(self.backoff_s(attempt))
            attempt += 1


# Sends, deletes, visibility changes, attributes, queue bootstrap.
REQUEST_RETRY = RetryPolicy(attempts=3)
# A failed receive is simply polled again by the consumer's loop; one retry suffices.
POLL_RETRY = RetryPolicy(attempts=2)
