"""One mapping and one retry policy for both SQS planes (queue/failures.py): whatever
botocore or the JSON client raised becomes a QueueError that says whether the whole
request failed (an outage) or SQS refused what it carried."""

from __future__ import annotations

import asyncio
import socket
import ssl

import aiohttp
import pytest
from botocore.exceptions import (
    ClientError,
    EndpointConnectionError,
    NoCredentialsError,
    ReadTimeoutError,
    SSLError,
)

from outboxd.queue.failures import QueueError, RetryPolicy, SqsFault, is_transient, queue_error

URL = "http://127.0.0.1:9/"


def answered(code: str, status: int, message: str = "said SQS") -> ClientError:
    """What botocore raises when SQS answered with an error."""
    return ClientError(
        {
            "Error": {"Code": code, "Message": message},
            "ResponseMetadata": {"HTTPStatusCode": status},
        },
        "SendMessageBatch",
    )


# (the failure, outage, worth another attempt)
CASES: list[tuple[str, BaseException, bool, bool]] = [
    # The endpoint could not be reached, or not in time: outages, tried again.
    ("botocore-refused", EndpointConnectionError(endpoint_url=URL), True, True),
    ("botocore-read-timeout", ReadTimeoutError(endpoint_url=URL), True, True),
    ("aiohttp-disconnected", aiohttp.ServerDisconnectedError(), True, True),
    ("reset", ConnectionResetError(104, "Connection reset by peer"), True, True),
    ("dns", socket.gaierror(-2, "Name or service not known"), True, True),
    ("timeout", TimeoutError(), True, True),
    # A certificate does not verify, credentials are missing: outages, final at once.
    ("botocore-tls", SSLError(endpoint_url=URL, error="CERTIFICATE_VERIFY_FAILED"), True, False),
    ("aiohttp-tls", ssl.SSLCertVerificationError("certificate verify failed"), True, False),
    ("no-credentials", NoCredentialsError(), True, False),
    # SQS answered: 5xx and throttling are outages and tried again ...
    ("botocore-500", answered("InternalError", 500), True, True),
    ("json-503", SqsFault("ServiceUnavailable", "busy", 503), True, True),
    ("throttled", answered("RequestThrottled", 400), True, True),
    # ... access, a missing queue, a 403 refuse any request: outages, final ...
    ("denied", answered("AccessDenied", 403), True, False),
    ("bad-key", SqsFault("InvalidClientTokenId", "no such key", 403), True, False),
    ("missing", answered("AWS.SimpleQueueService.NonExistentQueue", 400), True, False),
    ("json-missing", SqsFault("QueueDoesNotExist", "gone", 400), True, False),
    ("not-json", SqsFault("InvalidResponse", "the answer is not JSON", 200), True, False),
    # ... and a 4xx naming what the request carried is a refusal of it.
    ("too-long", answered("BatchRequestTooLong", 400), False, False),
    ("invalid", SqsFault("InvalidParameterValue", "bad body", 400), False, False),
    ("receipt", answered("ReceiptHandleIsInvalid", 400), False, False),
]


@pytest.mark.parametrize(
    ("failure", "outage", "transient"),
    [c[1:] for c in CASES],
    ids=[c[0] for c in CASES],
)
def test_each_failure_is_classified_once_for_both_planes(
    failure: BaseException, outage: bool, transient: bool
) -> None:
    error = queue_error("SendMessageBatch", failure)
    assert (error.outage, is_transient(failure)) == (outage, transient)
    assert str(error).startswith("SQS SendMessageBatch failed: ")
    assert len(str(error)) <= 300


def test_an_answer_keeps_its_code_and_status_and_a_transport_failure_has_none() -> None:
    error = queue_error("DeleteMessage q", answered("ReceiptHandleIsInvalid", 400, "bad handle"))
    assert str(error) == "SQS DeleteMessage q failed: ReceiptHandleIsInvalid: bad handle"
    assert (error.code, error.status) == ("ReceiptHandleIsInvalid", 400)
    # botocore (ClientError) and the JSON client (SqsFault) read the same answer alike.
    same = queue_error("DeleteMessage q", SqsFault("ReceiptHandleIsInvalid", "bad handle", 400))
    assert (str(same), same.code, same.status, same.outage) == (
        str(error),
        error.code,
        error.status,
        error.outage,
    )
    refused = queue_error("GetQueueUrl q", EndpointConnectionError(endpoint_url=URL))
    assert (refused.code, refused.status) == (None, None)
    assert URL in str(refused)
    long = queue_error("SendMessageBatch", answered("InternalError", 500, "x" * 1000))
    assert len(str(long)) == 300 and str(long).endswith("…")


class Flaky:
    """Raises each of `failures` in turn, then answers."""

    def __init__(self, *failures: BaseException) -> None:
        self.failures = list(failures)
        self.calls = 0

    async def __call__(self) -> str:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return "answered"


POLICY = RetryPolicy(attempts=3, backoff_s=lambda attempt: 0.0)


async def test_transient_failures_are_retried_until_the_attempts_run_out() -> None:
    flaky = Flaky(EndpointConnectionError(endpoint_url=URL), answered("InternalError", 500))
    assert await POLICY.run("SendMessageBatch", flaky) == "answered"
    assert flaky.calls == 3

    down = Flaky(*(EndpointConnectionError(endpoint_url=URL) for _ in range(5)))
    with pytest.raises(QueueError) as info:
        await POLICY.run("SendMessageBatch", down)
    assert down.calls == 3 and info.value.outage
    assert isinstance(info.value.__cause__, EndpointConnectionError)


async def test_a_refusal_or_our_own_error_is_final_at_once() -> None:
    refused = Flaky(answered("InvalidParameterValue", 400))
    with pytest.raises(QueueError) as info:
        await POLICY.run("SendMessageBatch", refused)
    assert refused.calls == 1 and not info.value.outage

    ours = QueueError("no AWS credentials found (environment, files or role)")
    local = Flaky(ours)
    with pytest.raises(QueueError) as passed:
        await POLICY.run("SendMessageBatch", local)
    assert local.calls == 1 and passed.value is ours


async def test_the_backoff_is_the_policys_between_attempts() -> None:
    waits: list[int] = []

    def backoff(attempt: int) -> float:
        waits.append(attempt)
        return 0.0

    flaky = Flaky(TimeoutError(), TimeoutError())
    assert await RetryPolicy(attempts=3, backoff_s=backoff).run("ReceiveMessage", flaky)
    assert waits == [1, 2]


async def test_a_cancellation_stays_a_cancellation() -> None:
    cancelled = Flaky(asyncio.CancelledError())
    with pytest.raises(asyncio.CancelledError):
        await POLICY.run("ReceiveMessage", cancelled)
    assert cancelled.calls == 1
