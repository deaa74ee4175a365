"""Schemathesis against a live daemon (SQLite, moto SQS, an admin token): every operation
of /openapi.json with every built-in check, positive_data_acceptance (ST202) included:
no 5xx, every response true to the document (status codes, content types, headers,
bodies), every schema-valid request accepted and every schema-invalid one refused.

Bounded: 15 positive and 15 negative examples per operation, no example database.
The module prints its totals (cases, checks, failures) at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, assume, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from outboxd.http.openapi import openapi_document
from outboxd.security import generate_token, hash_token
from tests.acceptance.conftest import offline_config

ADMIN_TOKEN = generate_token()
HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
EXAMPLES = int(os.environ.get("OUTBOXD_TEST_FUZZ_EXAMPLES", "15"))
load_all_checks()
# Every built-in check (max_response_time needs a configured limit, so it is not one).
ALL_CHECKS = list(CHECKS.get_all())
TOTALS = {"cases": 0, "checks": 0, "failures": 0}


@pytest.fixture(scope="module", autouse=True)
def report_totals() -> Iterator[None]:
    yield
    print(
        f"\nschemathesis: {TOTALS['cases']} cases, {TOTALS['checks']} checks "
        f"({len(ALL_CHECKS)} kinds), {TOTALS['failures']} failures"
    )


def _validate(case: Any, **kw: Any) -> Any:
    TOTALS["cases"] += 1
    TOTALS["checks"] += len(ALL_CHECKS)
    try:
        return case.call_and_validate(headers=HEADERS, timeout=10, checks=ALL_CHECKS, **kw)
    except BaseException:
        TOTALS["failures"] += 1
        raise


@pytest.fixture(scope="module")
def live_daemon(
    moto_server: MotoServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DaemonProcess]:
    workdir = tmp_path_factory.mktemp("schemathesis")
    config = offline_config(
        moto_server,
        "var/outboxd.db",
        # No consumer: jobs stay RUNNING on the queue, nothing leaves loopback.
        daemon={"roles": ["api", "relay", "claimer"]},
        auth={"tokens": [{"sha256": hash_token(ADMIN_TOKEN), "user": "fuzz", "role": "admin"}]},
        logging={"level": "warning"},
        # A generated `Prefer: wait=N` holds a request at most this long.
        api={"max_wait_s": 1},
    )
    daemon = DaemonProcess(workdir, config)
    (workdir / "var").mkdir()
    daemon.start()
    yield daemon
    code = daemon.terminate()
    out = daemon.all_output()
    assert code == 0, out[-3000:]
    assert "unhandled_error" not in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]


@pytest.fixture(scope="module")
def api_schema(live_daemon: DaemonProcess) -> Any:
    """The document as the live daemon serves it (not the in-process copy)."""
    return schemathesis.openapi.from_url(f"{live_daemon.base_url}/openapi.json")


# Operations that create rows go first, so the listings and lookups after them see data.
_FIRST = ("/v1/portal-link-jobs", "/v1/websites", "/v1/admin/tasks")


def _operations() -> list[Any]:
    """(method, path, mode) for every operation; negative data where there is input to negate.

    X-Request-Id is a free-form header (never rejected), so an operation with nothing else
    has no negative data.
    """
    doc = openapi_document()
    out = []
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in {"get", "post", "put", "patch", "delete"}:
                continue
            params = [
                p
                for p in list(item.get("parameters", [])) + list(op.get("parameters", []))
                if not p.get("$ref", "").endswith("/X-Request-Id")
            ]
            rank = (_FIRST.index(path) if path in _FIRST and method == "post" else 9, path)
            out.append((rank, method.upper(), path, GenerationMode.POSITIVE))
            if params or "requestBody" in op:
                out.append((rank, method.upper(), path, GenerationMode.NEGATIVE))
    return [pytest.param(m, p, mode) for _rank, m, p, mode in sorted(out, key=lambda t: t[0])]


# schemathesis.pytest.from_fixture does not run on pytest 9 (it reads the removed
# Function._nodeid), so the operations are parametrized here and driven through
# schemathesis' Hypothesis strategies.
@pytest.mark.parametrize(("method", "path", "mode"), _operations())
def test_every_operation_conforms(
    api_schema: Any, method: str, path: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    def check(case: Any) -> None:
        # A query parameter whose generated value is None or an empty list or object is
        # not sent at all (and one named "" does not survive URL parsing), so a case made
        # "invalid" only by such a parameter reaches the server as a valid request, which
        # schemathesis would still expect refused.
        query = case.query or {}
        assume(all(k != "" and v not in (None, [], {}) for k, v in query.items()))
        _validate(case)

    check()


def test_hand_made_flow_conforms(api_schema: Any) -> None:
    """A job's whole admin life, each response checked by schemathesis' validators.

    Covers answers random data rarely reaches: replays, 409s, pages with a next cursor.
    """

    def call(method: str, path: str, **kw: Any) -> Any:
        return _validate(api_schema[path][method].Case(**kw))

    body = {"portal": "suwon", "username": "20201234", "password": "pw"}
    key = {"Idempotency-Key": uuid.uuid4().hex}
    first = call("POST", "/v1/portal-link-jobs", body=body, headers=key)
    assert first.status_code == 202
    job_id = first.json()["jobId"]
    replay = call("POST", "/v1/portal-link-jobs", body=body, headers=key)
    assert replay.status_code == 202 and replay.headers["idempotent-replayed"] == ["true"]
    conflict = call("POST", "/v1/portal-link-jobs", body={**body, "password": "x"}, headers=key)
    assert conflict.status_code == 409
    got = call("GET", "/v1/jobs/{job_id}", path_parameters={"job_id": job_id})
    assert got.status_code == 200
    # Conditional and held reads, the timeline, a cancel (and its repeat).
    etag = got.headers["etag"][0]
    same = call(
        "GET",
        "/v1/jobs/{job_id}",
        path_parameters={"job_id": job_id},
        headers={"If-None-Match": etag, "Prefer": "wait=1"},
    )
    assert same.status_code == 304 and same.headers["preference-applied"] == ["wait=1"]
    events = call("GET", "/v1/jobs/{job_id}/events", path_parameters={"job_id": job_id})
    assert events.status_code == 200 and events.json()["events"][0]["type"] == "accepted"
    for _ in range(2):
        cancelled = call("POST", "/v1/jobs/{job_id}/cancel", path_parameters={"job_id": job_id})
        assert cancelled.status_code == 202 and cancelled.json()["status"] == "CANCELLED"
    not_dead = call("POST", "/v1/admin/jobs/{job_id}/redrive", path_parameters={"job_id": job_id})
    assert not_dead.status_code == 409
    listed = call(
        "GET",
        "/v1/admin/jobs",
        query={"user": "fuzz", "status": "CANCELLED", "from": "2020-01-01T00:00:00Z", "limit": 1},
    )
    assert listed.status_code == 200 and listed.json()["items"][0]["jobId"] == job_id
    bulk = call("POST", "/v1/admin/jobs/redrive", body={"status": "DEAD", "jobIds": [job_id]})
    assert bulk.status_code == 200 and bulk.json()["refused"][0]["jobId"] == job_id
    assert call("POST", "/v1/admin/jobs/redrive", body={"status": "DEAD"}).status_code == 200

    created = call("POST", "/v1/websites", body={"domain": "Example.ORG.", "faviconUrl": None})
    assert created.status_code in (200, 201)
    got = call("GET", "/v1/websites/{domain}", path_parameters={"domain": "example.org"})
    assert got.status_code == 200

    # Two tasks, so that the task listing has a second page whatever ran before this test
    # on its worker (the outbox listing has the job's row and the tasks').
    for _ in range(2):
        task = call(
            "POST", "/v1/admin/tasks", body={"type": "noop", "payload": {}, "dedupId": None}
        )
        assert task.status_code == 202
    for path in ("/v1/admin/outbox", "/v1/admin/tasks"):
        page = call("GET", path, query={"limit": 1})
        assert page.status_code == 200 and page.json()["nextCursor"] is not None
        nxt = call("GET", path, query={"limit": 1, "cursor": page.json()["nextCursor"]})
        assert nxt.status_code == 200
    outbox_id = call("GET", "/v1/admin/outbox", query={"limit": 1}).json()["items"][0]["id"]
    refused = call(
        "POST", "/v1/admin/outbox/{outbox_id}/redrive", path_parameters={"outbox_id": outbox_id}
    )
    assert refused.status_code == 409
    assert call("GET", "/v1/admin/stats").json()["queues"]["jobs"]["dlq"] == 0
    # The console's admin reads and its job page.
    detail = call("GET", "/v1/admin/jobs/{job_id}", path_parameters={"job_id": job_id})
    assert detail.status_code == 200 and detail.json()["outbox"][0]["jobId"] == job_id
    assert call("GET", "/v1/admin/jobs", query={"limit": 1}).status_code == 200
    assert call("GET", "/v1/admin/websites", query={"limit": 1}).status_code == 200
    not_failed = call(
        "POST", "/v1/admin/websites/{domain}/retry", path_parameters={"domain": "example.org"}
    )
    assert not_failed.status_code == 409
    assert call("GET", "/v1/admin/runtime").json()["claimer"] is not None
    assert call("GET", "/ui/jobs/{job_id}", path_parameters={"job_id": job_id}).status_code == 200
    assert call("GET", "/readyz").status_code == 200
    assert call("GET", "/metrics").status_code == 200
