"""`Database.run(body, one_statement=True)`: Postgres runs the body's one statement
without BEGIN and COMMIT (the statement is its own transaction) and refuses a second
one before it runs; SQLite runs the body as any other write transaction."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from outboxd.storage.db import Op, fetch
from outboxd.storage.store import SqlStore
from tests.support.ops import insert_portal_job


async def test_a_one_statement_body_runs_alone_and_a_second_statement_is_refused(
    store: SqlStore,
) -> None:
    _, first = await insert_portal_job(store, 50.0)
    _, second = await insert_portal_job(store, 51.0)
    claim = store.q["claim_relay_one"]

    def one(outbox_id: str) -> Generator[Op, Any, int]:
        rows = yield fetch(claim, {"id": outbox_id, "now": 100.0, "claimed_until": 110.0})
        return len(rows)

    def two() -> Generator[Op, Any, int]:
        n = yield from one(first)
        m = yield from one(second)
        return n + m

    assert await store.db.run(lambda: one(first), one_statement=True) == 1
    if store.backend == "postgres":
        with pytest.raises(RuntimeError, match="second statement"):
            await store.db.run(two, one_statement=True)
        row = await store.get_relay_row(second)
        assert row is not None and row.claimed_until is None  # never ran
    else:
        assert await store.db.run(two, one_statement=True) == 1  # `first` is leased now
        row = await store.get_relay_row(second)
        assert row is not None and row.claimed_until == 110.0
