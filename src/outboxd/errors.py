"""The project's own exceptions: the core never sees a driver's or a library's."""

from __future__ import annotations


class OutboxdError(Exception):
    """Base of every error outboxd raises on purpose."""


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


class QuotaExceeded(OutboxdError):
    """A per-user cap is reached; `retry_after_s` is when trying again may succeed."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
