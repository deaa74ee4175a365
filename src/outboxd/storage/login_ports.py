"""What the portal login lock asks of storage: its records and its Protocol.

Beside storage/ports.py (one concern per Protocol, as there): failed logins counted per
portal username and per submitting user, the throttle of a username past the total
threshold, and the operator's view and unlock (docs/decisions/0028-login-lock-per-user.md).
A username appears here only as its subject: a keyed hash (security.py `login_subject`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class LoginFailure:
    """A PORTAL_AUTH_FAILED outcome to count for the login lock: its subject (a keyed hash,
    never the username), the user who submitted the job (None: not known), and the time
    before which that subject's older failures no longer matter (they are dropped in the
    same transaction). A job holding the subject's throttled try gives it back there too."""

    subject: str
    forget_before: float
    user_id: str | None = None


@dataclass(frozen=True)
class LoginFailureRow:
    """One recorded failed login: for whom (subject), from whom (user_id), when."""

    subject: str
    user_id: str | None
    failed_at: float


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
class LoginTry:
    """A request for a throttled subject's try: whether `holder` got it, and the row after."""

    taken: bool
    throttle: LoginThrottle


class LoginLockStore(Protocol):
    async def login_state(self, subject: str, since: float, limit: int) -> LoginState:
        """`subject`'s failures after `since` (newest first, at most `limit`) and its
        throttle row, in one read."""
        ...

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
        """The one try of a throttled subject, in one transaction: its throttle row made
        when missing (first try at `first_try_at`, spaced by `first_delay_s`); taken by
        `holder` when the row's time has come and no live holder has it, which doubles the
        spacing (at most `max_delay_s`) and moves the next try that far ahead."""
        ...

    async def release_login_try(self, subject: str, holder: str) -> bool:
        """`holder` gives the subject's try back (its run ended without a login verdict)."""
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
