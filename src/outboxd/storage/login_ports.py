"""What the portal login lock asks of storage: its records and its Protocol.

Beside storage/ports.py (one concern per Protocol, as there): failed logins counted per
portal username and per submitting user, the throttle of a username past the total
threshold, and the operator's view and unlock (docs/decisions/0028-login-lock-per-user.md).
A username appears here only as its subject: a keyed hash (security.py `login_subject`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol


@dataclass(frozen=True)
class LoginFailure:
    """A PORTAL_AUTH_FAILED outcome to count for the login lock: its subject (a keyed hash,
    never the username), the time before which that subject's older failures no longer
    matter (they are dropped in the same transaction), and the submitting user (None: the
    job's owner, as it always is). The job's try under way is settled there too."""

    subject: str
    forget_before: float
    user_id: str | None = None


@dataclass(frozen=True)
class LoginFailureRow:
    """One recorded failed login: for whom (subject), from whom (user_id), when; or a try
    still under way (`attempt_of`: its job), which counts the same until its outcome."""

    subject: str
    user_id: str | None
    failed_at: float
    attempt_of: str | None = None


@dataclass(frozen=True)
class LoginThrottle:
    """A username past the total threshold: its next login try may start at `next_try_at`,
    and `holder` (a job id) holds the one try under way until `held_until`."""

    subject: str
    next_try_at: float
    delay_s: float
    holder: str | None
    held_until: float | None

    def free_at(self) -> float:
        """When a try could next start: the slot's time, or the holder's end if later."""
        return max(self.next_try_at, self.held_until or 0.0)


@dataclass(frozen=True)
class LoginState:
    """A subject's recent failures (newest first) and its throttle row, read together."""

    failures: Sequence[LoginFailureRow]
    throttle: LoginThrottle | None


@dataclass(frozen=True)
class LoginPlan:
    """What the lock's rule (services/portal_logins.py) makes of a subject's state: `go`,
    `locked` (until `until`), `busy` (this user's tries under way would lock: look again at
    `until`), or `throttled` (the throttle row, if made now: first try at
    `first_try_at`, spaced by `first_delay_s`, doubling up to `max_delay_s`)."""

    action: Literal["go", "locked", "throttled", "busy"]
    until: float | None = None
    first_try_at: float = 0.0
    first_delay_s: float = 0.0
    max_delay_s: float = 0.0


@dataclass(frozen=True)
class LoginReservation:
    """What `reserve_login` did: the plan, whether the job's try is now recorded as under
    way (it counts as a failure until its outcome says otherwise), and, when throttled,
    the throttle row after the take."""

    plan: LoginPlan
    reserved: bool
    throttle: LoginThrottle | None = None


class LoginLockStore(Protocol):
    async def login_state(self, subject: str, since: float) -> LoginState:
        """`subject`'s failures after `since` (newest first; tries under way among them)
        and its throttle row, in one read."""
        ...

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
        """A login try for job `holder` of `user_id`, in one transaction that holds the
        subject's lock (concurrent tries for one username are decided one after another):
        the subject's state after `since` read, `decide`d on, and the try recorded as under
        way when the plan lets it go. Throttled, it goes only when the throttle's one try is
        taken: its row made when missing, taken when its time has come and no live holder
        has it (held `hold_s`), which doubles the spacing and moves the next try that far."""
        ...

    async def release_login_try(self, subject: str, holder: str) -> bool:
        """`holder`'s try given back (its run ended without a login verdict): no longer
        counted, and the throttle's try free again."""
        ...

    async def clear_login_subject(self, subject: str) -> int:
        """Forget `subject`'s failures and throttle (an unlock); the failures deleted."""
        ...

    async def login_failure_rows(self, since: float, limit: int) -> list[LoginFailureRow]:
        """Every subject's failures after `since`, newest first, at most `limit`."""
        ...

    async def login_throttles(self, subjects: Sequence[str]) -> list[LoginThrottle]:
        """The throttle rows of `subjects` that have one."""
        ...
