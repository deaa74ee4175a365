"""The project's own exceptions: the core never sees a driver's or a library's."""

from __future__ import annotations


class OutboxdError(Exception):
    """Base of every error outboxd raises on purpose: those here, and the ones that belong to
    one layer, defined where they are raised (`ConfigError`, `CronError`, `QueueError`,
    `EmbeddedSqsError`, `PortalError`, `ClassificationError` and `RateLimited`,
    `InvalidDomain`, `InputError`, `ApiError`, `SchemaMismatch`, the intake's refusals).
    `outboxd`'s commands catch this base alone. Not errors, and so not under it: the signals
    a loop or a handler uses to stop early (`JobCancelled`, `ClientDisconnected`,
    `HeadersTooLarge`) and `SqsFault`, a raw SQS answer that `queue/failures.py` always
    turns into a `QueueError`."""


class StorageError(OutboxdError):
    """The database refused or failed an operation (not a caller's mistake)."""


class StorageUnavailable(StorageError):
    """The database cannot be reached, or no connection was free in time."""


class NotFound(OutboxdError):
    """The named row does not exist (or is not visible to the caller)."""


class InvalidState(OutboxdError):
    """The operation does not apply to the row's current state."""


class SecurityError(OutboxdError):
    """Key material is missing or a ciphertext cannot be opened."""


class CapReached(OutboxdError):
    """The store refused a write past a per-user cap, counted in the transaction that would
    have written it: `count` of the user's rows count toward the cap (for a cap per period,
    `oldest` is the time of the oldest of them)."""

    def __init__(self, count: int, oldest: float | None = None) -> None:
        super().__init__(f"{count} counted toward the cap")
        self.count = count
        self.oldest = oldest


class QuotaExceeded(OutboxdError):
    """A per-user cap is reached; `retry_after_s` is when trying again may succeed."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
