"""An operator finds a portal job by its portal username (docs/contract.md#administration,
docs/decisions/0032-job-search-by-username-key.md), on both backends, in process, no queue.

The intake stores the username's keyed hash (the login lock's subject) in the statement that
inserts the job; `GET /v1/admin/jobs?username=` hashes the username it is given and filters
by equality. The username itself is never in the jobs table nor in an answer.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs

from outboxd.security import KeyRing, generate_key
from outboxd.services.portal_jobs import LinkCredentials, PortalJobService
from outboxd.storage.store import SqlStore
from tests.support.api import assert_problem
from tests.support.db import raw_execute, raw_rows, sql
from tests.support.ops import run_cli, write_config

Client = TestClient[Any, Any]

ALICE_SNO, BOB_SNO = "20231234", "20239876"


async def _submit(api: Client, username: str, user_key: str | None = None) -> str:
    r = await api.post(
        "/v1/portal-link-jobs",
        json={"portal": "suwon", "username": username, "password": "pw-" + username},
        headers={"Idempotency-Key": user_key or uuid.uuid4().hex},
    )
    assert r.status == 202, await r.text()
    return str((await r.json())["jobId"])


async def _found(api: Client, query: str) -> tuple[list[str], bytes]:
    r = await api.get("/v1/admin/jobs?" + query)
    body = await r.read()
    assert r.status == 200, body
    return [item["jobId"] for item in (await r.json())["items"]], body


async def test_a_job_is_found_by_its_exact_username_and_no_other(
    api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    # Together, so the intakes share a group commit (one statement on Postgres).
    alice_jobs = await asyncio.gather(*(_submit(api, ALICE_SNO) for _ in range(3)))
    bob_job = await _submit(api, BOB_SNO)

    with capture_logs() as logs:
        found, body = await _found(api, f"username={ALICE_SNO}")
    assert sorted(found) == sorted(alice_jobs)
    assert ALICE_SNO.encode() not in body, "the username is never echoed"
    assert ALICE_SNO not in repr(logs), "the username is never logged"
    assert (await _found(api, f"username={BOB_SNO}"))[0] == [bob_job]
    assert (await _found(api, "username=20230000"))[0] == [], "nobody's username: no job"
    # With the other filters, each still applies.
    assert (await _found(api, f"username={ALICE_SNO}&user=someone-else"))[0] == []
    assert len((await _found(api, f"username={ALICE_SNO}&status=QUEUED&limit=2"))[0]) == 2

    # The key is the login lock's subject: one value names the username in both listings.
    rows = await sql(db_url, "SELECT id, login_subject FROM jobs")
    subjects = {str(job_id): subject for job_id, subject in rows}
    assert {subjects[j] for j in alice_jobs} == {keys.login_subject("suwon", ALICE_SNO)}
    assert subjects[bob_job] == keys.login_subject("suwon", BOB_SNO)


async def test_the_username_is_nowhere_in_the_jobs_table(api: Client, db_url: str) -> None:
    job_id = await _submit(api, ALICE_SNO)
    rows = await raw_rows(db_url, "SELECT * FROM jobs WHERE id = ?", job_id)
    assert len(rows) == 1
    for column, value in rows[0].items():
        raw = bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
        assert ALICE_SNO.encode() not in raw, f"the username in jobs.{column}"
        assert ALICE_SNO.encode().hex().encode() not in raw, f"the username in jobs.{column}"


async def test_a_username_intake_would_refuse_is_400_and_changes_nothing(
    api: Client, db_url: str
) -> None:
    await _submit(api, "ab12cd")
    before = await sql(db_url, "SELECT id, status, version FROM jobs ORDER BY id")
    # Capitals, surrounding spaces, full-width digits, empty, too long: intake refuses each
    # (one person, one spelling), so the search does too, rather than find nobody.
    for bad in ("AB12CD", " ab12cd", "ab12cd ", "\uff12\uff10\uff12\uff13", "", "x" * 65):
        r = await api.get("/v1/admin/jobs", params={"username": bad})
        problem = await assert_problem(r, 400, "C01")
        assert problem["errors"][0]["field"] == "username"
        if bad.strip():
            assert bad.strip().encode() not in await r.read(), "the username is never echoed"
    assert await sql(db_url, "SELECT id, status, version FROM jobs ORDER BY id") == before


async def test_jobs_accepted_without_a_key_are_not_found(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """A job from before migration 0010 has no key: it is simply not found by a username."""
    job_id = await _submit(api, ALICE_SNO)
    await raw_execute(db_url, "UPDATE jobs SET login_subject = NULL WHERE id = ?", job_id)
    assert (await _found(api, f"username={ALICE_SNO}"))[0] == []
    assert job_id in (await _found(api, "limit=50"))[0], "still listed without the filter"


async def test_the_cli_lists_one_usernames_jobs(
    store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """`outboxd jobs list --username U`, on a config naming the same database and key: that
    username's jobs only; a spelling intake refuses is a usage error naming no username."""
    key = generate_key()
    keys_file = tmp_path / "cli.keys"
    keys_file.write_text(key + "\n")
    service = PortalJobService(store, KeyRing.from_lines([key], "test"), None)
    mine = [
        (await service.submit("bob", uuid.uuid4().hex, LinkCredentials("suwon", ALICE_SNO, "pw")))
        for _ in range(2)
    ]
    await service.submit("bob", uuid.uuid4().hex, LinkCredentials("suwon", BOB_SNO, "pw"))
    config = str(
        write_config(
            tmp_path,
            {
                "storage": {"url": db_url, "auto_migrate": False},
                "security": {"keys_file": str(keys_file)},
            },
        )
    )

    listed = run_cli("jobs", "list", "--username", ALICE_SNO, "--json", "--config", config)
    assert listed.returncode == 0, listed.stderr
    assert sorted(j["jobId"] for j in json.loads(listed.stdout)) == sorted(m.job.id for m in mine)
    assert ALICE_SNO not in listed.stdout + listed.stderr
    table = run_cli("jobs", "list", "--username", BOB_SNO, "--config", config)
    assert table.returncode == 0, table.stderr
    assert not any(m.job.id in table.stdout for m in mine)
    assert len(table.stdout.strip().splitlines()) == 2, "the header and bob's one job"

    refused = run_cli("jobs", "list", "--username", "Kim20231234", "--config", config)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.startswith("outboxd: --username must be in normal form")
    assert "Kim20231234" not in refused.stderr
