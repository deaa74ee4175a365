"""A job's password appears nowhere but in the request that carried it
(docs/contract.md#portal-link-jobs, #process-and-logs).

The daemon runs at `debug` level with three jobs whose passwords are unique
(`pw-<uuid>`): one SUCCEEDED, one FAILED (wrong password), one DEAD (a record the
portal always serves malformed). Requests that fail validation or conflict carry the
passwords too. Afterwards no password is in the daemon's stdout or stderr, any SQS
message (main queue and DLQ), any error body or job body, or the database (SQLite file
with its -wal and -shm; every Postgres row).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from testkit.fakes.portal import SAMPLE_SNO, Course, Semester, Student
from testkit.moto import MotoServer

from tests.acceptance.conftest import (
    ConfigFactory,
    DaemonFactory,
    PortalThread,
    db_bytes,
    http_request,
)
from tests.acceptance.jobs import get_job, wait_terminal
from tests.support.sqs import queues_named, read_all
from tests.support.students import it_student

pytestmark = pytest.mark.slow


def student(sno: str, password: str, broken: bool = False) -> Student:
    """A student of the fake portal; `broken`: an unknown semester code in the record,
    so every attempt fails with PORTAL_BAD_RESPONSE (retryable) until the job is DEAD."""
    return it_student(
        sno,
        password,
        "정비밀",
        2,
        semesters=[
            Semester(
                year=2021,
                code="99" if broken else "10",
                credits_attempted=3,
                credits_earned=3,
                gpa=4.5,
                percentile=99,
                rank="1/40",
                courses=[Course("CS1", "프로그래밍", 3, "A+", 4.5, "전공필수", "컴퓨터학부")],
            )
        ],
    )


async def queue_bodies(endpoint_url: str, queue_names: dict[str, str]) -> dict[str, list[str]]:
    async with queues_named(endpoint_url, queue_names) as queues:
        return {
            "jobs": await read_all(queues, "jobs"),
            "jobs-dlq": await read_all(queues, "jobs", dlq=True),
        }


def test_no_password_in_logs_messages_errors_or_the_database(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    portal_thread: PortalThread,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    db_url: str,
) -> None:
    ok_pw, wrong_pw, dead_pw, other_pw = (f"pw-{uuid.uuid4()}" for _ in range(4))
    secrets = [ok_pw, wrong_pw, dead_pw, other_pw]
    portal_thread.add_student(student("20215555", ok_pw))
    portal_thread.add_student(student("20216666", dead_pw, broken=True))
    daemon = spawn_daemon(pipeline_config(sqs={"max_receive_count": 2}, logging={"level": "debug"}))
    base = daemon.start()
    url = f"{base}/v1/portal-link-jobs"

    def submit(key: str, username: str, password: str) -> str:
        resp = http_request(
            "POST",
            url,
            {"portal": "suwon", "username": username, "password": password},
            headers={"Idempotency-Key": key},
        )
        assert resp.status == 202, resp.text
        job_id: str = resp.json()["jobId"]
        return job_id

    jobs = {
        "SUCCEEDED": submit("s-ok", "20215555", ok_pw),
        "FAILED": submit("s-wrong", SAMPLE_SNO, wrong_pw),
        "DEAD": submit("s-dead", "20216666", dead_pw),
    }

    # Requests that are refused, each carrying a password.
    refused: list[tuple[int, Any]] = []
    good = {"portal": "suwon", "username": "20215555"}
    for status, body, headers, raw in [
        # the same key with another password: 409 C07
        (409, {**good, "password": other_pw}, {"Idempotency-Key": "s-ok"}, None),
        # an unknown field
        (400, {**good, "password": ok_pw, "note": ok_pw}, {"Idempotency-Key": "s-x1"}, None),
        # a password over the length limit
        (400, {**good, "password": other_pw * 10}, {"Idempotency-Key": "s-x2"}, None),
        # a password of the wrong type
        (400, {**good, "password": [other_pw]}, {"Idempotency-Key": "s-x3"}, None),
        # an unknown portal
        (400, {**good, "portal": "nope", "password": other_pw}, {"Idempotency-Key": "s-x4"}, None),
        # no Idempotency-Key
        (400, {**good, "password": other_pw}, {}, None),
        # not JSON at all
        (400, None, {"Idempotency-Key": "s-x5"}, f'{{"password": "{other_pw}"'.encode()),
        # not JSON by content type
        (
            415,
            None,
            {"Idempotency-Key": "s-x6", "Content-Type": "text/plain"},
            f"password={other_pw}".encode(),
        ),
    ]:
        resp = http_request("POST", url, body, headers=headers, raw=raw)
        refused.append((resp.status, resp.text))
        assert resp.status == status, resp.text
        assert resp.headers.get("Content-Type", "").startswith("application/problem+json")
    for _, text in refused:
        for s in secrets:
            assert s not in text

    finished = {status: wait_terminal(base, job_id) for status, job_id in jobs.items()}
    assert {k: v["status"] for k, v in finished.items()} == {k: k for k in jobs}
    assert finished["FAILED"]["error"]["code"] == "PORTAL_AUTH_FAILED"
    assert finished["DEAD"]["error"]["code"] == "RETRIES_EXHAUSTED"
    bodies_of_jobs = [repr(get_job(base, j)) for j in jobs.values()]
    outbox = http_request("GET", f"{base}/v1/admin/outbox?limit=100").text
    # Each job's timeline (progress, errors, retries, its end) and a refused cancel.
    timelines = [http_request("GET", f"{base}/v1/jobs/{j}/events").text for j in jobs.values()]
    assert all('"type":"accepted"' in t.replace(" ", "") for t in timelines), timelines
    refused_cancel = http_request("POST", f"{base}/v1/jobs/{jobs['SUCCEEDED']}/cancel")
    assert refused_cancel.status == 409

    messages = asyncio.run(queue_bodies(moto_server.endpoint_url, queue_names))
    assert messages["jobs"] == []
    assert len(messages["jobs-dlq"]) == 1  # the DEAD job's message, ids only
    database_live = db_bytes(db_url)  # with the SQLite WAL as it is now
    assert daemon.terminate() == 0
    database = db_bytes(db_url)
    output = daemon.all_output()
    assert "job_succeeded" in output and "portal_request" in output  # debug logs were on
    # Positive controls: these are the right files, queues and rows.
    assert all(j.encode() in database and j in output for j in jobs.values())
    assert jobs["DEAD"] in messages["jobs-dlq"][0]

    for s in secrets:
        assert s not in output, "a password reached the logs"
        for body in messages["jobs"] + messages["jobs-dlq"]:
            assert s not in body, "a password reached SQS"
        for text in [*bodies_of_jobs, outbox, *timelines, refused_cancel.text]:
            assert s not in text, "a password reached an API body"
        assert s.encode() not in database_live, "a password reached the database"
        assert s.encode() not in database, "a password reached the database"
