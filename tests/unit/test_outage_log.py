"""How a loop fails (docs/contract.md#process-and-logs, "Outages"): `OutageLog` writes one
line when a dependency goes down, at most one a minute while it stays down (with a count),
and one when it is back; `LoopFailures` adds the capped backoff every loop waits, and tells
an outage from any other error. Hand clocks, no sleeps."""

from __future__ import annotations

from typing import Any

import pytest
import structlog
from structlog.testing import capture_logs

from outboxd.errors import StorageError, StorageUnavailable
from outboxd.observability import OutageLog
from outboxd.queue.failures import QueueError
from outboxd.workers.loops import LoopFailures, outage_of
from tests.support.clock import Clock


def events(logs: list[dict[str, Any]]) -> list[str]:
    return [e["event"] for e in logs]


def test_one_line_when_it_starts_one_a_minute_while_it_lasts_one_when_it_ends() -> None:
    clock, wall = Clock(1000.0), Clock(1_700_000_000.0)
    outage = OutageLog("storage", "relay", clock=clock, wall=wall)
    with capture_logs() as logs:
        # A loop retrying every half second for two and a half minutes.
        for _ in range(300):
            outage.failed(StorageUnavailable("postgres: ConnectionRefusedError: refused"))
            clock.now += 0.5
            wall.now += 0.5
        assert outage.down and outage.count == 300
        outage.recovered()
        outage.recovered()  # up already: nothing more
    assert events(logs) == [
        "storage_unavailable",
        "storage_still_unavailable",
        "storage_still_unavailable",
        "storage_recovered",
    ]
    start, first_still, second_still, end = logs
    assert start["log_level"] == "warning" and start["component"] == "relay"
    assert start["since"] == "2023-11-14T22:13:20Z"
    assert "ConnectionRefusedError" in str(start["error"])
    assert first_still["log_level"] == "warning"
    assert (first_still["count"], first_still["outage_s"]) == (121, 60.0)
    assert (second_still["count"], second_still["outage_s"]) == (241, 120.0)
    assert first_still["since"] == start["since"]
    assert end["log_level"] == "info"
    assert (end["count"], end["outage_s"]) == (300, 150.0)
    assert not outage.down and outage.count == 0


def test_a_second_outage_is_a_new_one() -> None:
    clock = Clock(0.0)
    outage = OutageLog("sqs", "consumer_jobs", clock=clock)
    with capture_logs() as logs:
        outage.failed("SQS ReceiveMessage failed: refused")
        clock.now += 5
        outage.recovered()
        clock.now += 5
        outage.failed(QueueError("SQS ReceiveMessage failed: reset"))
    assert events(logs) == ["sqs_unavailable", "sqs_recovered", "sqs_unavailable"]
    assert logs[1]["outage_s"] == 5.0 and logs[1]["count"] == 1
    assert logs[2]["component"] == "consumer_jobs"


def test_the_line_names_the_real_error_through_the_processors() -> None:
    """Rendered as the daemon renders it: `error` is the message, `error_type` the class;
    an exception without a message still says what it was."""
    import io
    import json

    from outboxd.observability import configure_logging

    stream = io.StringIO()
    configure_logging("info", "json", stream=stream, env={})
    try:
        OutageLog("storage", "scheduler").failed(TimeoutError())
    finally:
        structlog.reset_defaults()
    (line,) = [json.loads(x) for x in stream.getvalue().splitlines()]
    assert line["event"] == "storage_unavailable"
    assert (line["error"], line["error_type"]) == ("TimeoutError", "TimeoutError")


@pytest.mark.parametrize(
    ("exc", "dependency"),
    [
        (StorageUnavailable("postgres: pool is closed"), "storage"),
        (QueueError("SQS SendMessageBatch failed: refused"), "sqs"),
        (
            QueueError(
                "SQS SendMessageBatch failed: too long", "InvalidParameterValue", outage=False
            ),
            None,
        ),
        (StorageError("postgres: check constraint"), None),
        (ValueError("a bug"), None),
    ],
)
def test_what_counts_as_an_outage(exc: BaseException, dependency: str | None) -> None:
    assert outage_of(exc) == dependency


def test_loop_failures_back_off_capped_and_log_an_outage_once() -> None:
    failures = LoopFailures("claimer", "claimer_tick_failed", base_s=0.5, cap_s=5.0)
    down = StorageUnavailable("sqlite: database is locked")
    with capture_logs() as logs:
        delays = [failures.failed(down) for _ in range(8)]
        assert failures.down
        failures.ok()
        assert failures.failed(down) == 0.5  # a new outage starts over
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0, 5.0]
    assert events(logs) == ["storage_unavailable", "storage_recovered", "storage_unavailable"]
    assert all(e["component"] == "claimer" for e in logs)


def test_an_error_that_is_no_outage_is_the_loops_own_line_each_time() -> None:
    failures = LoopFailures("scheduler", "scheduler_enqueue_failed", level="error")
    with capture_logs() as logs:
        for _ in range(3):
            failures.failed(StorageError("postgres: check constraint"), schedule="s")
        failures.ok()  # no outage was open: no recovered line
    assert events(logs) == ["scheduler_enqueue_failed"] * 3
    assert all(e["log_level"] == "error" and e["schedule"] == "s" for e in logs)


def test_ten_seconds_of_outage_at_a_loops_pace_is_one_line_and_few_tries() -> None:
    """What the reliability test measures on the real daemon, on a hand clock: a loop that
    waits what `failed` says tries a handful of times in 10 s and logs once."""
    clock = Clock(0.0)
    failures = LoopFailures("relay", "relay_iteration_failed", clock=clock)
    tries = 0
    with capture_logs() as logs:
        while clock.now < 10.0:
            tries += 1
            clock.now += failures.failed(StorageUnavailable("postgres: refused"))
    assert tries <= 6, tries
    assert events(logs) == ["storage_unavailable"]
