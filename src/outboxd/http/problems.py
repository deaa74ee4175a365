"""The API's problem codes, defined once: code, name, HTTP status, title and meaning.

Everything else names a problem by its constant (`NOT_FOUND`), never by its code: the
handlers raise `ApiError(NOT_FOUND, ...)`, the OpenAPI document describes each route's
error responses from the kinds its route table entry lists, the Problem schema's enum
comes from `PROBLEMS`, and the listener's own answers (a parser error, a full server)
render through `problem_body`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, Final

from outboxd.errors import OutboxdError


@dataclass(frozen=True)
class ProblemKind:
    code: str
    name: str
    status: int
    title: str
    meaning: str  # one line for the OpenAPI document: when a client gets it
    headers: tuple[str, ...] = ()  # response headers it always or may carry
    variant: str | None = None  # names a second status of one code (documents it apart)

    @property
    def label(self) -> str:
        """The document's name for it (components.responses), unique per (code, status)."""
        return "".join(w.capitalize() for w in (self.variant or self.name).split("_"))


VALIDATION_FAILED: Final = ProblemKind(
    "C01", "VALIDATION_FAILED", 400, "The request is not valid", "the request is not valid"
)
UNAUTHENTICATED: Final = ProblemKind(
    "C02",
    "UNAUTHENTICATED",
    401,
    "Authentication is required",
    "a valid bearer token is required",
    headers=("WWW-Authenticate",),
)
FORBIDDEN: Final = ProblemKind("C03", "FORBIDDEN", 403, "Not allowed", "the admin role is required")
NOT_FOUND: Final = ProblemKind("C04", "NOT_FOUND", 404, "Not found", "not found (or not yours)")
PAYLOAD_TOO_LARGE: Final = ProblemKind(
    "C05",
    "PAYLOAD_TOO_LARGE",
    413,
    "The request body is too large",
    "the body is over server.max_body_bytes",
)
IDEMPOTENCY_KEY_REQUIRED: Final = ProblemKind(
    "C06",
    "IDEMPOTENCY_KEY_REQUIRED",
    400,
    "An Idempotency-Key header is required",
    "the Idempotency-Key is missing, empty, over 255 characters or not visible ASCII",
)
IDEMPOTENCY_KEY_CONFLICT: Final = ProblemKind(
    "C07",
    "IDEMPOTENCY_KEY_CONFLICT",
    409,
    "The Idempotency-Key was used for another request",
    "the Idempotency-Key was used with a different request",
)
ENQUEUE_FAILED: Final = ProblemKind(
    "C08",
    "ENQUEUE_FAILED",
    503,
    "The job could not be put on the queue",
    "stored but not queued (api.require_dispatch = true; retry with the same key)",
    headers=("Retry-After",),
)
STORAGE_UNAVAILABLE: Final = ProblemKind(
    "C09",
    "STORAGE_UNAVAILABLE",
    503,
    "The database is unavailable",
    "the database is unavailable; nothing was half-written",
    headers=("Retry-After",),
)
METHOD_NOT_ALLOWED: Final = ProblemKind(
    "C10",
    "METHOD_NOT_ALLOWED",
    405,
    "Method not allowed",
    "the path exists, the method does not (every path answers this for methods it does not list)",
    headers=("Allow",),
)
INVALID_STATE: Final = ProblemKind(
    "C11",
    "INVALID_STATE",
    409,
    "The operation does not apply in the current state",
    "the operation does not apply in the current state",
)
TOO_MANY_ACTIVE_JOBS: Final = ProblemKind(
    "C12",
    "TOO_MANY_ACTIVE_JOBS",
    429,
    "Too many jobs or websites for this user",
    "a per-user cap is reached (api.max_active_jobs_per_user, "
    "api.max_websites_per_user_per_hour); retry after Retry-After",
    headers=("Retry-After",),
)
HEADERS_TOO_LARGE: Final = ProblemKind(
    "C13",
    "HEADERS_TOO_LARGE",
    431,
    "The request's headers are too large",
    "the request line and headers are over server.max_header_bytes or 64 fields",
)
INTERNAL_ERROR: Final = ProblemKind(
    "C99", "INTERNAL_ERROR", 500, "Internal error", "internal error"
)

# One code at a second status: documented apart, answered with the same code and name.
UNSUPPORTED_MEDIA_TYPE: Final = replace(
    VALIDATION_FAILED,
    status=415,
    meaning="Content-Type must be application/json",
    variant="UNSUPPORTED_MEDIA_TYPE",
)
REQUEST_TIMEOUT: Final = replace(
    VALIDATION_FAILED,
    status=408,
    meaning="the request did not arrive within server.read_timeout_s",
    variant="REQUEST_TIMEOUT",
)
# Auth-off mode only (no [[auth.tokens]]): a request addressed to a name that is not loopback.
MISDIRECTED_REQUEST: Final = replace(
    FORBIDDEN,
    status=421,
    title="Misdirected request",
    meaning="with no [[auth.tokens]], the Host must be a loopback name or address",
    variant="MISDIRECTED_REQUEST",
)
TOO_MANY_CONNECTIONS: Final = replace(
    STORAGE_UNAVAILABLE,
    title="Service unavailable",
    meaning="too many open connections (server.max_connections); retry later",
    variant="TOO_MANY_CONNECTIONS",
)

PROBLEMS: Final[tuple[ProblemKind, ...]] = (
    VALIDATION_FAILED,
    UNAUTHENTICATED,
    FORBIDDEN,
    NOT_FOUND,
    PAYLOAD_TOO_LARGE,
    IDEMPOTENCY_KEY_REQUIRED,
    IDEMPOTENCY_KEY_CONFLICT,
    ENQUEUE_FAILED,
    STORAGE_UNAVAILABLE,
    METHOD_NOT_ALLOWED,
    INVALID_STATE,
    TOO_MANY_ACTIVE_JOBS,
    HEADERS_TOO_LARGE,
    INTERNAL_ERROR,
)
PROBLEM_CODES: Final = tuple(p.code for p in PROBLEMS)
PROBLEM_TYPE: Final = "urn:outboxd:problem:"


class ApiError(OutboxdError):
    """A request answered with a problem: its kind, and what went wrong in words."""

    def __init__(
        self,
        kind: ProblemKind,
        detail: str,
        errors: list[dict[str, str]] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(detail)
        self.kind = kind
        self.status = kind.status
        self.detail = detail
        self.errors = errors
        self.headers = dict(headers or {})


def field_error(field: str, message: str) -> ApiError:
    """VALIDATION_FAILED for one field, with its field-by-field entry."""
    return ApiError(
        VALIDATION_FAILED, f"{field}: {message}", [{"field": field, "message": message}]
    )


def problem_body(
    kind: ProblemKind,
    detail: str,
    request_id: str,
    errors: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    """The RFC 9457 body (the Problem schema)."""
    body: dict[str, Any] = {
        "type": PROBLEM_TYPE + kind.name,
        "title": kind.title,
        "status": kind.status,
        "detail": detail,
        "code": kind.code,
        "requestId": request_id,
    }
    if errors is not None:
        body["errors"] = errors
    return body
