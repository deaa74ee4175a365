"""The pipeline end to end over HTTP: the daemon as a subprocess (every role), real SQS
(moto), the strict fake portal; on both backends.

- a job submitted over HTTP reaches SUCCEEDED, with its record, and can be followed
  through the logs by its id;
- SQS down during the request: `202 QUEUED`; SQS comes back (empty, on the same port),
  the daemon recreates its queues, the relay delivers and the job succeeds with no
  retry from the client.
"""

from __future__ import annotations

import pytest
from testkit.daemon import DaemonProcess
from testkit.fakes.portal import SAMPLE_SNO
from testkit.moto import MotoServer

from tests.acceptance.conftest import ConfigFactory, DaemonFactory, PortalThread, db_rows
from tests.acceptance.jobs import get_job, outbox_rows_of, post_job, wait_terminal

pytestmark = pytest.mark.slow


def test_a_job_reaches_succeeded_through_http(
    pipeline_daemon: DaemonProcess, portal_thread: PortalThread, db_url: str
) -> None:
    daemon = pipeline_daemon
    base = daemon.start()

    resp = post_job(base, "e2e-happy")

    assert resp.status == 202, resp.text
    body = resp.json()
    job_id = body["jobId"]
    assert resp.headers["Location"] == f"/v1/jobs/{job_id}"
    assert body["status"] in ("RUNNING", "SUCCEEDED")  # normally RUNNING
    assert body["dispatch"]["status"] == "SENT" and body["dispatch"]["messageId"]

    job = wait_terminal(base, job_id)
    assert job["status"] == "SUCCEEDED", job
    assert (job["kind"], job["portal"], job["attempts"], job["error"]) == (
        "portal_link",
        "suwon",
        1,
        None,
    )
    assert job["finishedAt"] is not None
    assert job["progress"] == {"step": "GRADES", "done": 3, "total": 3}
    result = job["result"]
    assert result["student"]["studentNumber"] == SAMPLE_SNO
    assert result["student"]["name"] == "김수원"
    assert [s["term"] for s in result["semesters"]] == ["1", "summer", "2"]
    assert sum(len(s["courses"]) for s in result["semesters"]) == 5
    assert result["totals"]["creditsEarned"] == 40
    assert portal_thread.login_attempts(SAMPLE_SNO) == 1

    # The same request again: the same job, nothing new.
    again = post_job(base, "e2e-happy")
    assert again.status == 202
    assert again.headers.get("Idempotent-Replayed") == "true"
    assert again.json()["jobId"] == job_id and again.json()["status"] == "SUCCEEDED"
    assert db_rows(db_url, "SELECT id FROM jobs WHERE idempotency_key = ?", "e2e-happy") == [
        {"id": job_id}
    ]
    rows = outbox_rows_of(base, job_id)
    assert [(r["status"], r["messageId"]) for r in rows] == [
        ("SENT", body["dispatch"]["messageId"])
    ]
    sealed = db_rows(db_url, "SELECT sealed, key_id FROM jobs WHERE id = ?", job_id)
    assert sealed == [{"sealed": None, "key_id": None}]

    # One job can be followed from the API to the worker by its id.
    events = {e["event"] for e in daemon.events() if e.get("job_id") == job_id}
    assert {"job_accepted", "outbox_sent", "job_started", "job_succeeded"} <= events
    assert daemon.terminate() == 0


def test_sqs_down_during_the_request_is_accepted_and_delivered_once_sqs_is_back(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    private_moto: MotoServer,
    portal_thread: PortalThread,
    db_url: str,
) -> None:
    daemon = spawn_daemon(pipeline_config(sqs={"endpoint_url": private_moto.endpoint_url}))
    base = daemon.start()

    private_moto.stop()
    resp = post_job(base, "e2e-sqs-down")

    assert resp.status == 202, resp.text
    body = resp.json()
    job_id = body["jobId"]
    assert body["status"] == "QUEUED"
    assert body["dispatch"]["status"] == "RETRYABLE_FAILED"
    assert body["dispatch"]["messageId"] is None
    assert get_job(base, job_id)["status"] == "QUEUED"

    # SQS comes back on the same address, with no queues at all (moto keeps no state).
    private_moto.restart()
    job = wait_terminal(base, job_id, timeout_s=45)

    assert job["status"] == "SUCCEEDED", job
    assert job["attempts"] == 1 and job["result"]["student"]["studentNumber"] == SAMPLE_SNO
    rows = outbox_rows_of(base, job_id)
    assert len(rows) == 1 and rows[0]["status"] == "SENT" and rows[0]["messageId"]
    # However many tries the outage took, only the publish that went out counts.
    assert rows[0]["attempts"] == 1, rows
    assert portal_thread.login_attempts(SAMPLE_SNO) == 1
    assert db_rows(db_url, "SELECT COUNT(*) AS n FROM jobs") == [{"n": 1}]
    assert "sqs_queue_missing_recreating" in {e["event"] for e in daemon.events()}
    assert daemon.terminate() == 0
