"""Group commit of intake (storage/group.py), on real SQLite files and a real Postgres.

Concurrent intakes share one transaction, a savepoint each: a member that fails
gets its lone answer and the others commit; a group that fails as a whole runs each
member alone; a crash between the commit and the answers loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Generator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import structlog
from aiohttp.test_utils import TestClient

from outboxd.errors import StorageError
from outboxd.security import KeyRing
from outboxd.services.portal_jobs import (
    IdempotencyConflict,
    LinkCredentials,
    PortalJobService,
)
from outboxd.storage.db import Op, Query, Row, execute, fetch
from outboxd.storage.ports import NewPortalJob, RelayRow
from outboxd.storage.store import SqlStore, open_store
from tests.conftest import postgres_only, sqlite_only
from tests.support.db import raw_count, raw_db
from tests.support.group_crash import portal_job, warm_connections
from tests.support.logs import json_lines

Client = TestClient[Any, Any]
URL = "/v1/portal-link-jobs"
ROOT = Path(__file__).resolve().parents[2]
COMMIT_FAILS = "fails-at-commit"


def new_job(tag: str, i: int, *, key: str | None = None, job_id: str | None = None) -> NewPortalJob:
    return portal_job(tag, i, user="group-user", key=key, job_id=job_id)


def stats(store: SqlStore) -> Any:
    assert store.group is not None, "group commit is on by default"
    return store.group.stats


def direct(store: SqlStore) -> int:
    """How many calls started together are written at once, before a group forms."""
    assert store.group is not None
    return store.group.max_groups


# ------------------------------------------------------------------ idempotency races


async def test_fifty_concurrent_requests_over_twenty_keys_make_twenty_jobs(
    api: Client, store: SqlStore, db_url: str
) -> None:
    """Over HTTP: every request answers 202 with its key's job; one job and one outbox row
    per key, one non-replayed answer per key."""
    bodies = {
        k: {"portal": "suwon", "username": f"2020{k:04d}", "password": f"pw-{k}"} for k in range(20)
    }
    keys = [i % 20 for i in range(50)]
    responses = await asyncio.gather(
        *(api.post(URL, json=bodies[k], headers={"Idempotency-Key": f"gk-{k}"}) for k in keys)
    )
    assert [r.status for r in responses] == [202] * 50, [await r.text() for r in responses]
    by_key: dict[int, set[str]] = {}
    fresh: dict[int, int] = {}
    for k, r in zip(keys, responses, strict=True):
        by_key.setdefault(k, set()).add((await r.json())["jobId"])
        if r.headers.get("Idempotent-Replayed") != "true":
            fresh[k] = fresh.get(k, 0) + 1
    assert all(len(ids) == 1 for ids in by_key.values()), by_key
    assert len({next(iter(ids)) for ids in by_key.values()}) == 20
    assert fresh == {k: 1 for k in range(20)}
    assert await raw_count(db_url, "jobs") == 20
    assert await raw_count(db_url, "relay_outbox") == 20
    assert stats(store).largest > 1, "the requests were meant to share groups"


async def test_one_group_over_twenty_keys_replays_consistently(
    store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    """Fifty calls started together: the first are written at once (one on SQLite, as
    many as may write side by side on Postgres), the others wait and form one group.
    Twenty created, thirty replays of them; a different request under a used key is
    refused as it would be alone. On SQLite the calls written at once go first. On
    Postgres the group starts as soon as one of them is done and may write a key before a
    call still on its way (a new connection preparing its statement): that call then
    replays the group's job, so there each key has exactly one created answer."""
    service = PortalJobService(store, keys, dispatcher=None)
    reqs = {k: LinkCredentials("suwon", f"user-{k}", f"pw-{k}") for k in range(20)}
    order = [i % 20 for i in range(50)]
    await warm_connections(store)
    subs = await asyncio.gather(*(service.submit("u1", f"one-{k}", reqs[k]) for k in order))
    assert stats(store).groups == 1 and stats(store).largest == 50 - direct(store)
    ids: dict[int, set[str]] = {}
    for k, sub in zip(order, subs, strict=True):
        ids.setdefault(k, set()).add(sub.job.id)
    assert all(len(v) == 1 for v in ids.values())
    if store.backend == "sqlite":
        assert [s.replayed for s in subs[:20]] == [False] * 20
        assert all(s.replayed for s in subs[20:])
    created = [k for k, s in zip(order, subs, strict=True) if not s.replayed]
    assert sorted(created) == list(range(20)), "one created answer per key"
    assert await raw_count(db_url, "jobs") == 20
    assert await raw_count(db_url, "relay_outbox") == 20
    again = await service.submit("u1", "one-4", reqs[4])
    assert again.replayed and again.job.id in ids[4]
    with pytest.raises(IdempotencyConflict):
        await service.submit("u1", "one-3", LinkCredentials("suwon", "someone-else", "pw"))


@postgres_only
async def test_an_intake_statement_past_its_deadline_writes_nothing(
    store: SqlStore, db_url: str
) -> None:
    """Postgres: the intake statement commits on its own, so one that reaches the server
    after the caller's statement deadline (a held network) must write nothing. Run
    directly with a deadline already past, it writes no row; through the store, each
    member then falls back to its own transaction and is created."""
    items = [(new_job("late", i), time.time()) for i in range(3)]
    store.db.statement_timeout_s = -1.0
    late = store._intake_bulk(items, time.time())
    assert await store.db.run(late, one_statement=True) == [None, None, None]
    assert await raw_count(db_url, "jobs") == 0
    results = await asyncio.gather(*(store.create_portal_job(n, now) for n, now in items))
    assert [r.created for r in results] == [True, True, True]
    assert await raw_count(db_url, "jobs") == 3
    assert await raw_count(db_url, "relay_outbox") == 3


async def test_a_call_waiting_in_line_past_its_patience_answers_unavailable(
    db_url: str, tmp_path: Path
) -> None:
    """The direct writes are held by another connection's lock; the calls queued behind
    them answer StorageUnavailable once their patience runs out, long before the lock
    goes, and write nothing; the direct writes complete once it goes."""
    import asyncpg

    from outboxd.errors import StorageUnavailable
    from outboxd.storage.store import open_database

    db = await open_database(db_url, tmp_path, 5, 5.0)
    store = SqlStore(db, patience_s=0.2)
    await db.migrate()
    await warm_connections(store)
    assert store.group is not None
    direct_n = store.group.max_groups
    if store.backend == "sqlite":
        import sqlite3

        holder: Any = sqlite3.connect(db_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
    else:
        holder = await asyncpg.connect(db_url)
        await holder.execute("BEGIN; LOCK TABLE jobs IN EXCLUSIVE MODE")
    try:
        calls = [
            asyncio.ensure_future(store.create_portal_job(new_job("pat", i), time.time()))
            for i in range(direct_n + 3)
        ]
        started = time.monotonic()
        late = await asyncio.gather(*calls[direct_n:], return_exceptions=True)
        assert time.monotonic() - started < 3.0
        assert all(isinstance(r, StorageUnavailable) for r in late), late
        assert not any(c.done() for c in calls[:direct_n])
    finally:
        if store.backend == "sqlite":
            holder.execute("ROLLBACK")
            holder.close()
        else:
            await holder.execute("ROLLBACK")
            await holder.close()
    done = await asyncio.gather(*calls[:direct_n])
    assert all(r.created for r in done)
    await store.close()
    assert await raw_count(db_url, "jobs") == direct_n


async def test_a_lone_request_is_written_at_once_without_a_group(store: SqlStore) -> None:
    intake = await store.create_portal_job(new_job("lone", 0), time.time())
    assert intake.created and intake.outbox is not None
    assert stats(store).groups == 0


def _temporary_files() -> list[str]:
    """The files this process holds open that SQLite made for itself (statement journals,
    sorts): unlinked at once, named etilqs_*."""
    fds = Path("/proc/self/fd")
    names = []
    for fd in fds.iterdir():
        with contextlib.suppress(OSError):
            names.append(os.readlink(fd))
    return [n for n in names if "etilqs_" in n]


@sqlite_only
async def test_a_members_savepoint_journal_stays_in_memory(store: SqlStore) -> None:
    """A group member's savepoint keeps the pages it changes in a statement journal, which
    by default spills to a temporary file past 64 KiB: two writes per page, a system call
    each. The store keeps it in memory: a member that rewrites a hundred pages opens no
    temporary file."""
    now = time.time()
    jobs = (new_job("journal", i) for i in range(1000))
    await asyncio.gather(*(store.create_portal_job(job, now) for job in jobs))
    seen: list[list[str]] = []

    def member() -> Generator[Op, Any, int]:
        changed: int = yield execute(
            Query("progress_all", "UPDATE jobs SET progress = hex(randomblob(40))", ()), {}
        )
        seen.append(_temporary_files())  # inside the member's savepoint, on the writer thread
        return changed

    [outcome] = await store.db.run_group([member])
    assert outcome.error is None and outcome.value == 1000
    assert seen == [[]]


async def test_concurrent_registrations_share_groups_and_keep_one_website_per_domain(
    store: SqlStore, db_url: str
) -> None:
    """Website registration is grouped too: twenty calls over eight domains make eight
    websites with one work row each, every call answered with its domain's website."""
    domains = [f"site{i % 8}.example" for i in range(20)]
    results = await asyncio.gather(
        *(
            store.register_website(f"w-{i}", f"work-{i}", d, None, time.time())
            for i, d in enumerate(domains)
        )
    )
    assert store.website_group is not None and store.website_group.stats.groups >= 1
    by_domain: dict[str, set[str]] = {}
    created: dict[str, int] = {}
    for d, (website, made) in zip(domains, results, strict=True):
        assert website.domain == d
        by_domain.setdefault(d, set()).add(website.id)
        created[d] = created.get(d, 0) + int(made)
    assert all(len(ids) == 1 for ids in by_domain.values())
    assert created == {d: 1 for d in by_domain}
    assert await raw_count(db_url, "websites") == 8
    assert await raw_count(db_url, "work_outbox") == 8


# ------------------------------------------------------------------ a failing member


async def test_a_member_that_violates_a_constraint_fails_alone_and_the_rest_commit(
    store: SqlStore, db_url: str
) -> None:
    """A new key reusing an existing job's id breaks the primary key: only that member
    fails, with the error it gets alone; the other members of its group commit."""
    taken = await store.create_portal_job(new_job("pk", 99), time.time())
    with pytest.raises(StorageError) as alone:
        await store.create_portal_job(
            new_job("pk", 98, job_id=taken.job.id, key="pk-alone"), time.time()
        )
    members = [new_job("pk", i) for i in range(12)]
    members[10] = new_job("pk", 10, job_id=taken.job.id)
    results = await asyncio.gather(
        *(store.create_portal_job(m, time.time()) for m in members), return_exceptions=True
    )
    # The first calls are written at once; the others form a group around member 10.
    assert stats(store).largest == 12 - direct(store) and stats(store).member_failures == 1
    assert isinstance(results[10], StorageError)
    assert type(results[10]) is type(alone.value)
    assert str(results[10]).replace("pk-10", "KEY") == str(alone.value).replace("pk-alone", "KEY")
    for i in (*range(10), 11):
        got = results[i]
        assert not isinstance(got, BaseException), got
        assert got.created and got.job.id == f"pk-job-{i}"
        assert await store.get_job(f"pk-job-{i}") is not None
        assert await store.latest_relay_row_for_job(f"pk-job-{i}") is not None
    assert await raw_count(db_url, "jobs") == 12  # the taken one and eleven members
    assert await raw_count(db_url, "relay_outbox") == 12


async def test_a_member_failing_after_its_first_insert_leaves_nothing(
    store: SqlStore, db_url: str
) -> None:
    """A member whose job row went in and whose outbox row then broke a key is rolled back to
    its savepoint (no job without its outbox row); the others of its group commit."""
    taken = await store.create_portal_job(new_job("sp", 99), time.time())
    assert taken.outbox is not None
    members = [new_job("sp", i) for i in range(12)]
    bad = members[10]
    members[10] = replace(bad, outbox_id=taken.outbox.id)
    results = await asyncio.gather(
        *(store.create_portal_job(m, time.time()) for m in members), return_exceptions=True
    )
    assert stats(store).member_failures == 1 and stats(store).group_failures == 0
    assert isinstance(results[10], StorageError)
    assert await store.get_job(bad.job_id) is None
    for i in (*range(10), 11):
        got = results[i]
        assert not isinstance(got, BaseException), got
        assert got.created and got.outbox is not None
    assert await raw_count(db_url, "jobs") == 12
    assert await raw_count(db_url, "relay_outbox") == 12


async def test_a_member_that_failed_only_because_of_its_group_runs_again_alone(
    store: SqlStore, db_url: str
) -> None:
    """A member refused inside a group for a reason of the moment, not of its own rows (a
    deadlock or lock timeout, met here on its first run only), is rolled back to its
    savepoint and run again alone: its caller gets what the lone run gives, a success,
    never the error the group met."""
    runs: list[int] = []

    def flaky() -> Generator[Op, Any, str]:
        runs.append(len(runs))
        rows = yield fetch(
            store.q["insert_website"],
            {"id": "gc-flaky", "domain": "flaky.example", "favicon_url": None, "now": 1.0},
        )
        if len(runs) == 1:
            raise StorageError("deadlock detected")
        return str(rows[0]["id"]) if rows else "found"

    assert store.website_group is not None
    width = store.website_group.max_groups
    others = [
        store.register_website(f"gc-w{i}", f"gc-o{i}", f"w{i}.example", None, time.time())
        for i in range(width + 6)
    ]
    results = await asyncio.gather(*others, store.website_group.run(flaky), return_exceptions=True)
    assert store.website_group.stats.groups >= 1
    assert store.website_group.stats.member_failures == 1
    assert results[-1] == "gc-flaky", results[-1]
    assert len(runs) == 2
    assert all(not isinstance(r, BaseException) for r in results[:-1]), results
    assert await raw_count(db_url, "websites") == width + 7


# ------------------------------------------------------------------ dispatch outcomes


async def claimed_rows(store: SqlStore, tag: str, n: int) -> list[RelayRow]:
    """n committed jobs, their outbox rows claimed as an intake claims them for dispatch."""
    rows = []
    for i in range(n):
        now = time.time()
        made = await store.create_portal_job(replace(new_job(tag, i), claimed_until=now + 30), now)
        assert made.outbox is not None
        rows.append(made.outbox)
    return rows


async def test_a_dispatch_outcome_shares_the_intake_groups_commit(
    store: SqlStore, db_url: str
) -> None:
    """A dispatch batch's outcome that arrives while intakes are in flight: on SQLite it
    joins the next group's transaction, on Postgres it is one statement of its own (the
    group is one statement too). Either way the rows are SENT with their MessageId, their
    jobs RUNNING, and the intakes created."""
    rows = await claimed_rows(store, "out", 3)
    members = [new_job("in", i) for i in range(direct(store) + 6)]
    now = time.time()
    *made, marked = await asyncio.gather(
        *(store.create_portal_job(m, now) for m in members),
        store.record_relay_outcome([(r, f"mid-{r.id}") for r in rows], [], now),
    )
    joined = store.backend == "sqlite"  # the outcome as a member of the intakes' group
    assert stats(store).groups == 1 and stats(store).largest == 6 + joined
    assert all(not isinstance(m, BaseException) and m.created for m in made)
    assert sorted(r.id for r in marked) == sorted(r.id for r in rows)
    assert all(r.status == "SENT" and r.queue_message_id == f"mid-{r.id}" for r in marked)
    for r in rows:
        job = await store.get_job(r.job_id or "")
        assert job is not None and job.status == "RUNNING"
    assert await raw_count(db_url, "jobs") == 3 + len(members)


async def test_a_dispatch_outcome_in_a_group_with_a_failing_member_still_commits(
    store: SqlStore,
) -> None:
    """An intake of the group breaks a key: on Postgres the group's one statement fails and
    the group is written again a savepoint each. The outcome (on SQLite a member of that
    group, on Postgres a statement of its own) commits either way, once."""
    rows = await claimed_rows(store, "outf", 2)
    taken = await store.create_portal_job(new_job("inf", 99), time.time())
    members = [new_job("inf", i) for i in range(direct(store) + 4)]
    members[-1] = new_job("inf", 50, job_id=taken.job.id)
    now = time.time()
    *made, marked = await asyncio.gather(
        *(store.create_portal_job(m, now) for m in members),
        store.record_relay_outcome([(r, "mid") for r in rows], [], now),
        return_exceptions=True,
    )
    joined = store.backend == "sqlite"
    assert stats(store).largest == 4 + joined
    assert stats(store).member_failures + stats(store).bulk_refused
    assert isinstance(made[-1], StorageError)
    assert all(not isinstance(m, BaseException) for m in made[:-1])
    assert not isinstance(marked, BaseException)
    assert sorted(r.id for r in marked) == sorted(r.id for r in rows)
    for r in rows:
        row = await store.get_relay_row(r.id)
        assert row is not None and row.status == "SENT" and row.version == r.version + 1


async def test_an_outcome_finds_its_jobs_by_key_whatever_the_backlog(store: SqlStore) -> None:
    """Setting a batch's jobs RUNNING finds them by primary key, never through the status
    index: a backlog of QUEUED jobs is not read for each batch (the plan, not a speed)."""
    if store.backend == "sqlite":
        q = store.q["jobs_running_if_queued"]
        explain = Query(q.name, f"EXPLAIN QUERY PLAN {q.sql}", q.param_names)
        params: dict[str, Any] = {"ids": "[]", "now": 0.0}
    else:
        q = store.q["relay_sent_many"]  # on Postgres it sets the jobs RUNNING itself
        explain = Query(q.name, f"EXPLAIN {q.sql}", q.param_names)
        params = {"ids": [], "versions": [], "message_ids": [], "now": 0.0, "ev_instance": "i"}

    def body() -> Generator[Op, Any, list[Row]]:
        rows: list[Row] = yield fetch(explain, params)
        return rows

    plan = " ".join(str(v) for r in await store.db.read(body) for v in r.values())
    assert "jobs_status_finished" not in plan, plan


# ------------------------------------------------------------------ a failing group


@pytest_asyncio.fixture
async def fails_at_commit(store: SqlStore, db_url: str) -> AsyncIterator[None]:
    """A deferred check that fails the COMMIT of any transaction holding the marked key
    (on the store's migrated database)."""
    if store.backend == "sqlite":
        setup = [
            "CREATE TABLE gc_parent (id TEXT PRIMARY KEY)",
            "CREATE TABLE gc_child (parent TEXT REFERENCES gc_parent (id)"
            " DEFERRABLE INITIALLY DEFERRED)",
            "CREATE TRIGGER gc_fail AFTER INSERT ON jobs"
            f" WHEN NEW.idempotency_key = '{COMMIT_FAILS}'"
            " BEGIN INSERT INTO gc_child VALUES ('missing'); END",
        ]
        cleanup: list[str] = []  # the SQLite file is the test's own
    else:
        setup = [
            "CREATE OR REPLACE FUNCTION gc_fail() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused at commit'; END $$",
            "CREATE CONSTRAINT TRIGGER gc_fail AFTER INSERT ON jobs"
            " DEFERRABLE INITIALLY DEFERRED FOR EACH ROW"
            f" WHEN (NEW.idempotency_key = '{COMMIT_FAILS}') EXECUTE FUNCTION gc_fail()",
        ]
        cleanup = ["DROP TRIGGER IF EXISTS gc_fail ON jobs", "DROP FUNCTION IF EXISTS gc_fail()"]
    async with raw_db(db_url) as db:
        for statement in setup:
            await db.execute(statement)
    try:
        yield
    finally:
        async with raw_db(db_url) as db:
            for statement in cleanup:
                await db.execute(statement)


@pytest.mark.usefixtures("fails_at_commit")
async def test_a_group_whose_commit_fails_runs_each_member_alone(
    store: SqlStore, db_url: str
) -> None:
    """The group's COMMIT fails for real: nothing of it stays, then each member runs on
    its own; the marked one fails again, every other one commits."""
    members = [new_job("cf", i) for i in range(8)]
    members[6] = new_job("cf", 6, key=COMMIT_FAILS)
    results = await asyncio.gather(
        *(store.create_portal_job(m, time.time()) for m in members), return_exceptions=True
    )
    assert stats(store).groups == 1 and stats(store).group_failures == 1
    assert isinstance(results[6], StorageError)
    for i in (0, 1, 2, 3, 4, 5, 7):
        got = results[i]
        assert not isinstance(got, BaseException), got
        assert got.created, "the rerun alone inserts: the failed group left nothing"
    assert await raw_count(db_url, "jobs") == 7
    assert await raw_count(db_url, "relay_outbox") == 7
    assert await store.get_job("cf-job-6") is None


@pytest.mark.usefixtures("fails_at_commit")
async def test_a_groups_own_lines_name_none_of_its_members_requests(store: SqlStore) -> None:
    """Each member is a request's (its request_id bound); the group writes for all of them,
    so its own lines (the group that failed) carry no request_id at all."""

    async def member(i: int) -> object:
        structlog.contextvars.bind_contextvars(request_id=f"req-{i}")
        key = COMMIT_FAILS if i == 3 else None
        return await store.create_portal_job(new_job("lg", i, key=key), time.time())

    with json_lines() as lines:
        await asyncio.gather(
            *(asyncio.create_task(member(i)) for i in range(6)), return_exceptions=True
        )
    assert stats(store).groups == 1
    own = lines("group_commit_failed") + lines("group_bulk_refused")
    assert own, lines()
    assert [e for e in own if "request_id" in e] == []


# ------------------------------------------------------------------ a crash after the commit


async def test_a_crash_between_the_commit_and_the_answers_loses_nothing(
    db_url: str, tmp_path: Path
) -> None:
    """A process SIGKILLs itself once its group committed, before answering anyone; a
    replay of each key (same Idempotency-Key) finds the job the dead process wrote."""
    env = {**os.environ, "OUTBOXD_CRASH_AT": "after_group_commit_before_answers"}
    proc = subprocess.run(
        [sys.executable, "-m", "tests.support.group_crash", db_url, str(tmp_path), "gc", "12"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert "crash point after_group_commit_before_answers reached" in proc.stderr
    lines = proc.stdout.splitlines()
    assert "answered" not in lines, "nobody was answered before the crash"
    planned: dict[str, str] = json.loads(lines[0])
    assert len(planned) == 12
    store = await open_store(db_url, tmp_path, 5, 5.0)
    try:
        replays = await asyncio.gather(
            *(
                store.create_portal_job(portal_job("replay", i, key=key), time.time())
                for i, key in enumerate(planned)
            )
        )
        for key, intake in zip(planned, replays, strict=True):
            assert not intake.created
            assert intake.job.id == planned[key]
            assert intake.outbox is not None and intake.outbox.job_id == planned[key]
        assert await raw_count(db_url, "jobs") == 12
    finally:
        await store.close()
