"""Migration 0003: fewer index writes per job, and the listings still served by an index.

A job's way to RUNNING, its heartbeats and its outbox row's claim change no indexed
column, so on Postgres they are HOT updates (no index written); a row SENT leaves the small
index of unsent rows instead of being written into a status index. The listing of outbox
rows by an unsent status (DEAD, the operator's usual question) reads that index.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Generator, Sequence
from typing import Any

from outboxd.ids import new_id
from outboxd.storage.db import Op, Query, Row, execute, fetch
from outboxd.storage.postgres import PostgresDatabase
from outboxd.storage.store import SqlStore
from tests.conftest import postgres_only
from tests.support.db import raw_db
from tests.support.group_crash import portal_job
from tests.support.waits import eventually


async def _plan(store: SqlStore, name: str, params: dict[str, Any]) -> str:
    q = store.q[name]
    prefix = "EXPLAIN QUERY PLAN " if store.backend == "sqlite" else "EXPLAIN "
    explain = Query(q.name, prefix + q.sql, q.param_names)

    def body() -> Generator[Op, Any, list[Row]]:
        if store.backend == "postgres":
            # On a test's few rows a sequential scan is the cheaper plan; the question
            # here is which index the statement can use once the table is large.
            yield execute(Query("seqscan_off", "SET LOCAL enable_seqscan = off", ()), {})
        rows: list[Row] = yield fetch(explain, params)
        return rows

    return " ".join(str(v) for r in await store.db.run(body) for v in r.values())


async def test_listing_outbox_rows_by_an_unsent_status_reads_the_unsent_index(
    store: SqlStore,
) -> None:
    params = {"status": "DEAD", "cursor_created": None, "cursor_id": None, "limit": 51}
    plan = await _plan(store, "list_relay_unsent", params)
    assert "relay_outbox_unsent" in plan, plan


async def test_each_outbox_status_lists_its_own_rows_newest_first(
    store: SqlStore, db_url: str
) -> None:
    """Whichever statement the store picks for a status, a page holds exactly the rows of
    that status, newest first, and pages on by the cursor."""
    made = [await store.create_portal_job(portal_job("list", i), 1000.0) for i in range(7)]
    async with raw_db(db_url) as db:
        for i, intake in enumerate(made):
            status = ("PENDING", "RETRYABLE_FAILED", "DEAD", "SENT")[i % 4]
            await db.execute(
                "UPDATE relay_outbox SET status = ?, created_at = ?, queue_message_id = ?"
                " WHERE job_id = ?",
                status,
                1000.0 + i,
                "m",
                intake.job.id,
            )
        for status in ("PENDING", "RETRYABLE_FAILED", "DEAD", "SENT"):
            want = [
                r["id"]
                for r in await db.rows(
                    "SELECT id FROM relay_outbox WHERE status = ?"
                    " ORDER BY created_at DESC, id DESC",
                    status,
                )
            ]
            got: list[str] = []
            cursor: str | None = None
            while True:  # one row a page, through the cursor
                page = await store.list_relay_rows(status, 1, cursor)
                got += [r.id for r in page.items]
                if (cursor := page.next_cursor) is None:
                    break
            assert got == want and want, status


async def test_no_index_on_jobs_reads_the_status(store: SqlStore, db_url: str) -> None:
    """What makes a job's QUEUED -> RUNNING, its run's start and its heartbeats free of
    index writes: every index of jobs leaves `status` out, predicates included."""
    async with raw_db(db_url) as db:
        if store.backend == "sqlite":
            defs = await db.rows(
                "SELECT name, sql FROM sqlite_master WHERE type = 'index' AND tbl_name = 'jobs'"
            )
            columns = [
                c["name"]
                for d in defs
                for c in await db.rows(f"SELECT name FROM pragma_index_info('{d['name']}')")
            ]
            texts = [str(d["sql"] or "") for d in defs]
        else:
            defs = await db.rows("SELECT indexdef FROM pg_indexes WHERE tablename = 'jobs'")
            columns = []
            texts = [str(d["indexdef"]) for d in defs]
    assert any("jobs_finished" in t for t in texts), texts
    assert "status" not in columns
    assert not [t for t in texts if "status" in t], texts


@postgres_only
async def test_a_jobs_way_to_running_and_its_outbox_claim_write_no_index(
    store: SqlStore, db_url: str
) -> None:
    """On Postgres: the updates a job and its outbox row go through before they are SENT
    are HOT updates (counted in the transaction's own statistics)."""
    made = [await store.create_portal_job(portal_job("hot", i), 1000.0) for i in range(5)]
    ids = [intake.job.id for intake in made]
    async with raw_db(db_url) as db:
        assert db._pg is not None
        async with db._pg.transaction():
            await db._pg.execute(
                "UPDATE jobs SET status = 'RUNNING', updated_at = updated_at + 1"
                " WHERE id = ANY($1::text[])",
                ids,
            )
            await db._pg.execute(
                "UPDATE jobs SET lease_until = 1e10, attempts = attempts + 1,"
                " version = version + 1 WHERE id = ANY($1::text[])",
                ids,
            )
            await db._pg.execute(
                "UPDATE relay_outbox SET claimed_until = 1e10, attempt_count = attempt_count + 1,"
                " version = version + 1 WHERE job_id = ANY($1::text[])",
                ids,
            )
            hot = {
                t: await db._pg.fetchval(
                    "SELECT pg_stat_get_xact_tuples_hot_updated(CAST($1 AS regclass))", t
                )
                for t in ("jobs", "relay_outbox")
            }
    assert hot == {"jobs": 10, "relay_outbox": 5}


OURS = {"jobs", "relay_outbox"}


async def _young(store: SqlStore, first: Sequence[str] = ()) -> set[str]:
    """The tables `analyze_young_tables` analyzed, called until jobs and relay_outbox are
    among them: each pooled connection reports its writes' counts to the server within
    about ten seconds of going idle. (Other tables may qualify too: the worker's database
    is emptied between tests, and what earlier tests wrote counts as change.)"""
    analyzed = set(first)

    async def ours_analyzed() -> bool:
        analyzed.update(await store.db.analyze_young_tables())  # type: ignore[attr-defined]
        return analyzed >= OURS

    with contextlib.suppress(AssertionError):  # the callers say what was missing
        await eventually(ours_analyzed, 30, interval=0.2)
    return analyzed


@postgres_only
async def test_a_young_database_has_its_grown_tables_analyzed(store: SqlStore, db_url: str) -> None:
    """Tables that changed by more than their size since their last ANALYZE (a new
    database, before autovacuum's first pass or with autovacuum off) are analyzed; once
    analyzed, the same tables are left alone until they grow again."""
    for i in range(120):
        await store.create_portal_job(portal_job("young", i), 1000.0)
    assert await _young(store) >= OURS
    async with raw_db(db_url) as db:
        analyzed = await db.rows(
            "SELECT relname FROM pg_stat_user_tables"
            " WHERE last_analyze IS NOT NULL AND relname IN ('jobs', 'relay_outbox')"
        )
    assert {r["relname"] for r in analyzed} == OURS
    again = await store.db.analyze_young_tables()  # type: ignore[attr-defined]
    assert not OURS & set(again)


@postgres_only
async def test_the_store_analyzes_young_tables_by_itself_after_its_first_writes(
    store: SqlStore, db_url: str
) -> None:
    db = store.db
    db._analyze_after = [150]  # type: ignore[attr-defined]  # the first of ANALYZE_AFTER_WRITES
    for i in range(150):
        await store.create_portal_job(portal_job("auto", i), 1000.0)
    task = db._analyzing  # type: ignore[attr-defined]
    assert task is not None, "no ANALYZE was started at the threshold"
    await task
    # The writes' counts may not have reached the server when it ran: then it found
    # nothing to do, and a later call does it.
    assert await _young(store, task.result()) >= OURS


@postgres_only
async def test_young_tables_this_role_may_not_analyze_are_left_out(
    store: SqlStore, db_url: str
) -> None:
    """A role that owns neither the tables nor the database (nor is a superuser) would have
    its ANALYZE skipped with a warning: it analyzes nothing and names nothing, while the
    owner still finds the same tables young and analyzes them."""
    for i in range(120):
        await store.create_portal_job(portal_job("guest", i), 1000.0)
    role = f"outboxd_guest_{uuid.uuid4().hex[:8]}"
    async with raw_db(db_url) as db:

        async def counted() -> bool:  # stats reach the server late
            young = await db.scalar(
                "SELECT n_mod_since_analyze FROM pg_stat_user_tables WHERE relname = 'jobs'"
            )
            return bool(young >= 120)

        with contextlib.suppress(AssertionError):  # as before: the test goes on regardless
            await eventually(counted, 30, interval=0.2)
        await db.execute(f'CREATE ROLE "{role}" LOGIN')
    try:
        user, _, host = db_url.partition("://")[2].partition("@")
        guest = PostgresDatabase(f"postgresql://{role}@{host}", 2, 5.0)
        await guest.open()
        try:
            assert await guest.analyze_young_tables() == []
        finally:
            await guest.close()
        assert user != role and await _young(store) >= OURS
    finally:
        async with raw_db(db_url) as db:
            await db.execute(f'DROP ROLE "{role}"')


@postgres_only
async def test_a_relay_round_claims_a_whole_page_of_outbox_rows_in_place(
    store: SqlStore, db_url: str
) -> None:
    """On Postgres: rows that arrived together share pages, and a relay round claims a
    hundred of them in one statement. With rows of a real job's size (ids as the service
    makes them, sealed credentials), every one of those claims is a HOT update: the page
    had room for the new version beside the old (migration 0004; with a fifth of each page
    free, most were not)."""
    n = 100
    for i in range(n):
        job = portal_job("page", i, job_id=new_id(), key=new_id())
        job = dataclasses.replace(job, outbox_id=new_id(), sealed=os.urandom(160))
        await store.create_portal_job(job, 1000.0)
    q = store.q["claim_relay_due"]
    async with raw_db(db_url) as db:
        assert db._pg is not None
        async with db._pg.transaction():
            claimed = await db._pg.fetch(
                q.sql, *q.positional({"now": 2000.0, "limit": n, "claimed_until": 2030.0})
            )
            hot = await db._pg.fetchval(
                "SELECT pg_stat_get_xact_tuples_hot_updated(CAST('relay_outbox' AS regclass))"
            )
    assert len(claimed) == n
    assert hot == n
