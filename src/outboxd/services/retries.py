"""When work gives up: the domain rules the workers apply to a failure.

The workers carry out what these decide (a relay row backed off or DEAD, a job retried,
FAILED or DEAD, a classification retried or FAILED); the rules themselves live here, once.
"""

from __future__ import annotations

from typing import Literal

from outboxd.storage.ports import RelayFailure, RelayRow

JobVerdict = Literal["failed", "retry", "dead"]


def publish_gives_up(attempts: int, max_attempts: int) -> bool:
    """A relay row whose publish failed `attempts` times: DEAD once it reached the maximum."""
    return attempts >= max_attempts


def publish_failure(row: RelayRow, error: str, next_attempt_at: float, dead: bool) -> RelayFailure:
    """The failure to record for one row; a dead job row's job ends RETRIES_EXHAUSTED."""
    job_error = None
    if dead and row.job_id is not None:
        job_error = (
            "RETRIES_EXHAUSTED",
            f"publishing failed {row.attempt_count} times: {error[:300]}",
        )
    return RelayFailure(row, error, next_attempt_at, dead, job_error)


def publish_outage(row: RelayRow, error: str, next_attempt_at: float) -> RelayFailure:
    """A publish that failed because SQS could not be reached at all (connection refused or
    reset, a timeout, a 5xx, throttling): the row backs off with its attempt given back,
    so no outage, however long, makes it DEAD. Only SQS refusing the message counts."""
    return RelayFailure(row, error, next_attempt_at, dead=False, counted=False)


def job_verdict(retryable: bool, receive_count: int, max_receive_count: int) -> JobVerdict:
    """A failed job run: FAILED when the error is not retryable; DEAD at the last receive
    SQS allows (the next receive would move the message to the DLQ); else retried."""
    if not retryable:
        return "failed"
    if receive_count >= max_receive_count:
        return "dead"
    return "retry"


def dead_job_error(code: str, message: str) -> tuple[str, str]:
    """What a DEAD job records: RETRIES_EXHAUSTED, naming the last error."""
    return ("RETRIES_EXHAUSTED", f"{code}: {message}"[:500])


def classification_gives_up(attempts: int, max_attempts: int) -> bool:
    """A website classification whose call failed `attempts` times: FAILED at the maximum."""
    return attempts >= max_attempts
