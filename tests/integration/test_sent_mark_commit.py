"""On Postgres a dispatch batch's SENT marks (`relay_sent_many`) commit without waiting for
the WAL flush, and only they: the pooled connection that ran them commits the next
intake durably again. (Why that is safe: docs/architecture.md, "What bounds dispatch on
Postgres".)"""

from __future__ import annotations

from typing import Any

import pytest

from outboxd.storage.store import SqlStore
from tests.support.db import raw_db
from tests.support.group_crash import portal_job

pytestmark = pytest.mark.parametrize(
    "backend", [pytest.param("postgres", marks=pytest.mark.postgres)]
)


async def _sync_commit(conn: Any) -> object:
    return await conn.fetchval("SELECT current_setting('synchronous_commit')")


async def _marks(store: SqlStore, tag: str) -> dict[str, object]:
    intake = await store.create_portal_job(portal_job(tag, 0), 1000.0)
    assert intake.outbox is not None
    return store._sent_params([(intake.outbox, f"mid-{tag}")], 1001.0)


async def test_the_sent_marks_commit_without_waiting_for_the_flush(
    store: SqlStore, db_url: str
) -> None:
    q = store.q["relay_sent_many"]
    params = await _marks(store, "async")
    async with raw_db(db_url) as db:
        pg = db._pg
        assert pg is not None
        async with pg.transaction():
            rows = await pg.fetch(q.sql, *q.positional(params))
            inside = await _sync_commit(pg)
        after = await _sync_commit(pg)
    assert [r["status"] for r in rows] == ["SENT"]
    assert inside == "off"  # the statement's own transaction commits asynchronously
    assert after == "on"  # and the connection does not keep it


async def test_the_connection_commits_the_next_intake_durably(store: SqlStore, db_url: str) -> None:
    """The store's own path: the statement alone, in its implicit transaction."""
    q = store.q["relay_sent_many"]
    params = await _marks(store, "implicit")
    async with raw_db(db_url) as db:
        pg = db._pg
        assert pg is not None
        rows = await pg.fetch(q.sql, *q.positional(params))
        after = await _sync_commit(pg)
    assert [r["status"] for r in rows] == ["SENT"]
    assert after == "on"
    # Through the store: SENT, and every pooled connection still commits durably.
    intake = await store.create_portal_job(portal_job("pool", 1), 1000.0)
    assert intake.outbox is not None
    done = await store.record_relay_outcome([(intake.outbox, "mid-pool")], [], 1001.0)
    assert [r.status for r in done] == ["SENT"]
    pool = store.db._pool  # type: ignore[attr-defined]
    held = [await pool.acquire() for _ in range(pool.get_size())]  # each one, at once
    try:
        settings = [await _sync_commit(conn) for conn in held]
    finally:
        for conn in held:
            await pool.release(conn)
    assert set(settings) == {"on"}
