"""Kill -9 at each named crash point of a portal job's path, restart, lose nothing.

For each point the daemon is started armed (`OUTBOXD_CRASH_AT`), a job is submitted,
the process SIGKILLs itself at the point, and an unarmed daemon is started on the same
database and queues. A client that got no answer retries with the same
Idempotency-Key, as a real one would (one that got its 202 may retry too: harmless).
Then: the job ends SUCCEEDED, its record fetched once and stored once, one job row for
the key, its outbox row SENT, the queue and the DLQ empty; and its timeline agrees with it:
the last event's status is the job's, and every event stands for a change that committed
(one `accepted`, one `dispatched` per SENT mark, one `started` per attempt, one end).
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
from testkit.daemon import DaemonProcess
from testkit.fakes.portal import SAMPLE_SNO

from tests.acceptance.conftest import (
    CONNECTION_ERRORS,
    PortalThread,
    Response,
    db_rows,
    http_request,
)
from tests.acceptance.jobs import get_job, outbox_rows_of, post_job, queue_depth, wait_terminal
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow

# point -> the job's attempts once it succeeded (an attempt is counted when a run starts)
POINTS = {
    # The job and its outbox row are committed; the request's own publish never happens.
    "after_commit_before_publish": 1,
    # The message is on SQS, the row is not marked SENT: the relay publishes it again once
    # its lease runs out, and the consumer drops the copy of a finished job.
    "after_publish_before_sent": 1,
    # A run started (attempt 1) and died before calling the portal: redelivered, rerun.
    "during_handler": 2,
    # The portal answered, nothing is committed yet: redelivered once the lease runs out and
    # run again (the record is fetched twice, stored once).
    "after_handler_before_commit": 2,
    # SUCCEEDED is committed, the message not deleted: redelivered and deleted unrun.
    "after_handler_before_delete": 1,
    # The delete is queued with others (queue/deletes.py), its batch not sent: the same.
    "before_delete_batch": 1,
}
# point -> portal logins once it succeeded, where not 1
LOGINS = {"after_handler_before_commit": 2}


@pytest.mark.parametrize("point", list(POINTS))
def test_a_crash_loses_nothing_and_runs_nothing_twice(
    point: str, pipeline_daemon: DaemonProcess, portal_thread: PortalThread, db_url: str
) -> None:
    daemon = pipeline_daemon
    base = daemon.start(extra_env={"OUTBOXD_CRASH_AT": point})
    key = f"crash-{point}"

    first: Response | None
    try:
        first = post_job(base, key)
    except CONNECTION_ERRORS:
        first = None  # the process died while answering
    assert daemon.wait_exit(timeout_s=30) == -signal.SIGKILL
    first_run = daemon.all_output()
    assert f"crash point {point} reached" in first_run
    # With the message on SQS before the crash point, the dying daemon's own consumer
    # may already have received it and started the job (attempt 1, in a run that then
    # died): it is redelivered and run again, as after a crash during the handler.
    started_before_crash = point == "after_publish_before_sent" and "job_started" in first_run
    if point == "after_commit_before_publish":
        assert first is None, "the crash point is inside the request"

    # Whatever the client saw, the job was committed before any of the crash points.
    rows = db_rows(db_url, "SELECT id FROM jobs WHERE idempotency_key = ?", key)
    assert len(rows) == 1
    job_id = rows[0]["id"]
    if first is not None:
        assert first.status == 202 and first.json()["jobId"] == job_id

    base = daemon.start()  # unarmed, same database and queues
    retry = post_job(base, key)
    assert retry.status == 202, retry.text
    assert retry.json()["jobId"] == job_id
    assert retry.headers.get("Idempotent-Replayed") == "true"

    job = wait_terminal(base, job_id, timeout_s=30)
    assert job["status"] == "SUCCEEDED", job
    assert job["attempts"] == (2 if started_before_crash else POINTS[point])
    assert job["error"] is None
    assert job["result"]["student"]["studentNumber"] == SAMPLE_SNO

    def settled() -> dict[str, Any] | None:
        outbox = outbox_rows_of(base, job_id)
        depth = queue_depth(base)
        ok = [r["status"] for r in outbox] == ["SENT"] and depth == {
            "visible": 0,
            "inFlight": 0,
            "dlq": 0,
        }
        return {"outbox": outbox, "depth": depth} if ok else None

    # The relay's lease on a row published but not marked SENT must run out in a few
    # seconds (relay.publish_timeout_s = 1), not in half a minute.
    eventually_sync(settled, 20, what="the outbox row SENT and the queue drained")

    # Stored once: nothing ran again while the copies were drained.
    assert get_job(base, job_id) == job
    logins = portal_thread.login_attempts(SAMPLE_SNO)
    # A run killed mid-way may or may not have logged in before it died.
    assert logins in ((1, 2) if started_before_crash else (LOGINS.get(point, 1),)), logins
    assert db_rows(db_url, "SELECT COUNT(*) AS n FROM jobs") == [{"n": 1}]
    assert db_rows(db_url, "SELECT COUNT(*) AS n FROM relay_outbox WHERE job_id = ?", job_id) == [
        {"n": 1}
    ]
    assert_timeline_agrees(base, job)
    assert daemon.terminate() == 0


def assert_timeline_agrees(base: str, job: dict[str, Any]) -> None:
    """After any kill: the timeline ends in the job's status, and holds one event per change
    that committed, none for a change the kill undid."""
    resp = http_request("GET", f"{base}/v1/jobs/{job['jobId']}/events")
    assert resp.status == 200, resp.text
    events = resp.json()["events"]
    types = [e["type"] for e in events]
    assert (events[-1]["status"], events[-1]["attempt"]) == (job["status"], job["attempts"])
    assert types[0] == "accepted" and types.count("accepted") == 1, types
    assert types.count("dispatched") == 1, types  # the one outbox row, SENT once
    # (A message published twice may be marked SENT after the job ended: that `dispatched`
    # comes last, with the status the job had then.)
    assert types.count("succeeded") == 1, types
    started = [e for e in events if e["type"] == "started"]
    assert [e["attempt"] for e in started] == list(range(1, job["attempts"] + 1)), types
    assert all(e["status"] == "RUNNING" for e in started)
    assert not {"failed", "dead", "cancelled"} & set(types), types
    assert [e["seq"] for e in events] == sorted(e["seq"] for e in events)
