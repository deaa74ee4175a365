"""What every part of `SqlStore` shares: the database, its queries, group commit, and
the steps transaction bodies are made of."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping
from typing import Any, TypeVar

from outboxd.storage.db import Database, Op, Query, Row, execute, fetch
from outboxd.storage.group import GroupCommitter
from outboxd.storage.ports import Page, RelayRow, decode_cursor, encode_cursor
from outboxd.storage.store.records import relay_record

T = TypeVar("T")


class StoreBase:
    """Set up by `SqlStore.__init__`; each part (jobs, relay, ...) adds its methods."""

    db: Database
    q: dict[str, Query]
    # Intake and registration: concurrent calls share one commit (see storage/group.py).
    group: GroupCommitter | None
    website_group: GroupCommitter | None

    def _one(self, name: str, params: Mapping[str, Any]) -> Generator[Op, Any, Row | None]:
        rows = yield fetch(self.q[name], params)
        return rows[0] if rows else None

    def _count(self, name: str, params: Mapping[str, Any]) -> Generator[Op, Any, int]:
        n: int = yield execute(self.q[name], params)
        return n

    def _relay_row(self, job_id: str) -> Generator[Op, Any, RelayRow | None]:
        row = yield from self._one("select_latest_relay_for_job", {"job_id": job_id})
        return relay_record(row) if row else None

    def _insert_relay(
        self,
        outbox_id: str,
        kind: str,
        job_id: str | None,
        task_id: str | None,
        dedup_id: str,
        now: float,
        claimed_until: float | None = None,
    ) -> Generator[Op, Any, RelayRow]:
        row = yield from self._one(
            "insert_relay_row",
            {
                "id": outbox_id,
                "kind": kind,
                "job_id": job_id,
                "task_id": task_id,
                "dedup_id": dedup_id,
                "now": now,
                "claimed_until": claimed_until,
                "attempt_count": 0 if claimed_until is None else 1,
            },
        )
        assert row is not None
        return relay_record(row)

    async def _record(
        self,
        name: str,
        params: Mapping[str, Any],
        record: Callable[[Row], T],
        write: bool = True,
    ) -> T | None:
        """The one row block `name` returns, as a record (None without a row): a write
        transaction, or a plain read with `write=False`."""

        def body() -> Generator[Op, Any, T | None]:
            row = yield from self._one(name, params)
            return record(row) if row else None

        return await (self.db.run(body) if write else self.db.read(body))

    async def _changed(self, name: str, params: Mapping[str, Any]) -> bool:
        def body() -> Generator[Op, Any, bool]:
            n = yield from self._count(name, params)
            return n == 1

        return await self.db.run(body)

    async def _page(
        self,
        name: str,
        params: Mapping[str, Any],
        limit: int,
        cursor: str | None,
        record: Callable[[Row], T],
        order_column: str = "created_at",
    ) -> Page[T]:
        """One page of a keyset query over (`order_column`, id); the query reads one row
        more than `limit`, which tells whether another page follows."""
        created, row_id = decode_cursor(cursor)
        bound = {**params, "cursor_created": created, "cursor_id": row_id, "limit": limit + 1}

        def body() -> Generator[Op, Any, list[Row]]:
            rows: list[Row] = yield fetch(self.q[name], bound)
            return rows

        rows = await self.db.read(body)
        last = rows[limit - 1] if len(rows) > limit else None
        nxt = encode_cursor(float(last[order_column]), last["id"]) if last is not None else None
        return Page(items=[record(r) for r in rows[:limit]], next_cursor=nxt)
