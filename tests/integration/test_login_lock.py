"""The portal login lock is no password oracle and no lockout weapon
(docs/contract.md#portal-link-jobs, docs/decisions/0028-login-lock-per-user.md), on both
backends: the guesser is locked, not the student; past the total threshold a username's
jobs wait (parked, not failed) and try one login at a time; a success forgets the counts;
the operator sees who caused a lock and unlocks by API or CLI; usernames are refused unless
in normal form, and the database holds only keyed hashes."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient
from structlog.testing import capture_logs
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO

from outboxd.queue.messages import encode_job
from outboxd.queue.sqs import OutgoingMessage
from outboxd.security import KeyRing, generate_key
from outboxd.storage.login_ports import LoginFailure, LoginPlan, LoginState
from outboxd.storage.store import SqlStore
from outboxd.workers.relay import Relay
from tests.support.api import assert_problem
from tests.support.consumer_rig import FINAL, Rig, RigFactory
from tests.support.db import sql
from tests.support.ops import run_cli, write_config
from tests.support.waits import eventually

Client = TestClient[Any, Any]
WINDOW = 3600.0


async def _fail(rig: Rig, user: str) -> None:
    """One job of `user` for the sample student with a wrong password, run to its end."""
    job = await rig.wait_status(await rig.submit(SAMPLE_SNO, "pw-wrong", user=user), *FINAL)
    assert (job.status, job.error_code) == ("FAILED", "PORTAL_AUTH_FAILED"), job


async def _record_failures(
    store: SqlStore, keys: KeyRing, rig: Rig, username: str, user: str, n: int
) -> None:
    """`n` failed logins of `user` for `username`, recorded as the consumer records them."""
    subject = keys.login_subject("suwon", username)
    for _ in range(n):
        job_id, _ = await rig.create(username, "pw-wrong", user=user)
        now = time.time()
        running = await store.start_job_run(job_id, now, 60)
        assert running is not None
        done = await store.finish_job(
            running,
            "FAILED",
            now,
            error=("PORTAL_AUTH_FAILED", "x"),
            login_failure=LoginFailure(subject, now - 2 * WINDOW, user_id=user),
        )
        assert done is not None


async def _no_plaintext(db_url: str, *secrets: str) -> None:
    """No row of the lock's tables, nor any job's text, holds a username or password."""
    for table in ("portal_login_failures", "portal_login_throttle", "job_events"):
        for row in await sql(db_url, f"SELECT * FROM {table}"):
            text = " ".join(str(v) for v in row)
            assert not any(s in text for s in secrets), (table, row)
    columns = "id, user_id, error_code, error_message, progress, wait_for, wait_outbox_id"
    for row in await sql(db_url, f"SELECT {columns} FROM jobs"):
        assert not any(s in " ".join(str(v) for v in row) for s in secrets), row


# ---------------------------------------------------------------- per user


async def test_the_guesser_is_locked_not_the_student(
    make_rig: RigFactory, api: Client, db_url: str
) -> None:
    """Mallory's three wrong passwords for the student's number lock Mallory's further jobs
    for it (FAILED PORTAL_LOGIN_LOCKED with lockedUntil, the portal not contacted, even with
    the right password); the student's own job succeeds, and its success forgets the
    counts, so Mallory's next job is tried again."""
    rig = await make_rig()
    rig.start_consumer()
    for _ in range(3):
        await _fail(rig, "mallory")
    assert rig.portal.login_attempts == {SAMPLE_SNO: 3}

    before = time.time()
    locked = await rig.wait_status(
        await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD, user="mallory"), *FINAL
    )
    assert (locked.status, locked.error_code) == ("FAILED", "PORTAL_LOGIN_LOCKED")
    assert locked.locked_until is not None
    assert before + WINDOW - 60 < locked.locked_until <= time.time() + WINDOW
    assert rig.portal.login_attempts == {SAMPLE_SNO: 3}
    body = await (await api.get(f"/v1/jobs/{locked.id}")).json()
    assert body["error"]["code"] == "PORTAL_LOGIN_LOCKED"
    assert body["error"]["lockedUntil"].endswith("Z") and body["waitingFor"] is None

    student = await rig.wait_status(
        await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD, user="student"), *FINAL
    )
    assert student.status == "SUCCEEDED", student
    assert rig.portal.login_attempts == {SAMPLE_SNO: 4}
    shown = await (await api.get(f"/v1/jobs/{student.id}")).json()
    assert shown["error"] is None and shown["waitingFor"] is None
    # The success forgot every count for the username: Mallory is tried again.
    assert await sql(db_url, "SELECT * FROM portal_login_failures") == []
    await _fail(rig, "mallory")
    assert rig.portal.login_attempts == {SAMPLE_SNO: 5}
    users = await sql(db_url, "SELECT user_id FROM portal_login_failures")
    assert [u[0] for u in users] == ["mallory"]
    await _no_plaintext(db_url, SAMPLE_SNO, SAMPLE_PASSWORD, "pw-wrong")


async def test_a_guesser_sending_at_once_gets_no_more_tries(make_rig: RigFactory) -> None:
    """Eight wrong passwords from one user for one username, sent at once to four handler
    slots: the portal sees three logins (each try counts while under way: the fourth job
    waits for them rather than fail on tries that might succeed), the rest end
    PORTAL_LOGIN_LOCKED."""
    rig = await make_rig()
    rig.start_consumer()
    rig.start_relay()
    jobs = [await rig.create(SAMPLE_SNO, f"pw-guess-{n}", user="mallory") for n in range(8)]
    await asyncio.gather(*(_publish(rig, outbox_id) for _, outbox_id in jobs))
    ends = [await rig.wait_status(job_id, *FINAL, timeout_s=40) for job_id, _ in jobs]
    codes = sorted(str(j.error_code) for j in ends)
    assert codes == ["PORTAL_AUTH_FAILED"] * 3 + ["PORTAL_LOGIN_LOCKED"] * 5
    assert rig.portal.login_attempts == {SAMPLE_SNO: 3}


# ---------------------------------------------------------------- the total threshold


async def test_past_the_total_threshold_jobs_wait_and_try_one_login_at_a_time(
    make_rig: RigFactory, api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    """Four users' failures (scrapers.suwon.max_auth_failures_total = 4) throttle the
    username: a fifth user's job is not failed but parked, QUEUED with waitingFor until
    the next try, its message deleted (no receive spent on the wait). Published again
    early, it parks again; two parked jobs published at the try's time log in once between
    them; the try that succeeds forgets the counts and the throttle."""
    rig = await make_rig(scrapers={"suwon": {"max_auth_failures_total": 4}})
    rig.start_consumer()
    for user in ("u1", "u2", "u3", "u4"):
        await _fail(rig, user)
    subject = keys.login_subject("suwon", SAMPLE_SNO)

    first = await rig.submit(SAMPLE_SNO, "pw-second-guess", user="u5")
    waiting = await _parked(rig, first)
    assert waiting.status == "QUEUED" and waiting.error_code is None
    assert rig.portal.login_attempts == {SAMPLE_SNO: 4}
    body = await (await api.get(f"/v1/jobs/{first}")).json()
    assert body["status"] == "QUEUED" and body["error"] is None
    assert body["waitingFor"]["dependency"] == "portal"
    assert body["waitingFor"]["state"] == "login_throttled"
    state = await store.login_state(subject, 0)
    assert state.throttle is not None
    newest = max(f.failed_at for f in state.failures)
    # The first try a minute after the failure that crossed the threshold.
    assert abs(state.throttle.next_try_at - (newest + 60)) < 0.01
    assert body["waitingFor"]["until"].endswith("Z")
    await rig.wait_queue_empty()  # the wait is a PENDING outbox row, not a message
    row = await store.latest_relay_row_for_job(first)
    assert row is not None and row.status == "PENDING"
    assert row.next_attempt_at == waiting.wait_until and row.id == waiting.wait_outbox_id

    # Its row published before the time: parked again, nothing tried.
    await _publish(rig, row.id)
    again = await _parked(rig, first, after=row.id)
    assert again.wait_outbox_id != row.id and rig.portal.login_attempts == {SAMPLE_SNO: 4}

    # Two parked jobs, published when a try is due: one login between them.
    second = await rig.submit(SAMPLE_SNO, "pw-third-guess", user="u6")
    second_job = await _parked(rig, second)
    await _try_due(db_url)
    await asyncio.gather(
        _publish(rig, str(again.wait_outbox_id)), _publish(rig, str(second_job.wait_outbox_id))
    )

    async def one_tried() -> list[str] | None:
        statuses = [(await rig.job(j)).status for j in (first, second)]
        return statuses if "FAILED" in statuses else None

    await eventually(one_tried, 15, what="one of the two to try its login")
    await rig.wait_queue_empty()
    ends = {(await rig.job(j)).status for j in (first, second)}
    assert ends == {"FAILED", "QUEUED"}
    assert rig.portal.login_attempts == {SAMPLE_SNO: 5}
    state = await store.login_state(subject, 0)
    assert state.throttle is not None and state.throttle.delay_s == 120
    assert state.throttle.holder is None  # the failed try gave it back
    assert not any(j.status in ("DEAD",) for j in [await rig.job(first), await rig.job(second)])

    # The student, when the next try is due: logs in, and the throttle is gone.
    await _try_due(db_url)
    student = await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD, user="student")
    done = await rig.wait_status(student, *FINAL)
    assert done.status == "SUCCEEDED", done
    assert await sql(db_url, "SELECT * FROM portal_login_throttle") == []
    assert await sql(db_url, "SELECT * FROM portal_login_failures") == []
    await _no_plaintext(db_url, SAMPLE_SNO, SAMPLE_PASSWORD, "guess", "pw-wrong")


async def test_a_parked_jobs_old_message_is_deleted_unrun(
    make_rig: RigFactory, db_url: str
) -> None:
    """A crash between the park's commit and the message's delete: the old message comes
    back, finds the job parked for another outbox row, and is deleted without a login."""
    rig = await make_rig(scrapers={"suwon": {"max_auth_failures_total": 2}})
    rig.start_consumer()
    for user in ("u1", "u2"):
        await _fail(rig, user)
    job_id, outbox_id = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD, user="student")
    await _publish(rig, outbox_id)
    parked = await _parked(rig, job_id)
    # The message the consumer deleted, delivered again.
    await rig.queues.send_batch("jobs", [OutgoingMessage("old", encode_job(job_id, outbox_id))])

    async def dropped() -> bool:
        return len(rig.receiver.receives_of(job_id)) == 2

    await eventually(dropped, 15, what="the old message to be received")
    await rig.wait_queue_empty()
    now = await rig.job(job_id)
    assert (now.status, now.wait_outbox_id, now.version) == (
        "QUEUED",
        parked.wait_outbox_id,
        parked.version,
    )
    assert rig.portal.login_attempts == {SAMPLE_SNO: 2}


async def test_tries_at_once_are_decided_one_after_another(store: SqlStore) -> None:
    """Each try is decided under the username's lock and recorded as under way before the
    next is decided: six jobs of one user at once, three go (the per-user threshold) and
    three are locked; past the total, of six takers of the throttle's one try one gets it,
    which doubles the spacing. A try given back no longer counts."""
    now = time.time()

    def per_user(state: LoginState) -> LoginPlan:
        mine = [f for f in state.failures if f.user_id == "mallory"]
        return LoginPlan("locked", now + WINDOW) if len(mine) >= 3 else LoginPlan("go")

    got = await asyncio.gather(
        *(
            store.reserve_login("a" * 64, f"job-{n}", "mallory", now + n / 1000, 0, 30, per_user)
            for n in range(6)
        )
    )
    assert sum(g.reserved for g in got) == 3
    assert sorted(g.plan.action for g in got) == ["go"] * 3 + ["locked"] * 3
    under_way = await store.login_state("a" * 64, 0)
    assert len(under_way.failures) == 3 and all(f.attempt_of for f in under_way.failures)

    throttled = LoginPlan("throttled", first_try_at=now - 1, first_delay_s=60, max_delay_s=WINDOW)
    tries = await asyncio.gather(
        *(
            store.reserve_login("b" * 64, f"job-{n}", f"u{n}", now, 0, 30, lambda _: throttled)
            for n in range(6)
        )
    )
    assert sum(t.reserved for t in tries) == 1
    winner = next(t for t in tries if t.reserved)
    assert winner.throttle is not None and winner.throttle.delay_s == 120
    assert abs(winner.throttle.next_try_at - (now + 120)) < 1
    assert all(t.throttle is not None and t.throttle.free_at() >= now + 30 for t in tries)
    holder = str(winner.throttle.holder)
    assert await store.release_login_try("b" * 64, holder)
    state = await store.login_state("b" * 64, 0)
    assert state.failures == [] and state.throttle is not None and state.throttle.holder is None


async def _try_due(db_url: str) -> None:
    """The throttled username's next try due now (as if its delay had passed)."""
    await sql(db_url, f"UPDATE portal_login_throttle SET next_try_at = {time.time() - 1!r}")


async def _publish(rig: Rig, outbox_id: str) -> None:
    relay = Relay(rig.store, rig.publisher, rig.settings.relay, rig.metrics)
    assert await relay.publish_now(outbox_id)


async def _parked(rig: Rig, job_id: str, after: str | None = None) -> Any:
    """The job once parked (for another row than `after`)."""

    async def parked() -> Any:
        job = await rig.job(job_id)
        ok = job.status == "QUEUED" and job.wait_outbox_id not in (None, after)
        return job if ok else None

    job = await eventually(parked, 15, what=f"job {job_id} to be parked")
    assert job.wait_for == {"dependency": "portal", "state": "login_throttled"}
    assert job.wait_until is not None and job.wait_until > time.time()
    return job


# ---------------------------------------------------------------- the operator


async def test_the_listing_shows_who_caused_a_lock_and_unlock_clears_one_username(
    make_rig: RigFactory, api: Client, store: SqlStore, keys: KeyRing, db_url: str
) -> None:
    """GET /v1/admin/portal-logins?locked=true lists the locked username by its keyed hash
    with the user who caused it; POST .../unlock clears that username only (logged with
    the acting user), and its user's next job is tried."""
    rig = await make_rig()
    await _record_failures(store, keys, rig, SAMPLE_SNO, "mallory", 3)
    await _record_failures(store, keys, rig, "20209998", "bob", 1)
    subject = keys.login_subject("suwon", SAMPLE_SNO)

    resp = await api.get("/v1/admin/portal-logins", params={"locked": "true"})
    assert resp.status == 200, await resp.text()
    items = (await resp.json())["items"]
    assert [i["subject"] for i in items] == [subject]
    (item,) = items
    assert item["failures"] == 3 and item["throttled"] is False and item["lockedUntil"]
    assert [(u["user"], u["failures"]) for u in item["users"]] == [("mallory", 3)]
    assert item["users"][0]["lockedUntil"] == item["lockedUntil"]
    everything = await (await api.get("/v1/admin/portal-logins")).json()
    assert len(everything["items"]) == 2
    assert SAMPLE_SNO not in json.dumps(everything) and "20209998" not in json.dumps(everything)
    await assert_problem(
        await api.get("/v1/admin/portal-logins", params={"locked": "yes"}), 400, "C01"
    )

    with capture_logs() as logs:
        resp = await api.post("/v1/admin/portal-logins/unlock", json={"username": SAMPLE_SNO})
    assert resp.status == 200, await resp.text()
    assert await resp.json() == {"subject": subject, "failuresCleared": 3}
    line = next(e for e in logs if e["event"] == "portal_login_unlocked")
    assert line["subject"] == subject and line["actor"]
    assert (await (await api.get("/v1/admin/portal-logins?locked=true")).json())["items"] == []
    left = await sql(db_url, "SELECT user_id FROM portal_login_failures")
    assert [u[0] for u in left] == ["bob"]
    await assert_problem(
        await api.post("/v1/admin/portal-logins/unlock", json={"username": ""}), 400, "C01"
    )
    rig.start_consumer()
    ok = await rig.wait_status(
        await rig.submit(SAMPLE_SNO, SAMPLE_PASSWORD, user="mallory"), *FINAL
    )
    assert ok.status == "SUCCEEDED", ok


async def test_the_cli_lists_and_unlocks_one_username(
    make_rig: RigFactory, store: SqlStore, db_url: str, tmp_path: Path
) -> None:
    """`outboxd portal locks` and `outboxd portal unlock USERNAME`, on a config naming the
    same database and key: the lock listed by hash, then cleared, with the log line naming
    the command's user."""
    key = generate_key()
    keys_file = tmp_path / "cli.keys"
    keys_file.write_text(key + "\n")
    keys = KeyRing.from_lines([key], "test")
    rig = await make_rig()
    await _record_failures(store, keys, rig, SAMPLE_SNO, "mallory", 3)
    await _record_failures(store, keys, rig, "20209998", "bob", 1)
    subject = keys.login_subject("suwon", SAMPLE_SNO)
    config = write_config(
        tmp_path,
        {
            "storage": {"url": db_url, "auto_migrate": False},
            "security": {"keys_file": str(keys_file)},
        },
    )

    listed = run_cli("portal", "locks", "--json", "--config", str(config))
    assert listed.returncode == 0, listed.stderr
    assert [i["subject"] for i in json.loads(listed.stdout)] == [subject]
    done = run_cli("portal", "unlock", SAMPLE_SNO, "--config", str(config))
    assert done.returncode == 0, done.stderr
    assert subject in done.stdout and "3 failed logins" in done.stdout
    line = next(json.loads(x) for x in done.stderr.splitlines() if "portal_login_unlocked" in x)
    assert line["actor"].startswith("cli:") and line["subject"] == subject
    left = await sql(db_url, "SELECT user_id FROM portal_login_failures")
    assert [u[0] for u in left] == ["bob"]
    table = run_cli("portal", "locks", "--config", str(config))
    assert table.returncode == 0 and subject not in table.stdout


# ---------------------------------------------------------------- normalized names


async def test_a_username_normalization_changes_is_refused_and_nothing_stored(
    api: Client, db_url: str
) -> None:
    """Surrounding whitespace, a compatibility form (NFKC) or an upper-case letter
    (case folding) would give one person a second count: 400 C01, nothing stored. A
    student number passes."""
    for n, username in enumerate([" 20201234", "20201234\t", "２０２０１２３４", "Kim", "ﬁ"]):
        resp = await api.post(
            "/v1/portal-link-jobs",
            json={"portal": "suwon", "username": username, "password": "pw"},
            headers={"Idempotency-Key": f"norm-{n}"},
        )
        body = await assert_problem(resp, 400, "C01")
        assert body["errors"][0]["field"] == "username", username
    assert await sql(db_url, "SELECT id FROM jobs") == []
    ok = await api.post(
        "/v1/portal-link-jobs",
        json={"portal": "suwon", "username": "20201234", "password": "pw"},
        headers={"Idempotency-Key": "norm-ok"},
    )
    assert ok.status == 202, await ok.text()


async def test_a_users_jobs_at_once_for_one_username_are_not_locked_by_their_own_tries(
    make_rig: RigFactory,
) -> None:
    """Five right-password jobs of one user for one student, at once, on four handler
    slots: tries under way count, so the fourth and fifth wait for them (login_busy) rather
    than end PORTAL_LOGIN_LOCKED; all five succeed, each with one attempt."""
    rig = await make_rig()
    rig.start_consumer()
    rig.start_relay()
    jobs = [await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD, user="alice") for _ in range(5)]
    await asyncio.gather(*(_publish(rig, outbox_id) for _, outbox_id in jobs))
    ends = [await rig.wait_status(job_id, *FINAL, timeout_s=40) for job_id, _ in jobs]
    assert [j.status for j in ends] == ["SUCCEEDED"] * 5, [j.error_code for j in ends]
    assert [j.attempts for j in ends] == [1] * 5


async def test_tries_left_under_way_by_runs_that_died_make_no_one_wait(
    make_rig: RigFactory, store: SqlStore, keys: KeyRing
) -> None:
    """A run that dies mid-login leaves its try recorded as under way. The same job's next
    run is not held up by its own past try (it is over), and tries older than the lease
    (their runs died) make no other job of the user wait: found by the chaos run, where a
    job killed three times parked itself every 5 s for as long as the window lasted."""
    from outboxd.config import SuwonScraperSettings
    from outboxd.services.portal_logins import LoginGuard

    rig = await make_rig()
    now = time.time()
    guard = LoginGuard(store, keys, SuwonScraperSettings(), hold_s=60.0, clock=lambda: now)
    job_id, _ = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD, user="alice")
    job = await store.start_job_run(job_id, now, 60)
    assert job is not None
    # Three runs of this job that died under way: each left its try behind.
    for n in range(3):
        guard.clock = lambda n=n: now + n  # type: ignore[misc]
        verdict = await guard.check(job, SAMPLE_SNO)
        assert verdict is not None and verdict.action == "go", verdict
    # Three other jobs of alice that died long ago under way (older than the lease).
    subject = keys.login_subject("suwon", SAMPLE_SNO)
    for n in range(3):
        other, _ = await rig.create(SAMPLE_SNO, SAMPLE_PASSWORD, user="alice")
        await store.reserve_login(
            subject, other, "alice", now - 600 - n, now - 7200, 60, lambda _s: LoginPlan("go")
        )
    guard.clock = lambda: now + 10
    verdict = await guard.check(job, SAMPLE_SNO)
    assert verdict is not None and verdict.action == "go", verdict
