"""The portal login lock (`login_ports.LoginLockStore`): failed logins per username and
submitting user, the throttle of a username past the total threshold, unlock and listing.
Subjects are keyed hashes; the store never sees a username."""

from __future__ import annotations

import json
from collections.abc import Generator, Mapping, Sequence
from typing import Any

from outboxd.storage.db import Op, Query, Row, execute, fetch
from outboxd.storage.login_ports import (
    LoginFailure,
    LoginFailureRow,
    LoginState,
    LoginThrottle,
    LoginTry,
)
from outboxd.storage.store.base import StoreBase


def _failure(r: Row) -> LoginFailureRow:
    return LoginFailureRow(r["subject"], r["user_id"], float(r["failed_at"]))


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
    q: Mapping[str, Query], failure: LoginFailure, holder: str, now: float
) -> Generator[Op, Any, None]:
    """A failed login, counted in its job's outcome transaction: the subject's old failures
    dropped, and the try the job held (a throttled username's) given back."""
    subject = failure.subject
    yield execute(
        q["login_failure_insert"], {"subject": subject, "now": now, "user_id": failure.user_id}
    )
    yield execute(q["login_failures_trim"], {"subject": subject, "before": failure.forget_before})
    yield execute(q["login_try_release"], {"subject": subject, "holder": holder})


def forget_login(q: Mapping[str, Query], subject: str) -> Generator[Op, Any, int]:
    """A subject's failures and throttle deleted (a successful login, an unlock)."""
    n: int = yield execute(q["login_failures_clear"], {"subject": subject})
    yield execute(q["login_throttle_clear"], {"subject": subject})
    return n


class SqlLogins(StoreBase):
    async def login_state(self, subject: str, since: float, limit: int) -> LoginState:
        def body() -> Generator[Op, Any, LoginState]:
            rows = yield fetch(
                self.q["login_failures_of"], {"subject": subject, "since": since, "limit": limit}
            )
            row = yield from self._one("login_throttle_select", {"subject": subject})
            return LoginState([_failure(r) for r in rows], None if row is None else _throttle(row))

        return await self.db.read(body)

    async def take_login_try(
        self,
        subject: str,
        holder: str,
        now: float,
        first_try_at: float,
        first_delay_s: float,
        max_delay_s: float,
        hold_s: float,
    ) -> LoginTry:
        def body() -> Generator[Op, Any, LoginTry]:
            yield execute(
                self.q["login_throttle_ensure"],
                {
                    "subject": subject,
                    "first_try_at": first_try_at,
                    "first_delay_s": first_delay_s,
                    "stale_before": now - max_delay_s,
                },
            )
            taken = yield from self._one(
                "login_try_take",
                {
                    "subject": subject,
                    "holder": holder,
                    "now": now,
                    "max_delay_s": max_delay_s,
                    "hold_s": hold_s,
                },
            )
            if taken is not None:
                return LoginTry(True, _throttle(taken))
            row = yield from self._one("login_throttle_select", {"subject": subject})
            assert row is not None  # made above, in this transaction
            return LoginTry(False, _throttle(row))

        return await self.db.run(body)

    async def release_login_try(self, subject: str, holder: str) -> bool:
        return await self._changed("login_try_release", {"subject": subject, "holder": holder})

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
