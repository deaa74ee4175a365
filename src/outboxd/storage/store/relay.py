"""The relay outbox (`ports.RelayStore`): claims, the outcomes of publishing, redrive.

How a round's SENT marks are written depends on the driver's `Features`: one statement
for the rows, their jobs and their tasks (and the next claim with them), or a row at a
time beside a statement each for the jobs and the tasks.
"""

from __future__ import annotations

import json
from collections.abc import Generator, Iterable, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import msgspec

from outboxd.errors import InvalidState, NotFound
from outboxd.storage.db import Op, execute, execute_each, fetch
from outboxd.storage.ports import NewEvent, Page, RelayFailure, RelayRow, redriven_event
from outboxd.storage.store.base import StoreBase
from outboxd.storage.store.records import relay_record

# A dispatched event's detail, once per row of a round (SQLite): msgspec, not json.dumps.
_encode_detail = msgspec.json.Encoder().encode


def _job_ids(rows: Iterable[RelayRow], failures: Sequence[RelayFailure] = ()) -> list[str | None]:
    """The jobs a recorded outcome touched (their held requests look again)."""
    return [r.job_id for r in rows] + [f.row.job_id for f in failures]


class SqlRelay(StoreBase):
    async def claim_relay_due(self, now: float, limit: int, lease_s: float) -> list[RelayRow]:
        return await self.db.run(
            lambda: self._claim_relay_due(now, limit, lease_s), one_statement=True
        )

    def _claim_relay_due(
        self, now: float, limit: int, lease_s: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        rows = yield fetch(
            self.q["claim_relay_due"],
            {"now": now, "limit": limit, "claimed_until": now + lease_s},
        )
        return sorted((relay_record(r) for r in rows), key=lambda r: r.next_attempt_at)

    async def claim_relay_row(self, outbox_id: str, now: float, lease_s: float) -> RelayRow | None:
        return await self._record(
            "claim_relay_one",
            {"id": outbox_id, "now": now, "claimed_until": now + lease_s},
            relay_record,
        )

    async def claim_relay_rows(
        self, outbox_ids: Sequence[str], now: float, lease_s: float
    ) -> list[RelayRow]:
        if not outbox_ids:
            return []
        ids = json.dumps(sorted(set(outbox_ids)))

        def body() -> Generator[Op, Any, list[RelayRow]]:
            rows = yield fetch(
                self.q["claim_relay_many"], {"ids": ids, "now": now, "claimed_until": now + lease_s}
            )
            return [relay_record(r) for r in rows]

        return await self.db.run(body)

    async def mark_relay_sent(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> list[RelayRow]:
        if not sent:
            return []
        done = await self.db.run(lambda: self._relay_sent(sent, now))
        self.changes.committed(_job_ids(done))
        return done

    async def mark_relay_failed(self, failures: Sequence[RelayFailure], now: float) -> None:
        if failures:
            await self.db.run(lambda: self._relay_failed(failures, now))
            self.changes.committed(_job_ids((), failures))

    async def record_relay_outcome(
        self, sent: Sequence[tuple[RelayRow, str]], failures: Sequence[RelayFailure], now: float
    ) -> list[RelayRow]:
        if not sent and not failures:
            return []

        def body() -> Generator[Op, Any, list[RelayRow]]:
            return (yield from self._relay_outcome(sent, failures, now))

        if self.db.features.sent_in_one_statement and not failures:
            # One statement (`relay_sent_many`: the rows SENT, their jobs RUNNING, their
            # tasks SENT), atomic on its own: one round trip, no BEGIN or COMMIT; cheaper
            # than the relay loop's round statement with nothing to claim
            # (docs/decisions/0004-coalesced-dispatch.md).
            done = await self.db.run(body, one_statement=True)
        elif self.group is not None and self.db.features.outcomes_share_commits:
            # A dispatch batch's outcome shares the next intake group's commit with the
            # intakes waiting for it, when writes are in flight (otherwise it runs at once,
            # alone): a commit is an fsync. Safe to rerun: a row SENT by a first run fails
            # the version match and is left alone.
            done = await self.group.run(body)
        else:
            done = await self.db.run(body)
        self.changes.committed(_job_ids(done, failures))
        return done

    def _relay_outcome(
        self, sent: Sequence[tuple[RelayRow, str]], failures: Sequence[RelayFailure], now: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        done = (yield from self._relay_sent(sent, now)) if sent else []
        if failures:
            yield from self._relay_failed(failures, now)
        return done

    async def record_relay_outcome_and_claim_due(
        self,
        sent: Sequence[tuple[RelayRow, str]],
        failures: Sequence[RelayFailure],
        now: float,
        limit: int,
        lease_s: float,
    ) -> tuple[list[RelayRow], list[RelayRow]]:
        one_statement = self.db.features.sent_in_one_statement and not failures

        def body() -> Generator[Op, Any, tuple[list[RelayRow], list[RelayRow]]]:
            if one_statement:
                return (yield from self._relay_sent_and_claim_due(sent, now, limit, lease_s))
            done = yield from self._relay_outcome(sent, failures, now)
            claimed = (yield from self._claim_relay_due(now, limit, lease_s)) if limit > 0 else []
            return done, claimed

        if not sent and not failures and limit <= 0:
            return [], []
        done, claimed = await self.db.run(body, one_statement=one_statement)
        self.changes.committed(_job_ids(done, failures))
        return done, claimed

    def _relay_sent_and_claim_due(
        self, sent: Sequence[tuple[RelayRow, str]], now: float, limit: int, lease_s: float
    ) -> Generator[Op, Any, tuple[list[RelayRow], list[RelayRow]]]:
        """`sent_in_one_statement`: a round's SENT, its jobs RUNNING and the next claim as
        one statement (a round with failures takes the general path: they are rare, and
        each is a guarded update of its own)."""
        rows = yield fetch(
            self.q["relay_sent_and_claim_due"],
            {
                **self._sent_params(sent, now),
                "limit": max(limit, 0),
                "claimed_until": now + lease_s,
            },
        )
        done: list[RelayRow] = []
        claimed: list[RelayRow] = []
        for r in rows:
            (done if r.pop("sent") else claimed).append(relay_record(r))
        claimed.sort(key=lambda r: r.next_attempt_at)
        return done, claimed

    def _sent_params(self, sent: Sequence[tuple[RelayRow, str]], now: float) -> dict[str, Any]:
        """`sent_in_one_statement`: the rows to mark SENT, each with its claimed version and
        its MessageId, as parallel arrays (`id = ANY(:ids)`, planned as primary-key
        lookups). Otherwise they are marked one by one (`_relay_sent_each`)."""
        return {
            "ids": [r.id for r, _ in sent],
            "versions": [r.version for r, _ in sent],
            "message_ids": [m for _, m in sent],
            "now": now,
            "ev_instance": self.instance,
        }

    def _relay_sent(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        # Rows a newer holder (or a redrive) owns now fail the version match
        # and are left alone.
        if self.db.features.sent_in_one_statement:
            rows = yield fetch(self.q["relay_sent_many"], self._sent_params(sent, now))
            # The same statement set the jobs RUNNING and the tasks SENT.
            return [relay_record(r) for r in rows]
        done = yield from self._relay_sent_each(sent, now)
        job_ids = [r.job_id for r in done if r.job_id is not None]
        task_ids = [r.task_id for r in done if r.task_id is not None]
        if job_ids:
            yield execute(
                self.q["jobs_running_if_queued"], {"ids": json.dumps(job_ids), "now": now}
            )
            # Each job's `dispatched` event, as the job is after the statement above.
            yield execute_each(
                self.q["insert_job_event_as_is"],
                [
                    {
                        "job_id": r.job_id,
                        "ev_at": now,
                        "ev_type": "dispatched",
                        "ev_instance": self.instance,
                        "ev_detail": _encode_detail(
                            {"messageId": r.queue_message_id, "outboxId": r.id}
                        ).decode(),
                    }
                    for r in done
                    if r.job_id is not None
                ],
            )
        if task_ids:
            yield execute(self.q["tasks_sent"], {"ids": json.dumps(task_ids)})
        return done

    def _relay_sent_each(
        self, sent: Sequence[tuple[RelayRow, str]], now: float
    ) -> Generator[Op, Any, list[RelayRow]]:
        """Each row SENT by its own execution of one statement. The rows as committed are
        the claimed ones with what the update set (every update of the outbox moves
        `version`, so a row the guard let through had not changed since its claim). Only
        when the guard refused some are the rows read back, to tell which."""
        changed = yield execute_each(
            self.q["relay_sent_one"],
            [{"id": r.id, "v": r.version, "m": m, "now": now} for r, m in sent],
        )
        marked = [
            replace(
                r,
                status="SENT",
                queue_message_id=m,
                sent_at=now,
                claimed_until=None,
                last_error=None,
                version=r.version + 1,
            )
            for r, m in sent
        ]
        if changed == len(marked):
            return marked
        done = []
        for r in marked:
            row = yield from self._one("select_relay_row", {"id": r.id})
            if row is not None and (row["status"], row["version"], row["queue_message_id"]) == (
                "SENT",
                r.version,
                r.queue_message_id,
            ):
                done.append(r)
        return done

    def _relay_failed(
        self, failures: Sequence[RelayFailure], now: float
    ) -> Generator[Op, Any, None]:
        for f in failures:
            updated = yield from self._one(
                "relay_failed",
                {
                    "id": f.row.id,
                    "version": f.row.version,
                    "status": "DEAD" if f.dead else "RETRYABLE_FAILED",
                    "next_attempt_at": f.next_attempt_at,
                    "last_error": f.error[:1000],
                    "refund": 0 if f.counted else 1,
                },
            )
            if updated is None:
                continue
            if not f.dead:
                if f.row.job_id is not None:
                    # The job is unchanged (QUEUED, the row backs off): its event is read as is.
                    yield execute(
                        self.q["insert_job_event_as_is"],
                        {
                            **self._event_params(
                                NewEvent("dispatch_failed", now, {"error": f.error[:300]})
                            ),
                            "job_id": f.row.job_id,
                        },
                    )
                continue
            if f.row.job_id is not None and f.job_error is not None:
                code, message = f.job_error
                yield from self._job_change(
                    "job_dead",
                    {
                        "id": f.row.job_id,
                        "error_code": code,
                        "error_message": message,
                        "now": now,
                    },
                    NewEvent("dead", now, {"code": code}),
                )
            elif f.row.task_id is not None:
                yield execute(
                    self.q["task_dead"],
                    {"id": f.row.task_id, "error": f.error[:1000], "now": now},
                )

    async def get_relay_row(self, outbox_id: str) -> RelayRow | None:
        return await self._record("select_relay_row", {"id": outbox_id}, relay_record, write=False)

    async def redrive_relay_row(
        self, outbox_id: str, now: float, by: str | None = None
    ) -> RelayRow:
        def body() -> Generator[Op, Any, RelayRow]:
            before = yield from self._one("select_relay_row", {"id": outbox_id})
            if before is None:
                raise NotFound(f"outbox row {outbox_id}")
            if before["job_id"] is not None:
                latest = yield from self._relay_row(before["job_id"])
                if latest is not None and latest.id != outbox_id:
                    # The job was redriven whole since: reviving this row too
                    # would publish the job twice.
                    raise InvalidState("the job has a newer outbox row; redrive the job instead")
            row = yield from self._one("relay_redrive", {"id": outbox_id, "now": now})
            if row is None:
                raise InvalidState(f"outbox row is {before['status']}, not DEAD")
            relay = relay_record(row)
            if relay.job_id is not None:
                yield from self._job_change(
                    "job_requeue_if_dead",
                    {"id": relay.job_id, "now": now},
                    redriven_event(now, relay.id, by),
                )
            elif relay.task_id is not None:
                yield execute(self.q["task_requeue"], {"id": relay.task_id})
            return relay

        relay = await self.db.run(body)
        self.changes.committed((relay.job_id,))
        return relay

    async def list_relay_rows(
        self, status: str | None, limit: int, cursor: str | None
    ) -> Page[RelayRow]:
        # A status other than SENT is read from the index of the rows not sent.
        name = "list_relay" if status in (None, "SENT") else "list_relay_unsent"
        return await self._page(name, {"status": status}, limit, cursor, relay_record)

    async def relay_rows_for_job(self, job_id: str, limit: int) -> list[RelayRow]:
        def body() -> Generator[Op, Any, list[RelayRow]]:
            rows = yield fetch(self.q["list_relay_for_job"], {"job_id": job_id, "limit": limit})
            return [relay_record(r) for r in rows]

        return await self.db.read(body)

    async def republish_unfinished(self, lost_before: float) -> int:
        """SENT rows of unfinished jobs and tasks, sent before `lost_before`, back to PENDING.

        For a queue that lost its messages: rows sent to the recreated queue keep theirs.
        """
        return await self.db.run(
            partial(self._count, "relay_republish_unfinished", {"now": lost_before})
        )
