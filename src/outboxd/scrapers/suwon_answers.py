"""What the Suwon portal's answers mean (docs/portal.md): its failures as PortalError, the
refusals a login page shows, and the info system's JSON mapped from its vocabulary (the
Korean source names) to the record's English names.

scrapers/suwon.py makes the requests and hands their bodies here; nothing here does I/O.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any, Final, Literal

from outboxd.errors import OutboxdError

PortalErrorCode = Literal[
    "PORTAL_AUTH_FAILED", "PORTAL_UNAVAILABLE", "PORTAL_SESSION_EXPIRED", "PORTAL_BAD_RESPONSE"
]


class PortalError(OutboxdError):
    """A job-level portal failure; `message` is short English text without secrets or bodies."""

    def __init__(
        self,
        code: PortalErrorCode,
        message: str,
        *,
        retryable: bool | None = None,
        outage: bool = False,
    ) -> None:
        super().__init__(message)
        self.code: PortalErrorCode = code
        self.message = message
        # Only a credential problem is final: retrying a rejected login can lock the account.
        self.retryable = code != "PORTAL_AUTH_FAILED" if retryable is None else retryable
        # The portal did not answer (refused, reset, timed out, a 5xx): its breaker counts it.
        self.outage = outage

    def __str__(self) -> str:
        return self.message

    def __repr__(self) -> str:
        return (
            f"PortalError(code={self.code!r}, message={self.message!r}, "
            f"retryable={self.retryable!r}, outage={self.outage!r})"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_portal_error, (self.code, self.message, self.retryable, self.outage))


def _rebuild_portal_error(
    code: PortalErrorCode, message: str, retryable: bool, outage: bool = False
) -> PortalError:
    return PortalError(code, message, retryable=retryable, outage=outage)


# Legacy Korean pages may come as EUC-KR, with or without a charset header, so the markers
# are looked for as bytes in both encodings rather than trusting a decode.
_WRONG_CREDENTIALS: Final = ("비밀번호가 일치하지 않습니다", "존재하지 않는 사용자", "로그인 실패")
_LOCKED: Final = ("잠금",)
# A whole word only: "isLocked"-style identifiers in a normal page's script must not match.
_LOCKED_WORD_RE: Final = re.compile(rb"\blocked\b", re.IGNORECASE)

# --- Source names -> result names: the only place that knows the info system's vocabulary --

_Kind = Literal["text", "number", "term"]
# The credit figures a semester and the totals row both carry, under the same names.
_CREDIT_FIELDS: Final[tuple[tuple[str, str, _Kind], ...]] = (
    ("creditsAttempted", "applPoint", "number"),
    ("creditsEarned", "gainPoint", "number"),
    ("gpa", "gainAvmk", "number"),
    ("percentile", "gainTavgPont", "number"),
)
_FIELD_MAP: Final[Mapping[str, tuple[tuple[str, str, _Kind], ...]]] = {
    "student": (
        ("studentNumber", "sno", "text"),
        ("name", "nm", "text"),
        ("college", "colNm", "text"),
        ("department", "deptNm", "text"),
        ("major", "majorNm", "text"),
        ("status", "studStatNm", "text"),
        ("year", "grade", "number"),
    ),
    "semester": (
        ("year", "cretGainYear", "number"),
        ("term", "cretSmrCd", "term"),
        *_CREDIT_FIELDS,
        ("rank", "dpmjOrdp", "text"),
    ),
    "course": (
        ("code", "subjtCd", "text"),
        ("title", "subjtNm", "text"),
        ("credits", "gainPoint", "number"),
        ("grade", "cretGrdCd", "text"),
        ("gradePoints", "gainGpa", "number"),
        ("category", "facDvnm", "text"),
        ("department", "estbDpmjNm", "text"),
    ),
    "totals": _CREDIT_FIELDS,
}
_TERMS: Final[Mapping[str, str]] = {"10": "1", "15": "summer", "20": "2", "25": "winter"}
PROFILE_KEY: Final = "studentInfo"
SEMESTERS_KEY: Final = "listSmrCretSumTabYearSmr"
TOTALS_KEY: Final = "selectSmrCretSumTabSjTotal"
COURSES_KEY: Final = "listSmrCretSumTabSubjt"
SEMESTER_YEAR: Final = "cretGainYear"
SEMESTER_CODE: Final = "cretSmrCd"
SESSION_ERROR_KEYS: Final = ("errorMessage", "errorCode")

_INT_RE: Final = re.compile(r"[+-]?[0-9]+")
_FLOAT_RE: Final = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def bad_response(message: str) -> PortalError:
    return PortalError("PORTAL_BAD_RESPONSE", message)


def _encoded(markers: tuple[str, ...]) -> tuple[bytes, ...]:
    return tuple(m.encode(enc) for m in markers for enc in ("utf-8", "euc-kr"))


_WRONG_CREDENTIALS_BYTES: Final = _encoded(_WRONG_CREDENTIALS)
_LOCKED_BYTES: Final = _encoded(_LOCKED)


def _contains_any(body: bytes, markers: tuple[bytes, ...]) -> bool:
    return any(m in body for m in markers)


def _number(value: Any, source: str) -> int | float | None:
    if value is None or value == "":
        return None
    if isinstance(value, bool):
        raise bad_response(f"field {source} is not a number")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        raise bad_response(f"field {source} is not a finite number")
    if isinstance(value, str):
        text = value.strip()
        if _INT_RE.fullmatch(text):
            return int(text)
        if _FLOAT_RE.fullmatch(text):
            return float(text)
    raise bad_response(f"field {source} is not a number")


def _text(value: Any, source: str) -> str | None:
    if value is None:
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise bad_response(f"field {source} is not text")


def _term(value: Any, source: str) -> str:
    code = _text(value, source)
    term = _TERMS.get(code.strip()) if code is not None else None
    if term is None:
        raise bad_response(f"field {source} is not a known semester code")
    return term


def map_section(section: str, row: Any) -> dict[str, Any]:
    """Renames and converts one source object; an absent or null leaf becomes None."""
    if not isinstance(row, dict):
        raise bad_response(f"{section} is not an object")
    out: dict[str, Any] = {}
    for name, source, kind in _FIELD_MAP[section]:
        value = row.get(source)
        if kind == "number":
            out[name] = _number(value, source)
        elif kind == "term":
            out[name] = _term(value, source)
        else:
            out[name] = _text(value, source)
    return out


def list_of(data: Mapping[str, Any], key: str) -> list[Any]:
    value = data.get(key, ...)
    if value is None:
        return []
    if not isinstance(value, list):
        raise bad_response(f"{key} is missing or not a list")
    return value


def json_object(body: bytes) -> dict[str, Any]:
    try:
        data = json.loads(body)
    except ValueError:
        # `from None`: a decode error carries the whole body, which may hold personal data.
        raise bad_response("info system answered something that is not JSON") from None
    if not isinstance(data, dict):
        raise bad_response("info system answered JSON that is not an object")
    return data


def login_refused(body: bytes) -> str | None:
    """Why the portal refused a login, by its answer page; None when it did not."""
    if _contains_any(body, _WRONG_CREDENTIALS_BYTES):
        return "portal rejected the username or password"
    if _contains_any(body, _LOCKED_BYTES) or _LOCKED_WORD_RE.search(body):
        return "portal account is locked"
    return None
