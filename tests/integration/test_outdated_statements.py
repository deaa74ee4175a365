"""A migration that adds a column under a running instance (a newer release's, during a
rolling upgrade: docs/upgrades.md#what-the-old-instances-see) outdates the statements its
pool prepared on that table. asyncpg reruns one outside a transaction itself; inside a
transaction the driver runs the transaction once more, on statements prepared anew, so the
caller sees its answer, not an error. Postgres only: SQLite prepares nothing across
transactions that a schema change could outdate."""

from __future__ import annotations

import uuid
from collections.abc import Generator
from typing import Any

from structlog.testing import capture_logs

from outboxd.storage.db import Op, Query, execute, fetch
from outboxd.storage.store import SqlStore
from tests.conftest import postgres_only
from tests.support.db import raw_execute


@postgres_only
async def test_a_transaction_outdated_by_a_migration_runs_again(
    store: SqlStore, db_url: str, backend: str
) -> None:
    table = f"upgrade_probe_{uuid.uuid4().hex[:8]}"
    read = Query("probe_read", f"SELECT * FROM {table} WHERE id = $1", ("id",))
    touch = Query("probe_touch", f"UPDATE {table} SET n = n + 1 WHERE id = $1", ("id",))

    def body() -> Generator[Op, Any, dict[str, Any]]:
        yield execute(touch, {"id": 1})
        (row,) = yield fetch(read, {"id": 1})
        return dict(row)

    await raw_execute(db_url, f"CREATE TABLE {table} (id INTEGER PRIMARY KEY, n INTEGER)")
    try:
        await raw_execute(db_url, f"INSERT INTO {table} VALUES (1, 0)")
        for _ in range(3):  # prepared (and kept) on the pool's connections
            assert await store.db.run(body) in (
                {"id": 1, "n": 1},
                {"id": 1, "n": 2},
                {"id": 1, "n": 3},
            )
        await raw_execute(db_url, f"ALTER TABLE {table} ADD COLUMN note TEXT")

        with capture_logs() as logs:
            row = await store.db.run(body)

        assert row == {"id": 1, "n": 4, "note": None}
        assert [e["event"] for e in logs] == ["prepared_statements_outdated"]
        assert await store.db.run(body) == {"id": 1, "n": 5, "note": None}
    finally:
        await raw_execute(db_url, f"DROP TABLE {table}")
