"""The administration API (docs/contract.md#administration) on both backends, in process, no queue.

DEAD rows are made through the store's real transitions (claim + mark_relay_failed with
dead=True; start_job_run + mark_job_dead), never with raw SQL.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import pytest
from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from outboxd.security import KeyRing
from outboxd.storage.store import SqlStore
from tests.support.api import assert_problem, walk
from tests.support.db import sql
from tests.support.ops import (
    db_counts,
    dead_jobs_of_every_kind,
    fail,
    jobs_in_each_status,
    kill_at_publish,
    kill_in_processing,
    kill_task_at_publish,
    submit_job,
    succeed,
)

Client = TestClient[Any, Any]


# ------------------------------------------------------------------ outbox listing


async def test_outbox_list_newest_first_with_keyset_pagination(
    api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    jobs = [await submit_job(store, keys, key=f"k{i}") for i in range(4)]
    # Seven task rows sharing one created_at: only the id tie-break keeps pages apart.
    same_moment = time.time() + 5
    for i in range(7):
        await store.enqueue_task(
            str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, f"tie-{i}", same_moment
        )
    await kill_at_publish(store, jobs[1].id)

    expected = [
        str(r[0])
        for r in await sql(db_url, "SELECT id FROM relay_outbox ORDER BY created_at DESC, id DESC")
    ]
    assert len(expected) == 11
    for limit in (1, 3, 4, 11, 50):
        pages = await walk(api, "/v1/admin/outbox", limit)
        assert all(len(p) <= limit for p in pages)
        assert all(len(p) == limit for p in pages[:-1])
        ids = [item["id"] for page in pages for item in page]
        assert ids == expected, f"limit={limit}: duplicates, gaps or wrong order"
    assert len(await walk(api, "/v1/admin/outbox", 11)) == 1, "an exact fit has no next page"

    items = [i for p in await walk(api, "/v1/admin/outbox", 50) for i in p]
    job_items = [i for i in items if i["kind"] == "job"]
    task_items = [i for i in items if i["kind"] == "task"]
    assert {i["jobId"] for i in job_items} == {j.id for j in jobs}
    assert all("taskId" not in i for i in job_items)
    assert all("jobId" not in i and i["taskId"] for i in task_items)
    for item in items:
        assert set(item) >= {
            "id",
            "kind",
            "status",
            "attempts",
            "nextAttemptAt",
            "lastError",
            "messageId",
            "createdAt",
        }
        assert "payload" not in item and "sealed" not in item

    dead_pages = await walk(api, "/v1/admin/outbox", 2, status="DEAD")
    dead = [i for p in dead_pages for i in p]
    assert [(i["jobId"], i["status"], i["lastError"]) for i in dead] == [
        (jobs[1].id, "DEAD", "sqs down")
    ]
    pending = [i for p in await walk(api, "/v1/admin/outbox", 4, status="PENDING") for i in p]
    assert len(pending) == 10 and all(i["status"] == "PENDING" for i in pending)
    assert [i for p in await walk(api, "/v1/admin/outbox", 5, status="SENT") for i in p] == []


async def test_rows_added_between_pages_do_not_shift_the_walk(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    first = [await submit_job(store, keys, key=f"a{i}") for i in range(5)]
    resp = await api.get("/v1/admin/outbox", params={"limit": "2"})
    page1 = await resp.json()
    await submit_job(store, keys, key="late")  # newer than every row already listed
    rest = await walk(api, "/v1/admin/outbox", 2, cursor=page1["nextCursor"])
    seen = [i["jobId"] for i in page1["items"]] + [i["jobId"] for p in rest for i in p]
    assert seen == [j.id for j in reversed(first)]


@pytest.mark.parametrize(
    "query",
    [
        {"cursor": "not-a-cursor!"},
        {"cursor": "eyJ4Ijox"},  # base64 of a JSON object, not a cursor
        {"limit": "0"},
        {"limit": "501"},
        {"limit": "ten"},
        {"status": "LOST"},
        {"status": ""},
        {"stauts": "DEAD"},  # a misspelt filter must not list everything
    ],
)
async def test_outbox_list_rejects_bad_parameters(api: Client, query: dict[str, str]) -> None:
    resp = await api.get("/v1/admin/outbox", params=query)
    body = await assert_problem(resp, 400, "C01")
    assert body["errors"][0]["field"] in query


# ------------------------------------------------------------------ outbox redrive


async def test_redrive_dead_outbox_row_back_to_pending_and_job_queued(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    job = await submit_job(store, keys)
    dead = await kill_at_publish(store, job.id)
    assert dead.attempt_count == 1

    resp = await api.post(f"/v1/admin/outbox/{dead.id}/redrive")
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body["id"] == dead.id and body["jobId"] == job.id
    assert body["status"] == "PENDING" and body["attempts"] == 0 and body["lastError"] is None

    row = await store.get_relay_row(dead.id)
    assert row is not None and (row.status, row.attempt_count) == ("PENDING", 0)
    fresh = await store.get_job(job.id)
    assert fresh is not None and fresh.status == "QUEUED" and fresh.error_code is None
    shown = await (await api.get(f"/v1/jobs/{job.id}")).json()
    assert shown["status"] == "QUEUED" and shown["error"] is None

    # Now PENDING: a second redrive is refused.
    await assert_problem(await api.post(f"/v1/admin/outbox/{dead.id}/redrive"), 409, "C11")


async def test_redrive_dead_task_row(api: Client, store: SqlStore) -> None:
    resp = await api.post("/v1/admin/tasks", json={"type": "noop", "payload": {}})
    task_id = (await resp.json())["taskId"]
    row = await kill_task_at_publish(store, task_id)
    task = await store.get_task(task_id)
    assert task is not None and task.status == "DEAD"
    resp = await api.post(f"/v1/admin/outbox/{row.id}/redrive")
    assert resp.status == 200, await resp.text()
    assert (await resp.json())["taskId"] == task_id
    task = await store.get_task(task_id)
    assert task is not None and task.status == "PENDING" and task.error is None


async def test_redrive_of_a_non_dead_outbox_row_is_409(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    pending = await submit_job(store, keys, key="p")
    row = await store.latest_relay_row_for_job(pending.id)
    assert row is not None
    await assert_problem(await api.post(f"/v1/admin/outbox/{row.id}/redrive"), 409, "C11")
    sent_job = await succeed(store, (await submit_job(store, keys, key="s")).id)
    sent = await store.latest_relay_row_for_job(sent_job.id)
    assert sent is not None and sent.status == "SENT"
    await assert_problem(await api.post(f"/v1/admin/outbox/{sent.id}/redrive"), 409, "C11")
    # Nothing changed.
    assert (await store.get_relay_row(row.id)) == row
    await assert_problem(await api.post(f"/v1/admin/outbox/{uuid.uuid4()}/redrive"), 404, "C04")


# ------------------------------------------------------------------ job redrive


@pytest.mark.parametrize("how", ["publish", "processing"])
async def test_job_redrive_of_a_dead_job(
    api: Client, store: SqlStore, keys: KeyRing, db_url: str, how: str
) -> None:
    job = await submit_job(store, keys)
    old = await store.latest_relay_row_for_job(job.id)
    assert old is not None
    if how == "publish":
        await kill_at_publish(store, job.id)
    else:
        await kill_in_processing(store, job.id)

    resp = await api.post(f"/v1/admin/jobs/{job.id}/redrive")
    assert resp.status == 202, await resp.text()
    assert resp.headers["Location"] == f"/v1/jobs/{job.id}"
    body = await resp.json()
    assert body["jobId"] == job.id
    assert body["status"] == "QUEUED"
    assert body["error"] is None and body["finishedAt"] is None

    latest = await store.latest_relay_row_for_job(job.id)
    assert latest is not None and latest.id != old.id
    assert (latest.status, latest.attempt_count, latest.kind) == ("PENDING", 0, "job")
    rows = await sql(
        db_url,
        "SELECT status FROM relay_outbox WHERE job_id = "
        + ("?" if db_url.startswith("sqlite") else "$1"),
        job.id,
    )
    # The old row stays as history (a DEAD one SUPERSEDED: no longer a dead letter);
    # exactly one row carries the retry.
    old_status = "SUPERSEDED" if how == "publish" else "SENT"
    assert sorted(r[0] for r in rows) == sorted(["PENDING", old_status])
    dead_rows = await (await api.get("/v1/admin/outbox", params={"status": "DEAD"})).json()
    assert dead_rows["items"] == []
    # The credentials stayed: the job can still run.
    fresh = await store.get_job(job.id)
    assert fresh is not None and fresh.sealed is not None

    # QUEUED now: redriving again is a state error.
    await assert_problem(await api.post(f"/v1/admin/jobs/{job.id}/redrive"), 409, "C11")


async def test_job_redrive_of_non_dead_jobs_is_409(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    queued = await submit_job(store, keys, key="q")
    succeeded = await succeed(store, (await submit_job(store, keys, key="s")).id)
    failed = await fail(store, (await submit_job(store, keys, key="f")).id)
    for job in (queued, succeeded, failed):
        before = await store.get_job(job.id)
        body = await assert_problem(await api.post(f"/v1/admin/jobs/{job.id}/redrive"), 409, "C11")
        assert before is not None and before.status in body["detail"]
        assert await store.get_job(job.id) == before
    await assert_problem(await api.post(f"/v1/admin/jobs/{uuid.uuid4()}/redrive"), 404, "C04")


async def test_job_redrive_after_credentials_were_erased_is_409(
    api: Client, store: SqlStore, keys: KeyRing
) -> None:
    job = await submit_job(store, keys)
    await kill_in_processing(store, job.id)
    # outbox.prune past security.dead_retention_s erases a DEAD job's ciphertext.
    counts = await store.prune(0, 0, credentials_before=time.time() + 60, batch=100)
    # Its SENT relay row went with the credentials: nothing is left to redrive it from.
    assert counts["dead_credentials"] == 1 and counts["relay_sent"] == 1
    assert await store.latest_relay_row_for_job(job.id) is None
    body = await assert_problem(await api.post(f"/v1/admin/jobs/{job.id}/redrive"), 409, "C11")
    assert "credentials" in body["detail"]
    fresh = await store.get_job(job.id)
    assert fresh is not None and fresh.status == "DEAD"
    assert await store.latest_relay_row_for_job(job.id) is None, "a new outbox row was made"


async def test_a_superseded_row_is_history_not_a_dead_letter(
    api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    """One publish failure is one dead letter: redriving the job closes its DEAD row too."""
    job = await submit_job(store, keys)
    dead_row = await kill_at_publish(store, job.id)
    before = await db_counts(db_url)
    assert before["jobs"] == {"DEAD": 1} and before["relay_outbox"] == {"DEAD": 1}

    assert (await api.post(f"/v1/admin/jobs/{job.id}/redrive")).status == 202
    after = await db_counts(db_url)
    assert after["jobs"] == {"QUEUED": 1}
    assert after["relay_outbox"] == {"SUPERSEDED": 1, "PENDING": 1}
    listed = await (await api.get("/v1/admin/outbox", params={"status": "SUPERSEDED"})).json()
    assert [i["id"] for i in listed["items"]] == [dead_row.id]
    assert listed["items"][0]["lastError"] == dead_row.last_error
    detail = await (await api.get(f"/v1/admin/jobs/{job.id}")).json()
    assert [o["status"] for o in detail["outbox"]] == ["PENDING", "SUPERSEDED"]
    stats = await (await api.get("/v1/admin/stats")).json()
    assert "DEAD" not in stats["tables"]["relay_outbox"]
    # It cannot be revived beside the fresh row (the job would be published twice).
    body = await assert_problem(
        await api.post(f"/v1/admin/outbox/{dead_row.id}/redrive"), 409, "C11"
    )
    assert "newer outbox row" in body["detail"]


# ------------------------------------------------------------------ bulk redrive


async def test_bulk_redrive_of_every_dead_job(
    api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    dead = await dead_jobs_of_every_kind(store, keys, at_publish=3)
    erased, at_publish, in_processing = dead.erased, dead.at_publish, dead.in_processing
    queued = await submit_job(store, keys, key="q")
    await kill_in_processing(store, (await submit_job(store, keys, key="late")).id)

    # limit: the newest DEAD job first, and `more` says others are left.
    resp = await api.post("/v1/admin/jobs/redrive", json={"status": "DEAD", "limit": 1})
    assert resp.status == 200, await resp.text()
    first = await resp.json()
    assert first["redriven"] == 1 and first["refused"] == [] and first["more"] is True

    with capture_logs() as logs:
        resp = await api.post("/v1/admin/jobs/redrive", json={"status": "DEAD"})
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    redriven = {j.id for j in [*at_publish, in_processing]}
    assert set(body["jobIds"]) == redriven and body["redriven"] == len(redriven)
    assert body["refused"] == [
        {"jobId": erased.id, "reason": "the job's credentials were erased; it cannot be redriven"}
    ]
    assert body["more"] is False
    counts = await db_counts(db_url)
    assert counts["jobs"] == {"QUEUED": 6, "DEAD": 1}  # redriven 5, queued 1, erased 1
    assert counts["relay_outbox"].get("DEAD", 0) == 0
    assert counts["relay_outbox"]["SUPERSEDED"] == 3
    assert (await store.get_job(queued.id)).status == "QUEUED"  # type: ignore[union-attr]
    # The acting user with every batch it redrove (no tokens configured: user "local").
    lines = [e for e in logs if e["event"] == "jobs_redriven"]
    assert [(e["actor"], set(e["job_ids"]), e["refused"]) for e in lines] == [
        ("local", redriven, 1)
    ]


async def test_bulk_redrive_of_named_jobs(api: Client, store: SqlStore, keys: KeyRing) -> None:
    dead = await submit_job(store, keys, key="d")
    await kill_at_publish(store, dead.id)
    other_dead = await submit_job(store, keys, key="o")
    await kill_at_publish(store, other_dead.id)
    queued = await submit_job(store, keys, key="q")
    missing = str(uuid.uuid4())
    resp = await api.post(
        "/v1/admin/jobs/redrive",
        json={"status": "DEAD", "jobIds": [dead.id, queued.id, missing, dead.id]},
    )
    assert resp.status == 200, await resp.text()
    body = await resp.json()
    assert body == {
        "redriven": 1,
        "jobIds": [dead.id],
        "refused": [
            {"jobId": queued.id, "reason": "job is QUEUED, not DEAD"},
            {"jobId": missing, "reason": "no such job"},
        ],
        "more": False,
    }
    # Only the named job moved.
    assert (await store.get_job(other_dead.id)).status == "DEAD"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "body",
    [
        {},  # neither a status nor the ids
        {"status": "FAILED"},
        {"status": None},
        {"status": "DEAD", "jobIds": []},
        {"status": "DEAD", "jobIds": "x"},
        {"status": "DEAD", "jobIds": ["x"]},
        {"status": "DEAD", "jobIds": [""]},
        {"status": "DEAD", "jobIds": [1]},
        {"status": "DEAD", "jobIds": ["a\u0000b"]},
        {"status": "DEAD", "jobIds": [str(uuid.uuid4()) + "\n"]},
        {"status": "DEAD", "jobIds": [str(uuid.uuid4()).upper()]},
        {"status": "DEAD", "jobIds": [str(uuid.uuid4()) for _ in range(1001)]},
        {"jobIds": []},
        {"jobIds": [str(uuid.uuid4()).upper()]},
        {"status": "DEAD", "limit": 0},
        {"status": "DEAD", "limit": 10_001},
        {"status": "DEAD", "limit": True},
        {"status": "DEAD", "limit": "5"},
        {"status": "DEAD", "extra": 1},
    ],
)
async def test_bulk_redrive_refuses_bad_bodies(
    api: Client, store: SqlStore, keys: KeyRing, body: dict[str, Any]
) -> None:
    dead = await submit_job(store, keys)
    await kill_at_publish(store, dead.id)
    await assert_problem(await api.post("/v1/admin/jobs/redrive", json=body), 400, "C01")
    assert (await store.get_job(dead.id)).status == "DEAD"  # type: ignore[union-attr]


# ------------------------------------------------------------------ stats


async def test_stats_counts_equal_the_database(
    api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    await jobs_in_each_status(store, keys)
    assert (await api.post("/v1/websites", json={"domain": "example.com"})).status == 201
    assert (await api.post("/v1/admin/tasks", json={"type": "noop"})).status == 202

    resp = await api.get("/v1/admin/stats")
    assert resp.status == 200, await resp.text()
    stats = await resp.json()
    assert stats["tables"] == await db_counts(db_url)
    assert stats["tables"]["jobs"] == {"QUEUED": 2, "SUCCEEDED": 1, "FAILED": 1, "DEAD": 1}
    ages = stats["oldestPendingAgeSeconds"]
    assert set(ages) == {"jobs", "relay_outbox", "work_outbox", "task_runs"}
    for table in ("jobs", "relay_outbox", "work_outbox", "task_runs"):
        assert ages[table] is not None and 0 <= ages[table] < 60
    assert stats["queues"] is None  # no queue configured in this app


async def test_stats_on_an_empty_database(api: Client) -> None:
    stats = await (await api.get("/v1/admin/stats")).json()
    assert stats["tables"] == {"jobs": {}, "relay_outbox": {}, "work_outbox": {}, "task_runs": {}}
    assert all(v is None for v in stats["oldestPendingAgeSeconds"].values())


# ------------------------------------------------------------------ tasks


async def test_enqueue_task_and_dedup(api: Client, store: SqlStore) -> None:
    resp = await api.post(
        "/v1/admin/tasks", json={"type": "outbox.prune", "payload": {"older_than_days": 3}}
    )
    assert resp.status == 202, await resp.text()
    task_id = (await resp.json())["taskId"]
    run = await store.get_task(task_id)
    assert run is not None and run.type == "outbox.prune" and run.status == "PENDING"
    assert dict(run.payload) == {"older_than_days": 3}
    assert run.dedup_id == task_id  # no dedupId: the task id is its own

    first = await api.post("/v1/admin/tasks", json={"type": "noop", "dedupId": "once"})
    again = await api.post("/v1/admin/tasks", json={"type": "noop", "dedupId": "once"})
    assert first.status == again.status == 202
    assert (await first.json())["taskId"] == (await again.json())["taskId"]
    page = await store.list_tasks(None, 50, None)
    assert sorted(r.dedup_id for r in page.items) == sorted([task_id, "once"])
    relay = await store.list_relay_rows(None, 50, None)
    assert len(relay.items) == 2


@pytest.mark.parametrize(
    "body",
    [
        {"type": "rm -rf"},
        {"type": "unknown.task"},
        {"type": ""},
        {},
        {"type": "noop", "payload": []},
        {"type": "noop", "extra": 1},
        {"type": "noop", "dedupId": 5},
    ],
)
async def test_enqueue_task_rejects_bad_bodies(
    api: Client, store: SqlStore, body: dict[str, Any]
) -> None:
    await assert_problem(await api.post("/v1/admin/tasks", json=body), 400, "C01")
    assert (await store.list_tasks(None, 10, None)).items == []


async def test_list_tasks_with_pagination_and_type_filter(api: Client, store: SqlStore) -> None:
    ids = []
    for i in range(5):
        resp = await api.post("/v1/admin/tasks", json={"type": "noop", "dedupId": f"n{i}"})
        ids.append((await resp.json())["taskId"])
    resp = await api.post("/v1/admin/tasks", json={"type": "outbox.prune"})
    prune_id = (await resp.json())["taskId"]
    # Same enqueued_at for three more: the id tie-break keeps pages apart.
    now = time.time() + 5
    for i in range(3):
        run, _ = await store.enqueue_task(
            str(uuid.uuid4()), str(uuid.uuid4()), "noop", {}, f"tie{i}", now
        )
        ids.append(run.id)

    everything = [i for p in await walk(api, "/v1/admin/tasks", 2) for i in p]
    assert len(everything) == 9 and len({i["taskId"] for i in everything}) == 9
    # The order is by the stored time, id breaking ties. The API renders that time to the
    # millisecond, so two tasks posted within one millisecond look equal in `enqueuedAt`
    # while their stored times still order them: compare the stored ones.
    stamps = []
    for i in everything:
        run = await store.get_task(i["taskId"])
        assert run is not None
        stamps.append((run.enqueued_at, run.id))
    assert stamps == sorted(stamps, reverse=True), "newest first"
    for item in everything:
        assert set(item) == {
            "taskId",
            "type",
            "dedupId",
            "status",
            "enqueuedAt",
            "finishedAt",
            "error",
        }
        assert item["status"] == "PENDING"
    noops = [i for p in await walk(api, "/v1/admin/tasks", 3, type="noop") for i in p]
    assert {i["taskId"] for i in noops} == set(ids)
    prunes = [i for p in await walk(api, "/v1/admin/tasks", 3, type="outbox.prune") for i in p]
    assert [i["taskId"] for i in prunes] == [prune_id]
    await assert_problem(await api.get("/v1/admin/tasks", params={"cursor": "%%%"}), 400, "C01")
    await assert_problem(await api.get("/v1/admin/tasks", params={"limit": "-1"}), 400, "C01")
    await assert_problem(await api.get("/v1/admin/tasks", params={"typ": "noop"}), 400, "C01")


# ------------------------------------------------------------------ roles

ADMIN_ROUTES = [
    ("GET", "/v1/admin/outbox", None),
    ("POST", "/v1/admin/outbox/{id}/redrive", None),
    ("POST", "/v1/admin/jobs/{id}/redrive", None),
    ("POST", "/v1/admin/jobs/redrive", {"status": "DEAD"}),
    ("GET", "/v1/admin/stats", None),
    ("POST", "/v1/admin/tasks", {"type": "noop"}),
    ("GET", "/v1/admin/tasks", None),
]


async def test_admin_routes_are_403_for_a_user_token(
    two_role_api: tuple[Client, str, str], store: SqlStore, keys: KeyRing
) -> None:
    client, user_token, admin_token = two_role_api
    job = await submit_job(store, keys, user="bob")
    row = await kill_at_publish(store, job.id)
    for method, template, body in ADMIN_ROUTES:
        path = template.replace("{id}", row.id if "outbox" in template else job.id)
        as_user = await client.request(
            method, path, json=body, headers={"Authorization": f"Bearer {user_token}"}
        )
        await assert_problem(as_user, 403, "C03")
        anonymous = await client.request(method, path, json=body)
        await assert_problem(anonymous, 401, "C02")
        assert anonymous.headers["WWW-Authenticate"].startswith("Bearer")
    # Refused requests changed nothing.
    assert (await store.get_relay_row(row.id)).status == "DEAD"  # type: ignore[union-attr]
    assert (await store.list_tasks(None, 10, None)).items == []
    # The admin token is allowed on the same routes.
    for method, template, body in ADMIN_ROUTES:
        if "redrive" in template:
            continue
        resp = await client.request(
            method, template, json=body, headers={"Authorization": f"Bearer {admin_token}"}
        )
        assert resp.status in (200, 202), (template, await resp.text())


# ------------------------------------------------------------------ who did it


async def test_every_admin_action_is_logged_with_the_acting_principal(
    two_role_api: tuple[Client, str, str], store: SqlStore, keys: KeyRing
) -> None:
    """Redrives, a classification retry and an enqueued task each log one line naming
    the admin's token user (`actor`), so the journal says who changed what."""
    api, _user_token, admin_token = two_role_api
    auth = {"Authorization": f"Bearer {admin_token}"}
    dead_row = await kill_at_publish(store, (await submit_job(store, keys, key="o")).id)
    dead_job = await kill_in_processing(store, (await submit_job(store, keys, key="j")).id)
    await store.register_website(str(uuid.uuid4()), str(uuid.uuid4()), "failed.example", None, 1.0)
    work = await store.claim_work(time.time(), 0.0, 300.0)
    assert work is not None and await store.fail_work(work, "no rule matches", True, time.time())

    with capture_logs() as logs:
        for path, status in (
            (f"/v1/admin/outbox/{dead_row.id}/redrive", 200),
            (f"/v1/admin/jobs/{dead_job.id}/redrive", 202),
            ("/v1/admin/websites/failed.example/retry", 200),
        ):
            resp = await api.post(path, headers=auth)
            assert resp.status == status, await resp.text()
        resp = await api.post("/v1/admin/tasks", json={"type": "noop", "payload": {}}, headers=auth)
        assert resp.status == 202, await resp.text()
    actions = {
        e["event"]: e
        for e in logs
        if e["event"]
        in ("outbox_redriven", "job_redriven", "website_classification_retried", "task_enqueued")
    }
    assert set(actions) == {
        "outbox_redriven",
        "job_redriven",
        "website_classification_retried",
        "task_enqueued",
    }, logs
    assert {e["actor"] for e in actions.values()} == {"root"}
    assert actions["outbox_redriven"]["outbox_id"] == dead_row.id
    assert actions["job_redriven"]["job_id"] == dead_job.id
    assert actions["website_classification_retried"]["domain"] == "failed.example"
