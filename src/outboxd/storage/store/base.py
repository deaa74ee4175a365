"""What every part of `SqlStore` shares: the database, its queries, group commit, and
the steps transaction bodies are made of."""

from __future__ import annotations

from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any, TypeVar

from outboxd.storage.changes import JobChanges
from outboxd.storage.db import Database, Op, Query, Row, execute, execute_each, fetch
from outboxd.storage.group import GroupCommitter
from outboxd.storage.ports import (
    JobRecord,
    NewEvent,
    Page,
    RelayRow,
    decode_cursor,
    encode_cursor,
)
from outboxd.storage.store.records import dump, inserted_relay_row, job_record, relay_record

T = TypeVar("T")

# The lock spaces of the per-user caps (`cap_lock`'s first key): each cap's users take
# turns on their own, never with the other cap's (arbitrary constants, "obj1" and "obw1").
JOBS_CAP = 0x6F626A31
WEBSITES_CAP = 0x6F627731
# The status of the held events a change carries: the run's, while it ran.
HELD_STATUS = "RUNNING"


class StoreBase:
    """Set up by `SqlStore.__init__`; each part (jobs, relay, ...) adds its methods."""

    db: Database
    q: dict[str, Query]
    # Intake and registration: concurrent calls share one commit (see storage/group.py).
    group: GroupCommitter | None
    website_group: GroupCommitter | None
    # Names this daemon in the events it records (daemon.instance_id).
    instance: str
    # Told after each commit that changed a job: the requests held on it look again.
    changes: JobChanges

    def _one(self, name: str, params: Mapping[str, Any]) -> Generator[Op, Any, Row | None]:
        rows = yield fetch(self.q[name], params)
        return rows[0] if rows else None

    def _count(self, name: str, params: Mapping[str, Any]) -> Generator[Op, Any, int]:
        n: int = yield execute(self.q[name], params)
        return n

    def _cap_lock(self, cap: int, user_id: str) -> Generator[Op, Any, None]:
        """Where writes run side by side, the user's lock for `cap`, held to the commit:
        the user's other writes under that cap wait here, so what the body counts next is
        what they committed. Nothing where one write runs at a time (SQLite)."""
        if self.db.features.concurrent_writes:
            yield execute(self.q["cap_lock"], {"cap": cap, "user_id": user_id})

    def _event_params(self, event: NewEvent) -> dict[str, Any]:
        return {
            "ev_at": event.at,
            "ev_type": event.type,
            "ev_instance": self.instance,
            "ev_detail": dump(event.detail),
        }

    def _job_change(
        self,
        name: str,
        params: Mapping[str, Any],
        event: NewEvent,
        held: Sequence[NewEvent] = (),
    ) -> Generator[Op, Any, Row | None]:
        """The job row block `name` changes and returns (None: its guard refused), with
        `event` in its timeline: in the same statement where the driver can
        (`events_in_statement`: the block `<name>_ev`), else right after it.

        `held`: events of the run that happened before this change and were not written
        yet (progress steps a worker held, workers/progress.py), recorded before `event`
        in the same statement or transaction, as RUNNING (a change that carries them is
        guarded on RUNNING) with the run's attempt."""
        ev = self._event_params(event)
        if held and self.db.features.events_in_statement:
            # One statement still: the events as parallel arrays (the block `<name>_evs`).
            each = [*held, event]
            arrays = {
                "ev_ats": [e.at for e in each],
                "ev_types": [e.type for e in each],
                "ev_statuses": [HELD_STATUS] * len(held) + [None],
                "ev_details": [dump(e.detail) for e in each],
                "ev_instance": self.instance,
            }
            return (yield from self._one(f"{name}_evs", {**params, **arrays}))
        if self.db.features.events_in_statement:
            return (yield from self._one(f"{name}_ev", {**params, **ev}))
        row = yield from self._one(name, params)
        if row is not None:
            run = {"ev_attempt": row["attempts"], "job_id": row["id"]}
            earlier = [{**self._event_params(e), **run, "ev_status": HELD_STATUS} for e in held]
            last = {**ev, **run, "ev_status": row["status"]}
            if earlier:
                yield execute_each(self.q["insert_job_event"], [*earlier, last])
            else:
                yield execute(self.q["insert_job_event"], last)
        return row

    async def _job_write(
        self,
        name: str,
        params: Mapping[str, Any],
        event: NewEvent,
        held: Sequence[NewEvent] = (),
    ) -> JobRecord | None:
        """`_job_change` as a transaction of its own (one statement where the event is part
        of it); the job as changed, None when the guard refused."""

        def body() -> Generator[Op, Any, JobRecord | None]:
            row = yield from self._job_change(name, params, event, held)
            return job_record(row) if row is not None else None

        job = await self.db.run(body, one_statement=self.db.features.events_in_statement)
        if job is not None:
            self.changes.committed((job.id,))
        return job

    def _relay_row(self, job_id: str) -> Generator[Op, Any, RelayRow | None]:
        row = yield from self._one("select_latest_relay_for_job", {"job_id": job_id})
        return relay_record(row) if row else None

    def _insert_relay(self, params: Mapping[str, Any]) -> Generator[Op, Any, RelayRow]:
        """The outbox row of `records.new_relay_params`, inserted."""
        yield execute(self.q["insert_relay_row"], params)
        return inserted_relay_row(params)

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
