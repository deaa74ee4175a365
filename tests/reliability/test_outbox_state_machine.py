"""The outbox state transitions as a hypothesis state machine, against the real SqlStore
on SQLite and on Postgres.

Rules play every actor the daemon has, including the ones that die: the API enqueues
(and replays), relays claim / publish / fail / die holding a lease, SQS delivers at
least once (a relay that dies after publishing still delivered its message), consumers
start / succeed / fail / retry / give up / die holding a job lease / heartbeat, the
claimer takes work rows and completes / fails / gives back / dies, admins redrive; a
fake clock runs past leases and backoffs.

After every step: statuses are legal, versions only grow, a SENT row has its message
id, a job succeeds at most once and its result is never overwritten, a category is
never rewritten, and nothing unfinished is stranded (every unfinished job has an
eligible outbox row, a message on the queue or a live holder). At the end every actor
is made to finish (`teardown` drains): every row is terminal, none lost, none applied
twice.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from outboxd.errors import InvalidState
from outboxd.services.retries import publish_failure
from outboxd.storage.ports import JobRecord, RelayRow
from outboxd.storage.store import SqlStore, open_store
from outboxd.storage.website_ports import WorkRow
from tests.support import postgres as pg
from tests.support.db import RawDb
from tests.support.ops import placeholder_job

T = TypeVar("T")

MAX_ATTEMPTS = 2  # relay.max_attempts
RELAY_LEASE_S = 30.0
JOB_LEASE_S = 5.0  # the consumer's job lease (its visibility timeout)
RETRY_DELAY_S = 3.0  # claimer.retry_delay_s
PROCESSING_TIMEOUT_S = 10.0  # claimer.processing_timeout_s
CATEGORIES = ("news", "finance", "education")
JOB_STATUSES = {"QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD"}
RELAY_STATUSES = {"PENDING", "SENT", "RETRYABLE_FAILED", "DEAD", "SUPERSEDED"}
WORK_STATUSES = {"PENDING", "PROCESSING", "COMPLETED", "FAILED"}
# One action of an actor, drawing what it needs.
Act = Callable[[st.DataObject], None]

MAX_EXAMPLES = int(os.environ.get("OUTBOXD_SM_EXAMPLES", "60"))
STEPS = int(os.environ.get("OUTBOXD_SM_STEPS", "50"))


@dataclass(frozen=True)
class Message:
    """A message on the jobs queue (what the relay published)."""

    job_id: str
    outbox_id: str
    message_id: str


class OutboxMachine(RuleBasedStateMachine):
    db_url: ClassVar[str]
    base_dir: ClassVar[Path]

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.now = 1_700_000_000.0
        url = self.db_url
        if url.startswith("sqlite:///"):
            url = f"sqlite:///{self.base_dir / f'sm-{uuid.uuid4().hex[:10]}.db'}"
        else:
            pg.truncate(url)
        self.store: SqlStore = self.run(open_store(url, self.base_dir, 3, 5.0))
        self.run(self.store.db.migrate())
        self.raw = self.run(RawDb(url).open())
        # The model: who holds what, and what happened.
        self.job_ids: list[str] = []
        self.keys: dict[str, str] = {}  # idempotency key -> job id
        self.relay_ids: list[str] = []
        self.relay_claims: list[RelayRow] = []
        self.messages: list[Message] = []
        self.runs: list[JobRecord] = []
        self.successes: Counter[str] = Counter()
        self.results: dict[str, dict[str, Any]] = {}
        self.finished: dict[str, str] = {}  # job id -> SUCCEEDED / FAILED (never change)
        self.site_ids: list[str] = []
        self.domains: list[str] = []
        self.work_claims: list[WorkRow] = []
        self.categories: dict[str, str] = {}  # website id -> the first category stored
        self.versions: dict[tuple[str, str], int] = {}
        self._seq = 0

    def _id(self, prefix: str) -> str:
        """Deterministic ids: hypothesis replays an example exactly (ties in the claim
        order are broken by id)."""
        self._seq += 1
        return f"{prefix}-{self._seq:06d}"

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self.loop.run_until_complete(coro)

    def teardown(self) -> None:
        try:
            self.drain()
        finally:
            self.run(self.raw.close())
            self.run(self.store.close())
            self.loop.close()

    # ------------------------------------------------------------------ API

    @initialize(jobs=st.integers(1, 4), sites=st.integers(0, 2))
    def some_work_to_start_with(self, jobs: int, sites: int) -> None:
        for _ in range(jobs):
            self.enqueue(replay=False)
        for _ in range(sites):
            self.register_website(replay=False)

    @rule(replay=st.booleans())
    def enqueue(self, replay: bool) -> None:
        key = sorted(self.keys)[len(self.keys) // 2] if replay and self.keys else self._id("key")
        new = placeholder_job(self._id("job"), self._id("out"), key)
        self.now += 0.001  # distinct creation times: a deterministic claim order
        intake = self.run(self.store.create_portal_job(new, self.now))
        if key in self.keys:
            assert not intake.created and intake.job.id == self.keys[key]
            return
        assert intake.created and intake.job.status == "QUEUED"
        assert intake.outbox is not None and intake.outbox.status == "PENDING"
        self.keys[key] = new.job_id
        self.job_ids.append(new.job_id)
        self.relay_ids.append(new.outbox_id)

    @rule(dt=st.sampled_from([0.5, 2.0, JOB_LEASE_S + 0.1, PROCESSING_TIMEOUT_S + 0.1, 40.0]))
    def advance_clock(self, dt: float) -> None:
        self.now += dt

    # ------------------------------------------------------------------ actors
    # One rule per actor, the action drawn inside: with two dozen separate rules most
    # steps of a short run would go to rules whose precondition fails; this way every
    # step does something, and long sequences (failed publishes, then a redrive) come up
    # often. An action that needs a holder when there is none claims first, as the real
    # actor does (`act`). The happy path comes first in each list (hypothesis favours it).

    @rule(
        action=st.sampled_from(
            ["publish_ok", "publish_fails", "publish_then_die", "dies", "claim_one", "claim_due"]
        ),
        data=st.data(),
    )
    def relay(self, action: str, data: st.DataObject) -> None:
        if action == "claim_one" and self.relay_ids:
            self.relay_claim_one(data)
            return
        acts: dict[str, Act] = {
            "publish_ok": self.publish_ok,
            "publish_then_die": self.publish_then_die,
            "publish_fails": self.publish_fails,
            "dies": self.relay_dies,
        }
        self.act(action, self.relay_claims, self.relay_claim_due, acts, data)

    @precondition(lambda self: self.job_ids)
    @rule(action=st.sampled_from(["redrive_relay_row", "redrive_job"]), data=st.data())
    def admin(self, action: str, data: st.DataObject) -> None:
        getattr(self, action)(data)

    @rule(
        action=st.sampled_from(
            ["succeed", "receive", "retry", "die", "release", "heartbeat", "give_up", "fail"]
        ),
        data=st.data(),
    )
    def consumer(self, action: str, data: st.DataObject) -> None:
        acts: dict[str, Act] = {
            "succeed": self.consumer_succeeds,
            "fail": self.consumer_fails,
            "retry": self.consumer_retries_later,
            "give_up": self.consumer_gives_up,
            "die": self.consumer_dies,
            "heartbeat": self.consumer_heartbeat,
            "release": self.consumer_releases,
        }
        self.act(action, self.runs, self.consumer_receives, acts, data)

    @rule(action=st.sampled_from(["complete", "claim", "fail", "give_back", "die"]), data=st.data())
    def claimer(self, action: str, data: st.DataObject) -> None:
        acts: dict[str, Act] = {
            "complete": self.claimer_completes,
            "fail": self.claimer_fails,
            "give_back": self.claimer_gives_back,
            "die": self.claimer_dies,
        }
        self.act(action, self.work_claims, self.claimer_claims, acts, data)

    def act(
        self,
        action: str,
        held: Sequence[object],
        claim: Act,
        acts: dict[str, Act],
        data: st.DataObject,
    ) -> None:
        """One step of an actor that holds `held`: an action not in `acts` is its claim; any
        other claims first when the actor holds nothing, as the real one does, then acts
        on what it holds (nothing, if that claim found nothing)."""
        if action not in acts or not held:
            claim(data)
        if action in acts and held:
            acts[action](data)

    # ------------------------------------------------------------------ relay

    def relay_claim_due(self, data: st.DataObject) -> None:
        limit = data.draw(st.integers(1, 4))
        rows = self.run(self.store.claim_relay_due(self.now, limit, RELAY_LEASE_S))
        for r in rows:
            assert r.status in ("PENDING", "RETRYABLE_FAILED")
            assert r.claimed_until == self.now + RELAY_LEASE_S
        self.relay_claims.extend(rows)

    def relay_claim_one(self, data: st.DataObject) -> None:
        outbox_id = data.draw(st.sampled_from(self.relay_ids))
        row = self.run(self.store.claim_relay_row(outbox_id, self.now, RELAY_LEASE_S))
        if row is not None:
            self.relay_claims.append(row)

    def _take_claim(self, data: st.DataObject) -> RelayRow:
        i = data.draw(st.integers(0, len(self.relay_claims) - 1))
        return self.relay_claims.pop(i)

    def publish_ok(self, data: st.DataObject) -> None:
        row = self._take_claim(data)
        message_id = self._id("msg")
        assert row.job_id is not None
        # On SQS whatever the database says next: a stale holder published too.
        self.messages.append(Message(row.job_id, row.id, message_id))
        marked = self.run(self.store.mark_relay_sent([(row, message_id)], self.now))
        for m in marked:
            assert m.status == "SENT" and m.queue_message_id == message_id
        if not marked:
            event("stale relay refused")

    def publish_then_die(self, data: st.DataObject) -> None:
        """after_publish_before_sent: the message is out, the row never marked."""
        row = self._take_claim(data)
        assert row.job_id is not None
        self.messages.append(Message(row.job_id, row.id, self._id("msg")))

    def publish_fails(self, data: st.DataObject) -> None:
        row = self._take_claim(data)
        dead = row.attempt_count >= MAX_ATTEMPTS
        if dead:
            event("relay row dead")
        failure = publish_failure(row, "SQS down", self.now + 1.0, dead)
        self.run(self.store.mark_relay_failed([failure], self.now))

    def relay_dies(self, data: st.DataObject) -> None:
        self._take_claim(data)  # the lease runs out by the clock

    def _redrive_target(self, data: st.DataObject, table: str, every: list[str]) -> str:
        """Mostly a DEAD row of `table` (the redrive an operator makes), sometimes any of
        `every` (409 C11)."""
        dead = [r["id"] for r in self._rows(f"SELECT id FROM {table} WHERE status = 'DEAD'")]
        use_dead = bool(dead) and data.draw(st.booleans())
        pool: list[str] = dead if use_dead else every
        return data.draw(st.sampled_from(sorted(pool)))

    def redrive_relay_row(self, data: st.DataObject) -> None:
        outbox_id = self._redrive_target(data, "relay_outbox", self.relay_ids)
        before = self.run(self.store.get_relay_row(outbox_id))
        assert before is not None
        assert before.job_id is not None
        latest = self.run(self.store.latest_relay_row_for_job(before.job_id))
        superseded = latest is not None and latest.id != outbox_id
        try:
            row = self.run(self.store.redrive_relay_row(outbox_id, self.now))
        except InvalidState:
            # Not DEAD, or the job was redriven whole since (a second live row would
            # publish it twice).
            assert before.status != "DEAD" or superseded
            return
        assert before.status == "DEAD" and not superseded
        assert (row.status, row.attempt_count) == ("PENDING", 0)
        event("relay row redriven")

    def redrive_job(self, data: st.DataObject) -> None:
        job_id = self._redrive_target(data, "jobs", self.job_ids)
        before = self.run(self.store.get_job(job_id))
        assert before is not None
        outbox_id = self._id("out")
        try:
            job = self.run(self.store.redrive_job(job_id, outbox_id, self.now))
        except InvalidState:
            assert before.status != "DEAD" or before.sealed is None
            return
        assert before.status == "DEAD" and job.status == "QUEUED"
        # One failure, one dead letter: the redrive closed the job's DEAD rows.
        left = self._rows(
            "SELECT id FROM relay_outbox WHERE job_id = ? AND status = 'DEAD'", job_id
        )
        assert left == [], "a redriven job kept a DEAD outbox row"
        event("job redriven")
        self.relay_ids.append(outbox_id)

    # ------------------------------------------------------------------ consumer

    def consumer_receives(self, data: st.DataObject) -> None:
        if not self.messages:
            return  # nothing published yet
        msg = data.draw(st.sampled_from(self.messages))
        job = self.run(self.store.get_job(msg.job_id))
        assert job is not None
        if job.terminal:
            self.messages.remove(msg)  # deleted without running anything
            return
        run = self.run(self.store.start_job_run(msg.job_id, self.now, JOB_LEASE_S))
        if run is not None:
            assert run.status == "RUNNING" and run.lease_until == self.now + JOB_LEASE_S
            assert not any(
                r.id == run.id and r.lease_until and r.lease_until > self.now for r in self.runs
            ), "two live holders of one job"
            self.runs.append(run)

    def _take_run(self, data: st.DataObject) -> JobRecord:
        i = data.draw(st.integers(0, len(self.runs) - 1))
        return self.runs.pop(i)

    def _delete_message_of(self, job_id: str) -> None:
        for m in self.messages:
            if m.job_id == job_id:
                self.messages.remove(m)
                return

    def consumer_succeeds(self, data: st.DataObject) -> None:
        run = self._take_run(data)
        result = {"student": run.id, "run": self._id("run")}
        done = self.run(self.store.finish_job(run, "SUCCEEDED", self.now, result=result))
        if done is None:
            event("stale consumer refused")
            return  # a newer holder or a terminal state won: the message comes back
        assert done.status == "SUCCEEDED" and done.sealed is None
        self.successes[run.id] += 1
        self.results[run.id] = result
        self.finished[run.id] = "SUCCEEDED"
        self._delete_message_of(run.id)

    def consumer_fails(self, data: st.DataObject) -> None:
        run = self._take_run(data)
        error = ("PORTAL_AUTH_FAILED", "wrong password")
        done = self.run(self.store.finish_job(run, "FAILED", self.now, error=error))
        if done is not None:
            self.finished[run.id] = "FAILED"
            self._delete_message_of(run.id)

    def consumer_retries_later(self, data: st.DataObject) -> None:
        run = self._take_run(data)
        self.run(self.store.job_retry_later(run, ("PORTAL_UNAVAILABLE", "503"), self.now))

    def consumer_gives_up(self, data: st.DataObject) -> None:
        """The last allowed receive failed: DEAD, and the message goes to the DLQ."""
        run = self._take_run(data)
        self.run(self.store.mark_job_dead(run.id, ("RETRIES_EXHAUSTED", "x"), self.now))
        self._delete_message_of(run.id)

    def consumer_dies(self, data: st.DataObject) -> None:
        self._take_run(data)  # its lease runs out; the message comes back

    def consumer_heartbeat(self, data: st.DataObject) -> None:
        run = data.draw(st.sampled_from(self.runs))
        self.run(self.store.extend_job_lease(run, self.now + JOB_LEASE_S))

    def consumer_releases(self, data: st.DataObject) -> None:
        """Shutdown past its deadline: the lease is given back, the message visible."""
        run = self._take_run(data)
        self.run(self.store.release_job_lease(run, self.now))

    # ------------------------------------------------------------------ claimer

    @rule(replay=st.booleans())
    def register_website(self, replay: bool) -> None:
        domain = self.domains[0] if replay and self.domains else f"{self._id('w')}.example"
        site_id, work_id = self._id("site"), self._id("work")
        self.now += 0.001
        website, created = self.run(
            self.store.register_website(site_id, work_id, domain, None, self.now)
        )
        assert created == (domain not in self.domains)
        if created:
            assert website.work_status == "PENDING"
            self.domains.append(domain)
            self.site_ids.append(site_id)

    def claimer_claims(self, data: st.DataObject) -> None:
        row = self.run(self.store.claim_work(self.now, RETRY_DELAY_S, PROCESSING_TIMEOUT_S))
        if row is not None:
            assert row.status == "PROCESSING" and row.attempted_at == self.now
            self.work_claims.append(row)

    def _take_work(self, data: st.DataObject) -> WorkRow:
        i = data.draw(st.integers(0, len(self.work_claims) - 1))
        return self.work_claims.pop(i)

    def claimer_completes(self, data: st.DataObject) -> None:
        category = data.draw(st.sampled_from(CATEGORIES))
        # Deliberately without the claimer's "already has a category" check: the store's
        # guards alone must keep a stale holder from rewriting anything.
        row = self._take_work(data)
        if self.run(self.store.complete_work(row, category, self.now)):
            self.categories.setdefault(row.website_id, category)
        else:
            event("stale claimer refused")

    def claimer_fails(self, data: st.DataObject) -> None:
        final = data.draw(st.booleans())
        row = self._take_work(data)
        self.run(self.store.fail_work(row, "provider 500", final, self.now))

    def claimer_gives_back(self, data: st.DataObject) -> None:
        """A 429: the row goes back without spending the attempt."""
        row = self._take_work(data)
        if self.run(self.store.give_back_work(row)):
            after = self._rows("SELECT * FROM work_outbox WHERE id = ?", row.id)[0]
            assert after["status"] == "PENDING"
            assert after["attempt_count"] == row.attempt_count - 1

    def claimer_dies(self, data: st.DataObject) -> None:
        self._take_work(data)  # reclaimable after the processing timeout

    # ------------------------------------------------------------------ invariants

    def _rows(self, sql: str, *args: Any) -> list[dict[str, Any]]:
        return self.run(self.raw.rows(sql, *args))

    @invariant()
    def rows_are_sane(self) -> None:
        jobs = self._rows("SELECT * FROM jobs")
        relay = self._rows("SELECT * FROM relay_outbox")
        work = self._rows("SELECT * FROM work_outbox")
        sites = self._rows("SELECT * FROM websites")
        assert len(jobs) == len(self.job_ids), "a job row vanished (or appeared)"
        assert len(relay) == len(self.relay_ids)
        assert len(sites) == len(work) == len(self.site_ids)
        for table, rows in (("jobs", jobs), ("relay", relay), ("work", work), ("site", sites)):
            for r in rows:
                key = (table, r["id"])
                assert int(r["version"]) >= self.versions.get(key, 0), f"{key} version went back"
                self.versions[key] = int(r["version"])
        for j in jobs:
            assert j["status"] in JOB_STATUSES
            assert self.successes[j["id"]] <= 1, "a job succeeded twice"
            if j["id"] in self.finished:
                assert j["status"] == self.finished[j["id"]], "a finished job changed state"
            if j["id"] in self.results:
                assert _json(j["result"]) == self.results[j["id"]], "a result was overwritten"
        for r in relay:
            assert r["status"] in RELAY_STATUSES
            if r["status"] == "SENT":
                assert r["queue_message_id"] and r["sent_at"] is not None
            if r["status"] in ("SENT", "DEAD", "SUPERSEDED"):
                assert r["claimed_until"] is None
            if r["status"] in ("DEAD", "SUPERSEDED"):
                assert r["attempt_count"] >= MAX_ATTEMPTS
        for w in work:
            assert w["status"] in WORK_STATUSES
            if w["status"] == "PROCESSING":
                assert w["attempt_count"] >= 1
        for s in sites:
            first = self.categories.get(s["id"])
            assert s["category"] == first, "a category was rewritten (or stored unseen)"
        for w in work:
            if w["status"] == "COMPLETED":
                site = next(s for s in sites if s["id"] == w["website_id"])
                assert site["category"] is not None, "COMPLETED without a category"
        self._nothing_stranded(jobs, relay)

    def _nothing_stranded(self, jobs: list[dict[str, Any]], relay: list[dict[str, Any]]) -> None:
        eligible = {r["job_id"] for r in relay if r["status"] in ("PENDING", "RETRYABLE_FAILED")}
        on_queue = {m.job_id for m in self.messages}
        held = {r.id for r in self.runs}
        for j in jobs:
            if j["status"] in ("QUEUED", "RUNNING"):
                assert j["id"] in eligible | on_queue | held, (
                    f"job {j['id']} is {j['status']} with no eligible outbox row, "
                    "no message and no holder: it would never finish"
                )

    # ------------------------------------------------------------------ quiescence

    def drain(self) -> None:
        """Every holder dies, time runs on, and the survivors finish everything."""
        self.relay_claims.clear()
        self.runs.clear()
        self.work_claims.clear()
        for _ in range(30):
            self.now += 1000.0
            progress = False
            rows = self.run(self.store.claim_relay_due(self.now, 100, RELAY_LEASE_S))
            for row in rows:
                assert row.job_id is not None
                mid = self._id("msg")
                self.messages.append(Message(row.job_id, row.id, mid))
                self.run(self.store.mark_relay_sent([(row, mid)], self.now))
                progress = True
            for msg in list(self.messages):
                progress = True
                job = self.run(self.store.get_job(msg.job_id))
                assert job is not None
                if not job.terminal:
                    run = self.run(self.store.start_job_run(msg.job_id, self.now, JOB_LEASE_S))
                    assert run is not None, "an unfinished job could not be started"
                    result = {"student": run.id, "run": "drain"}
                    done = self.run(self.store.finish_job(run, "SUCCEEDED", self.now, result))
                    assert done is not None
                    self.successes[run.id] += 1
                    self.results[run.id] = result
                    self.finished[run.id] = "SUCCEEDED"
                self.messages.remove(msg)
            while (
                work := self.run(
                    self.store.claim_work(self.now, RETRY_DELAY_S, PROCESSING_TIMEOUT_S)
                )
            ) is not None:
                progress = True
                if self.run(self.store.complete_work(work, "news", self.now)):
                    self.categories.setdefault(work.website_id, "news")
            if not progress:
                break
        self.rows_are_sane()
        jobs = self._rows("SELECT id, status FROM jobs")
        relay = self._rows("SELECT id, status FROM relay_outbox")
        work_rows = self._rows("SELECT id, status FROM work_outbox")
        assert all(j["status"] in ("SUCCEEDED", "FAILED", "DEAD") for j in jobs), jobs
        assert all(r["status"] in ("SENT", "DEAD", "SUPERSEDED") for r in relay), relay
        assert all(w["status"] in ("COMPLETED", "FAILED") for w in work_rows), work_rows
        assert not self.messages
        assert all(n == 1 for n in self.successes.values())


def _json(text: Any) -> Any:
    import json

    return json.loads(text) if text is not None else None


def machine_for(db_url: str, base_dir: Path) -> type[RuleBasedStateMachine]:
    return type(
        "OutboxMachineOn" + ("Postgres" if db_url.startswith("postgres") else "Sqlite"),
        (OutboxMachine,),
        {"db_url": db_url, "base_dir": base_dir},
    )


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_outbox_state_machine(db_url: str, tmp_path: Path) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine_for(db_url, tmp_path),
        settings=settings(
            max_examples=MAX_EXAMPLES,
            stateful_step_count=STEPS,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
            database=None,
        ),
    )
