"""Roles and the audit log (docs/contract.md#roles-and-the-audit-log), on both backends:
every route of the route table walked with every role (a route above the caller's role is
403 C03 and changes nothing; `x-outboxd-role` names the same role); another user's result
shown to admins only; one audit row per attempted change, done or refused, in order, with
the request id; the log append-only against direct SQL, pruned only by the prune, which
records itself; the CLI's rows."""

from __future__ import annotations

import json
import re
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.http.routes import ROUTES
from outboxd.security import ROLES, generate_token, hash_token
from outboxd.services.tasks import Retention, TaskContext, _prune_audit
from outboxd.storage.audit_ports import AuditEntry
from outboxd.storage.store import SqlStore
from tests.integration.conftest import ClientFactory
from tests.support.db import raw_execute, sql
from tests.support.ops import run_cli, write_config

Client = TestClient[Any, Any]
TOKENS = {role: generate_token() for role in ROLES}
RANK = {role: n for n, role in enumerate(ROLES)}


def _auth() -> dict[str, Any]:
    return {
        "tokens": [
            {"sha256": hash_token(tok), "user": f"{role}-1", "role": role}
            for role, tok in TOKENS.items()
        ]
    }


def _h(role: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[role]}"}


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "x-" + uuid.uuid4().hex[:8], path)


async def test_every_route_with_every_role(make_api_client: ClientFactory, store: SqlStore) -> None:
    api = await make_api_client(auth=_auth())
    spec = await (await api.get("/openapi.json")).json()
    audited = 0
    for route in ROUTES:
        if route.access == "public":
            continue
        doc_op = spec["paths"][route.path][route.method.lower()]
        assert doc_op["x-outboxd-role"] == route.access, route.path
        for role in ROLES:
            kwargs: dict[str, Any] = {"headers": _h(role)}
            if route.method == "POST":
                kwargs["json"] = {}
            resp = await api.request(route.method, _concrete(route.path), **kwargs)
            allowed = route.access == "user" or RANK[role] >= RANK[route.access]
            if allowed:
                assert resp.status != 403, (route.path, role, await resp.text())
            else:
                assert resp.status == 403, (route.path, role, resp.status)
                assert (await resp.json())["code"] == "C03"
            if route.method == "POST" and route.access in ("operator", "admin"):
                audited += 1
    page = await store.list_audit(None, None, None, 500, None)
    assert len(page.items) == audited
    # Refused attempts changed nothing: no dependency paused, no task enqueued.
    assert all(r.pause_reason is None for r in await store.dependency_rows())


async def test_five_attempts_leave_five_rows_in_order(
    make_api_client: ClientFactory, store: SqlStore
) -> None:
    api = await make_api_client(auth=_auth())
    sent: list[tuple[str, str, dict[str, Any] | None, int]] = [
        ("operator", "/v1/admin/dependencies/portal/pause", {"reason": "quiet hour"}, 200),
        ("viewer", "/v1/admin/dependencies/portal/resume", None, 403),
        ("operator", "/v1/admin/dependencies/portal/pause", {"reason": ""}, 400),
        ("operator", "/v1/admin/dependencies/portal/resume", None, 200),
        ("admin", f"/v1/admin/jobs/{uuid.uuid4()}/redrive", None, 404),
    ]
    request_ids = []
    for role, path, body, status in sent:
        resp = await api.post(path, json=body, headers=_h(role))
        assert resp.status == status, (path, await resp.text())
        request_ids.append(resp.headers["X-Request-Id"])
    listed = await api.get("/v1/admin/audit", headers=_h("viewer"))
    assert listed.status == 200, await listed.text()
    items = (await listed.json())["items"]
    assert [i["outcome"] for i in items] == [404, 200, 400, 403, 200]
    assert [i["requestId"] for i in items] == request_ids[::-1]
    assert [i["actor"] for i in items] == [
        "admin-1",
        "operator-1",
        "operator-1",
        "viewer-1",
        "operator-1",
    ]
    assert items[-1]["action"] == "pauseDependency" and items[-1]["target"] == "portal"
    assert items[-1]["reason"] == "quiet hour" and items[-1]["role"] == "operator"
    by_actor = await api.get("/v1/admin/audit", params={"actor": "viewer-1"}, headers=_h("viewer"))
    assert [i["outcome"] for i in (await by_actor.json())["items"]] == [403]
    refused = await api.get("/v1/admin/audit", headers=_h("user"))
    assert refused.status == 403


async def test_another_users_result_is_for_admins_only(
    make_api_client: ClientFactory, store: SqlStore
) -> None:
    api = await make_api_client(auth=_auth())
    resp = await api.post(
        "/v1/portal-link-jobs",
        json={"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD},
        headers={**_h("user"), "Idempotency-Key": uuid.uuid4().hex},
    )
    assert resp.status == 202, await resp.text()
    job_id = (await resp.json())["jobId"]
    running = await store.start_job_run(job_id, time.time(), 60)
    assert running is not None
    await store.finish_job(running, "SUCCEEDED", time.time(), result={"grades": "A+"})
    shown = {}
    for role in ROLES:
        body = await (await api.get(f"/v1/jobs/{job_id}", headers=_h(role))).json()
        shown[role] = (body["result"], body["resultHidden"])
    assert shown["user"] == ({"grades": "A+"}, False)  # the owner
    assert shown["viewer"] == (None, True) and shown["operator"] == (None, True)
    assert shown["admin"] == ({"grades": "A+"}, False)
    detail = await (await api.get(f"/v1/admin/jobs/{job_id}", headers=_h("viewer"))).json()
    assert detail["result"] is None and detail["resultHidden"] is True
    listed = await (await api.get("/v1/admin/jobs", headers=_h("operator"))).json()
    assert [(i["result"], i["resultHidden"]) for i in listed["items"]] == [(None, True)]
    listed = await (await api.get("/v1/admin/jobs", headers=_h("admin"))).json()
    assert listed["items"][0]["result"] == {"grades": "A+"}
    # Cancelling another user's job: a viewer is refused (and on the log), an operator may.
    refused = await api.post(f"/v1/jobs/{job_id}/cancel", headers=_h("viewer"))
    assert refused.status == 403
    rows = await store.list_audit(None, "cancelJob", None, 10, None)
    assert [r.outcome for r in rows.items] == [403]


@pytest.mark.parametrize(
    "statement",
    ["UPDATE audit_log SET reason = 'x'", "DELETE FROM audit_log"],
    ids=["update", "delete"],
)
async def test_the_log_is_append_only_against_direct_sql(
    store: SqlStore, db_url: str, statement: str
) -> None:
    await store.append_audit(_entry(time.time()))
    with pytest.raises(Exception, match="append-only"):
        await raw_execute(db_url, statement)
    assert (await sql(db_url, "SELECT COUNT(*) FROM audit_log"))[0][0] == 1


async def test_only_the_prune_removes_old_rows_and_records_that(
    store: SqlStore, db_url: str
) -> None:
    now = time.time()
    for age_days in (500, 450, 10):
        await store.append_audit(_entry(now - age_days * 86400))
    ctx = TaskContext(store, time.time, Retention(audit_s=400 * 86400))
    await _prune_audit(ctx, now - ctx.retention.audit_s)
    left = (await store.list_audit(None, None, None, 10, None)).items
    assert len(left) == 2
    assert left[0].action == "outbox.prune" and "2 rows" in (left[0].reason or "")
    with pytest.raises(Exception, match="append-only"):
        await raw_execute(db_url, "DELETE FROM audit_log")


async def test_the_clis_changes_are_on_the_log(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    config = write_config(tmp_path, {"storage": {"url": db_url, "auto_migrate": False}})
    assert run_cli("pause", "portal", "--reason", "drill", "--config", str(config)).returncode == 0
    bad = run_cli("resume", "portal", "--config", str(config))
    assert bad.returncode == 0
    refused = run_cli("outbox", "redrive", str(uuid.uuid4()), "--config", str(config))
    assert refused.returncode != 0
    listed = run_cli("audit", "--json", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    rows = json.loads(listed.stdout)
    assert [(r["action"], r["outcome"]) for r in rows] == [
        ("cli:outbox redrive", 409),
        ("cli:resume", 200),
        ("cli:pause", 200),
    ]
    assert all(r["actor"].startswith("cli:") for r in rows)
    assert rows[-1]["reason"] == "drill" and rows[-1]["target"] == "portal"


def _entry(at: float) -> AuditEntry:
    return AuditEntry(str(uuid.uuid4()), at, "ops", "admin", "test", None, None, 200, None, "t")
