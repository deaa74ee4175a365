"""The portal login lock (`login_ports.LoginLockStore`): failed logins per username and
submitting user, the throttle of a username past the total threshold, unlock and listing.
Subjects are keyed hashes; the store never sees a username."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Mapping, Sequence
from typing import Any

from outboxd.storage.db import Op, Query, Row, execute, fetch
from outboxd.storage.login_ports import (
    LoginFailure,
    LoginFailureRow,
    LoginPlan,
    LoginReservation,
    LoginState,
    LoginThrottle,
)
from outboxd.storage.ports import JobRecord
from outboxd.storage.store.base import StoreBase

# A username's failures read for a decision: a window's worth, a few times over (each user
# stops at its own threshold, and everyone together at the total).
_ROWS = 1000


def _failure(r: Row) -> LoginFailureRow:
    return LoginFailureRow(r["subject"], r["user_id"], float(r["failed_at"]), r["attempt_of"])


def _throttle(r: Row) -> LoginThrottle:
    held = r["held_until"]
    return LoginThrottle(
        subject=r["subject"],
        next_try_at=float(r["next_try_at"]),
        delay_s=float(r["delay_s"]),
        holder=r["holder"],
        held_until=None if held is None else float(held),
    )


def count_login_failure(
    q: Mapping[str, Query], failure: LoginFailure, job: JobRecord, now: float
) -> Generator[Op, Any, None]:
    """A failed login, counted in its job's outcome transaction for the user who submitted
    the job (unless `failure` names another): the subject's old failures dropped, and the
    try the job held given back."""
    subject, holder = failure.subject, job.id
    user_id = failure.user_id if failure.user_id is not None else job.user_id
    # The try recorded as under way becomes this failure (at the time of its outcome).
    yield execute(q["login_attempt_delete"], {"subject": subject, "holder": holder})
    yield execute(q["login_failure_insert"], {"subject": subject, "now": now, "user_id": user_id})
    yield execute(q["login_failures_trim"], {"subject": subject, "before": failure.forget_before})
    yield execute(q["login_try_release"], {"subject": subject, "holder": holder})


def forget_login(q: Mapping[str, Query], subject: str) -> Generator[Op, Any, int]:
    """A subject's failures and throttle deleted (a successful login, an unlock)."""
    n: int = yield execute(q["login_failures_clear"], {"subject": subject})
    yield execute(q["login_throttle_clear"], {"subject": subject})
    return n


class SqlLogins(StoreBase):
    def _state(self, subject: str, since: float) -> Generator[Op, Any, LoginState]:
        rows = yield fetch(
            self.q["login_failures_of"], {"subject": subject, "since": since, "limit": _ROWS}
        )
        row = yield from self._one("login_throttle_select", {"subject": subject})
        return LoginState([_failure(r) for r in rows], None if row is None else _throttle(row))

    async def login_state(self, subject: str, since: float) -> LoginState:
        return await self.db.read(lambda: self._state(subject, since))

    async def reserve_login(
        self,
        subject: str,
        holder: str,
        user_id: str,
        now: float,
        since: float,
        hold_s: float,
        decide: Callable[[LoginState], LoginPlan],
    ) -> LoginReservation:
        def body() -> Generator[Op, Any, LoginReservation]:
            # One decision per username at a time: on SQLite the write transaction is
            # serialised already, on Postgres a transaction-scoped advisory lock.
            yield execute(self.q["login_subject_lock"], {"subject": subject})
            # This job's own earlier try, if a run of it died under way, is over: it starts
            # a new run now, and must not wait for (or be locked by) its own past.
            yield execute(self.q["login_attempt_delete"], {"subject": subject, "holder": holder})
            state = yield from self._state(subject, since)
            plan = decide(state)  # the rule is the service's; the store records
            if plan.action in ("locked", "busy"):
                return LoginReservation(plan, False)
            throttle = None
            if plan.action == "throttled":
                yield execute(
                    self.q["login_throttle_ensure"],
                    {
                        "subject": subject,
                        "first_try_at": plan.first_try_at,
                        "first_delay_s": plan.first_delay_s,
                        "stale_before": now - plan.max_delay_s,
                    },
                )
                taken = yield from self._one(
                    "login_try_take",
                    {
                        "subject": subject,
                        "holder": holder,
                        "now": now,
                        "max_delay_s": plan.max_delay_s,
                        "hold_s": hold_s,
                    },
                )
                if taken is None:
                    row = yield from self._one("login_throttle_select", {"subject": subject})
                    assert row is not None  # made above, in this transaction
                    return LoginReservation(plan, False, _throttle(row))
                throttle = _throttle(taken)
            yield execute(
                self.q["login_attempt_insert"],
                {"subject": subject, "now": now, "user_id": user_id, "holder": holder},
            )
            return LoginReservation(plan, True, throttle)

        return await self.db.run(body)

    async def release_login_try(self, subject: str, holder: str) -> bool:
        def body() -> Generator[Op, Any, bool]:
            n = yield from self._count(
                "login_attempt_delete", {"subject": subject, "holder": holder}
            )
            m = yield from self._count("login_try_release", {"subject": subject, "holder": holder})
            return bool(n or m)

        return await self.db.run(body)

    async def clear_login_subject(self, subject: str) -> int:
        return await self.db.run(lambda: forget_login(self.q, subject))

    async def login_failure_rows(self, since: float, limit: int) -> list[LoginFailureRow]:
        def body() -> Generator[Op, Any, list[LoginFailureRow]]:
            rows = yield fetch(self.q["login_failures_all"], {"since": since, "limit": limit})
            return [_failure(r) for r in rows]

        return await self.db.read(body)

    async def login_throttles(self, subjects: Sequence[str]) -> list[LoginThrottle]:
        if not subjects:
            return []
        wanted = json.dumps(list(subjects))

        def body() -> Generator[Op, Any, list[LoginThrottle]]:
            rows = yield fetch(self.q["login_throttles_of"], {"subjects": wanted})
            return [_throttle(r) for r in rows]

        return await self.db.read(body)
