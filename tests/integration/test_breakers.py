"""The portal's bad days (docs/contract.md#outside-systems-bad-days,
docs/decisions/0033-dependency-breakers.md), on both backends: an outage opens the
cluster's breaker after `open_after` runs in a row and from then on spends nothing (no
attempt, no receive toward the DLQ, no FAILED, no DEAD); while it is down one probe at a
time calls the portal; when the portal answers again every waiting job runs; an
operator's pause holds work on every instance and survives a restart."""

from __future__ import annotations

import time
from typing import Any

from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.services.breakers import Breakers
from outboxd.storage.store import SqlStore
from tests.support.consumer_rig import BROKEN_PASSWORD, BROKEN_SNO, FINAL, Rig, RigFactory
from tests.support.db import sql
from tests.support.waits import eventually


async def _rig(make_rig: RigFactory, open_after: int = 2, probe_s: float = 3600.0) -> Rig:
    rig = await make_rig(breakers={"portal": {"open_after": open_after, "probe_s": probe_s}})
    rig.with_breakers()
    return rig


async def _submit_sample(rig: Rig, n: int) -> list[str]:
    return [await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD) for _ in range(n)]


async def _all_waiting(rig: Rig, job_ids: list[str], state: str = "down") -> list[Any]:
    async def waiting() -> list[Any] | None:
        jobs = [await rig.job(j) for j in job_ids]
        ok = all(
            j.wait_for == {"dependency": "portal", "state": state} and j.lease_until is None
            for j in jobs
        )
        return jobs if ok else None

    return await eventually(waiting, 30, what=f"every job waiting for the portal ({state})")


async def _waiting_rows(db_url: str) -> int:
    rows = await sql(
        db_url,
        "SELECT COUNT(*) FROM relay_outbox WHERE waits_for = 'portal' AND status = 'PENDING'",
    )
    return int(rows[0][0])


async def test_an_outage_opens_the_breaker_and_waiting_spends_nothing(
    make_rig: RigFactory, store: SqlStore, db_url: str
) -> None:
    rig = await _rig(make_rig, open_after=2)
    rig.portal.always_fail_503 = True
    rig.start_consumer()
    job_ids = await _submit_sample(rig, 4)
    jobs = await _all_waiting(rig, job_ids)
    # The run that opened the breaker and every one after it gave their attempt back: only
    # the runs before it count (open_after - 1 of them).
    assert sum(j.attempts for j in jobs) == 1, [j.attempts for j in jobs]
    assert all(j.status in ("QUEUED", "RUNNING") for j in jobs)
    row = next(r for r in await store.dependency_rows() if r.name == "portal")
    assert row.down_since is not None and row.failures_in_a_row >= 2
    assert "503" in (row.last_error or "")
    # Nothing left on the queue to walk to the DLQ: each waiting job has one row, held back.
    await rig.wait_queue_empty(dlq=0)
    assert await _waiting_rows(db_url) == 4
    requests = len(rig.portal.requests)
    # Down, with no probe due: the portal hears nothing more, however long it lasts.
    await rig.stop_consumers()
    assert len(rig.portal.requests) == requests
    events = [e.type for e in (await store.job_events(job_ids[0]))]
    assert events.count("waiting") == 1, events


async def test_one_probe_at_a_time_then_every_job_runs_when_the_portal_is_back(
    make_rig: RigFactory, store: SqlStore, db_url: str
) -> None:
    rig = await _rig(make_rig, open_after=2, probe_s=1.0)
    rig.portal.always_fail_503 = True
    rig.start_consumer()
    job_ids = await _submit_sample(rig, 5)
    await _all_waiting(rig, job_ids)
    # Probes, one at a time for the cluster, a probe interval apart: each one login request.
    started = time.monotonic()
    before = len(rig.portal.requests)

    async def probed_twice() -> bool:
        return len(rig.portal.requests) - before >= 2

    await eventually(probed_twice, 20, what="two probes")
    spent = time.monotonic() - started
    probes = len(rig.portal.requests) - before
    assert probes <= spent / 1.0 + 2, (probes, spent)
    rig.portal.always_fail_503 = False
    done = [await rig.wait_status(j, *FINAL, timeout_s=40) for j in job_ids]
    assert [j.status for j in done] == ["SUCCEEDED"] * 5
    # Attempts: one run each, and the single run counted before the breaker opened.
    assert sum(j.attempts for j in done) == 5 + 1, [j.attempts for j in done]
    for job_id in job_ids:
        types = [e.type for e in await store.job_events(job_id)]
        assert types.count("waiting") == 1 and types.count("resumed") == 1, types
        assert types.index("waiting") < types.index("resumed") < types.index("succeeded")
    row = next(r for r in await store.dependency_rows() if r.name == "portal")
    assert row.down_since is None and row.failures_in_a_row == 0
    assert await _waiting_rows(db_url) == 0
    await rig.wait_queue_empty(dlq=0)


async def test_a_pause_holds_work_on_every_instance_survives_a_restart_and_resume_runs_it(
    make_rig: RigFactory, store: SqlStore
) -> None:
    rig = await _rig(make_rig)
    other = Breakers(rig.settings, store)  # another instance's view of the same database
    await other.pause("portal", "the university asked us to stop", None, "ops")
    rig.start_consumer()
    job_ids = await _submit_sample(rig, 2)
    await _all_waiting(rig, job_ids, state="paused")
    assert rig.portal.requests == []
    # A fresh process reads the pause from the database.
    fresh = Breakers(rig.settings, store)
    view = await fresh.view("portal")
    assert (view.state, view.reason, view.paused_by) == (
        "paused",
        "the university asked us to stop",
        "ops",
    )
    assert view.waiting == 2
    await fresh.resume("portal", "ops")
    done = [await rig.wait_status(j, *FINAL) for j in job_ids]
    assert [j.status for j in done] == ["SUCCEEDED"] * 2
    assert [j.attempts for j in done] == [1, 1]


async def test_a_pause_with_an_end_lifts_itself(make_rig: RigFactory, store: SqlStore) -> None:
    rig = await _rig(make_rig)
    assert rig.breakers is not None
    view = await rig.breakers.pause("portal", "a short break", time.time() + 1.5, "ops")
    assert view.state == "paused" and view.until is not None
    rig.start_consumer()
    (job_id,) = await _submit_sample(rig, 1)
    job = await rig.wait_status(job_id, *FINAL, timeout_s=30)
    assert job.status == "SUCCEEDED"
    assert job.finished_at is not None and job.finished_at >= view.until
    row = next(r for r in await store.dependency_rows() if r.name == "portal")
    assert row.pause_reason is None


async def test_inside_a_maintenance_window_nothing_calls_the_portal(
    make_rig: RigFactory,
) -> None:
    window = {"cron": "* * * * *", "duration_s": 3600, "timezone": "Asia/Seoul"}
    rig = await make_rig(scrapers={"suwon": {"maintenance": [window]}})
    breakers = rig.with_breakers()
    rig.start_consumer()
    (job_id,) = await _submit_sample(rig, 1)
    await _all_waiting(rig, [job_id], state="maintenance")
    assert rig.portal.requests == []
    view = await breakers.view("portal")
    assert view.state == "maintenance" and view.until is not None
    assert view.until - time.time() <= 3600


async def test_a_verdict_is_no_outage_the_job_dies_as_before_and_the_breaker_stays_up(
    make_rig: RigFactory, store: SqlStore
) -> None:
    """A student whose record the portal serves malformed fails every run with a verdict
    (PORTAL_BAD_RESPONSE): its runs count as always and it ends DEAD; the portal answered
    each time, so the breaker never opens."""
    rig = await _rig(make_rig, open_after=2)
    rig.start_consumer()
    job_id = await rig.submit(BROKEN_SNO, BROKEN_PASSWORD)
    job = await rig.wait_status(job_id, *FINAL)
    assert job.status == "DEAD" and job.attempts == rig.settings.sqs.max_receive_count
    row = next(r for r in await store.dependency_rows() if r.name == "portal")
    assert row.down_since is None and row.failures_in_a_row == 0
