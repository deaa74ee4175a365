"""The portal login lock: no password oracle, and no lockout weapon.

Failed logins are counted per portal username (a keyed hash, security.py `login_subject`)
and per submitting user. A user with `max_auth_failures` failures for a username within
`auth_failure_window_s` is locked out of that username (its jobs FAILED
PORTAL_LOGIN_LOCKED, the portal not contacted); other users are not. Past
`max_auth_failures_total` failures from everyone, the username is throttled: its jobs are
parked (services/parking.py) and try one login at a time, spaced by a doubling delay from a
minute up to the window. A successful login forgets the username's counts; an operator's
unlock does too (docs/decisions/0028-login-lock-per-user.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

import structlog

from outboxd.config import SuwonScraperSettings
from outboxd.security import KeyRing
from outboxd.services.parking import WaitingFor
from outboxd.storage.login_ports import (
    LoginFailureRow,
    LoginLockStore,
    LoginPlan,
    LoginState,
    LoginThrottle,
)
from outboxd.storage.ports import JobRecord

log = structlog.get_logger(__name__)

# What a job of a locked-out user ends with (docs/contract.md, job error codes).
LOGIN_LOCKED_ERROR: Final = (
    "PORTAL_LOGIN_LOCKED",
    "too many failed logins for this portal username from this user recently; not tried "
    "(see error.lockedUntil)",
)
# What a job of a throttled username waits for.
LOGIN_THROTTLED: Final = WaitingFor("portal", "login_throttled")
# What a job waits for while its user's other logins as the same username are under way
# (they would lock it, should they all fail), and how long before it looks again.
LOGIN_BUSY: Final = WaitingFor("portal", "login_busy")
BUSY_RETRY_S: Final = 5.0
# The first spacing of a throttled username's tries; it doubles up to the window.
FIRST_TRY_DELAY_S: Final = 60.0
# At most this many failures are read for the operator's listing.
_LISTING_ROWS: Final = 10_000


def login_locked(failures: Sequence[float], now: float, window_s: float, max_failures: int) -> bool:
    """Whether `max_failures` failures lock: that many within `window_s` of each other, the
    last less than `window_s` ago. `failures`: their times, newest first."""
    if max_failures <= 0 or len(failures) < max_failures:
        return False
    last = failures[0]
    return now - last < window_s and last - failures[max_failures - 1] <= window_s


def locked_until(
    failures: Sequence[float], now: float, window_s: float, max_failures: int
) -> float | None:
    """When the lock of `failures` (newest first) runs out: a window after the last; None
    when they do not lock."""
    if not login_locked(failures, now, window_s, max_failures):
        return None
    return failures[0] + window_s


Action = Literal["go", "locked", "wait", "try"]


@dataclass(frozen=True)
class LoginVerdict:
    """What a job may do before its login: `go` (its try recorded as under way); `locked`
    (this user, until `until`); `wait` (the username is throttled, next try at `until`);
    `try` (throttled, and this job holds the one try)."""

    subject: str
    action: Action
    until: float | None = None
    waiting: WaitingFor = LOGIN_THROTTLED


@dataclass(eq=False, repr=False)
class LoginGuard:
    """The check a worker makes right before a portal login, and what it counts after."""

    store: LoginLockStore
    keys: KeyRing
    settings: SuwonScraperSettings
    # How long a throttled try is held should its worker die (the job's lease).
    hold_s: float
    clock: Callable[[], float] = time.time

    @property
    def on(self) -> bool:
        s = self.settings
        return s.max_auth_failures > 0 or s.max_auth_failures_total > 0

    async def check(self, job: JobRecord, username: str) -> LoginVerdict | None:
        """The verdict for `job`'s login as `username`; None while the lock is off."""
        if not self.on:
            return None
        s, now = self.settings, self.clock()
        window = s.auth_failure_window_s
        subject = self.keys.login_subject(job.portal, username)

        stale = now - self.hold_s

        def decide(state: LoginState) -> LoginPlan:
            # Tries under way count as failures, so jobs running at once cannot all pass;
            # but only failures lock: a job that tries under way would lock waits for them.
            mine = [f for f in state.failures if f.user_id == job.user_id]
            failed = [f.failed_at for f in mine if f.attempt_of is None]
            until = locked_until(failed, now, window, s.max_auth_failures)
            if until is not None:
                return LoginPlan("locked", until)
            # A try still under way after its lease (its run died) no longer makes anyone wait.
            live = [f.failed_at for f in mine if f.attempt_of is None or f.failed_at > stale]
            if login_locked(live, now, window, s.max_auth_failures):
                return LoginPlan("busy", now + BUSY_RETRY_S)
            everyone = [f.failed_at for f in state.failures]
            if not login_locked(everyone, now, window, s.max_auth_failures_total):
                return LoginPlan("go")
            first_delay = min(FIRST_TRY_DELAY_S, window)
            return LoginPlan(
                "throttled",
                first_try_at=everyone[0] + first_delay,
                first_delay_s=first_delay,
                max_delay_s=max(window, first_delay),
            )

        # Failures older than two windows cannot matter: the last must be within one, and
        # the others within one of it.
        got = await self.store.reserve_login(
            subject, job.id, job.user_id, now, now - 2 * window, self.hold_s, decide
        )
        if got.plan.action == "locked":
            return LoginVerdict(subject, "locked", got.plan.until)
        if got.plan.action == "busy":
            return LoginVerdict(subject, "wait", got.plan.until, LOGIN_BUSY)
        if got.plan.action == "go":
            return LoginVerdict(subject, "go")
        if got.reserved:
            return LoginVerdict(subject, "try")
        assert got.throttle is not None
        return LoginVerdict(subject, "wait", got.throttle.free_at())

    def forget_before(self) -> float:
        """Failures older than this no longer matter (dropped when a new one is counted)."""
        return self.clock() - 2 * self.settings.auth_failure_window_s

    async def give_back(self, verdict: LoginVerdict | None, job: JobRecord) -> None:
        """The try `job` went ahead with, given back: its run ended without a login verdict
        (the outcomes that have one settle the try in their own transaction)."""
        if verdict is not None and verdict.action in ("go", "try"):
            await self.store.release_login_try(verdict.subject, job.id)


@dataclass(frozen=True)
class LockedUser:
    """One submitting user's recent failures for a username (None: recorded by a release
    that did not keep the user), and the end of that user's lock if locked."""

    user_id: str | None
    failures: int
    locked_until: float | None


@dataclass(frozen=True)
class UsernameLock:
    """A username (by subject) with recent failures: who caused them, and its locks."""

    subject: str
    failures: int
    users: Sequence[LockedUser]
    throttled: bool
    next_try_at: float | None
    locked_until: float | None

    @property
    def locked(self) -> bool:
        return self.locked_until is not None


@dataclass(eq=False, repr=False)
class PortalLoginAdmin:
    """The operator's view and unlock, for the admin API and the `outboxd` command alike;
    every unlock is logged with the `actor` who asked."""

    store: LoginLockStore
    keys: KeyRing
    settings: SuwonScraperSettings
    clock: Callable[[], float] = time.time

    async def usernames(self, locked: bool | None = None, limit: int = 50) -> list[UsernameLock]:
        """Usernames with recent failures, the most recently failed first; `locked`: only
        those locked (for some user, or throttled), or only those not."""
        s, now = self.settings, self.clock()
        window = s.auth_failure_window_s
        rows = await self.store.login_failure_rows(now - 2 * window, _LISTING_ROWS)
        by_subject: dict[str, list[LoginFailureRow]] = {}
        for r in rows:
            by_subject.setdefault(r.subject, []).append(r)
        throttles = {t.subject: t for t in await self.store.login_throttles(list(by_subject))}
        out: list[UsernameLock] = []
        for subject, failures in by_subject.items():
            view = _username_lock(subject, failures, throttles.get(subject), now, s)
            if locked is None or view.locked == locked:
                out.append(view)
            if len(out) >= limit:
                break
        return out

    def subject(self, username: str, portal: str = "suwon") -> str:
        """The username as the lock and every job since migration 0010 keep it: its keyed
        hash (the job search's key, docs/decisions/0032-job-search-by-username-key.md)."""
        return self.keys.login_subject(portal, username)

    async def unlock(self, username: str, *, actor: str, portal: str = "suwon") -> tuple[str, int]:
        """Forget a username's failures and throttle: its subject, and the failures deleted."""
        subject = self.subject(username, portal)
        cleared = await self.store.clear_login_subject(subject)
        log.info("portal_login_unlocked", subject=subject, failures_cleared=cleared, actor=actor)
        return subject, cleared


def _username_lock(
    subject: str,
    failures: Sequence[LoginFailureRow],
    throttle: LoginThrottle | None,
    now: float,
    s: SuwonScraperSettings,
) -> UsernameLock:
    window = s.auth_failure_window_s
    per_user: dict[str | None, list[float]] = {}
    for f in failures:
        per_user.setdefault(f.user_id, []).append(f.failed_at)
    users = [
        LockedUser(
            user,
            len(times),
            None if user is None else locked_until(times, now, window, s.max_auth_failures),
        )
        for user, times in per_user.items()
    ]
    everyone = [f.failed_at for f in failures]
    total_end = locked_until(everyone, now, window, s.max_auth_failures_total)
    ends = [u.locked_until for u in users if u.locked_until is not None]
    if total_end is not None:
        ends.append(total_end)
    next_try = throttle.free_at() if throttle is not None and total_end is not None else None
    return UsernameLock(
        subject=subject,
        failures=len(failures),
        users=users,
        throttled=total_end is not None,
        next_try_at=next_try,
        locked_until=max(ends) if ends else None,
    )
