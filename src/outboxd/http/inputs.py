"""The one place client input is parsed: every failure is an `InputError` (VALIDATION_FAILED).

Handlers never read `request.query`, `request.match_info` or the body themselves;
they call these functions, so nothing a client sends reaches a service or the
database before it was checked here. The checks are about what the bytes can be
(RFC 8259 JSON, valid Unicode, no NUL or control characters, bounded sizes and
depths), not about business rules, which stay in the handlers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any, Final, NoReturn

import msgspec
from aiohttp import web
from aiohttp.http_exceptions import HttpProcessingError

from outboxd.errors import OutboxdError
from outboxd.http.problems import (
    PAYLOAD_TOO_LARGE,
    UNSUPPORTED_MEDIA_TYPE,
    VALIDATION_FAILED,
    ApiError,
)
from outboxd.storage.ports import decode_cursor
from outboxd.tracing import parse_traceparent

# Nesting deeper than this is refused before anything walks it recursively.
MAX_JSON_DEPTH = 32
# Integers longer than this are not numbers any client means (and would hit
# Python's int-string limit long before reaching a row).
MAX_INT_DIGITS = 64
MAX_ID_CHARS = 128
_LIMIT_RE = re.compile(r"^[0-9]{1,4}$")


class InputError(OutboxdError, ValueError):
    """A client sent something this API does not accept; answered VALIDATION_FAILED."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NoSuchId(InputError):
    """A path id no row can have (NUL, control characters, too long); answered NOT_FOUND."""


def fail(field: str, message: str) -> NoReturn:
    raise InputError(field, message)


# Bidirectional embeddings, overrides and isolates (U+202A-U+202E, U+2066-U+2069): text
# holding them can display as something else (a name or URL spelt backwards, "Trojan Source").
BIDI_CONTROLS = frozenset(map(chr, (*range(0x202A, 0x202F), *range(0x2066, 0x206A))))


def bad_char(value: str, allow_bidi: bool = False) -> str | None:
    """Why `value` cannot be stored as text anywhere (None when it can); bidirectional
    controls are refused too unless `allow_bidi` (a password is never shown)."""
    if value.isascii() and value.isprintable():
        return None  # the usual case, without a loop in Python
    for c in value:
        o = ord(c)
        if o == 0:
            return "must not contain NUL characters"
        if o < 32 or 0x7F <= o < 0xA0:
            return "must not contain control characters"
        if 0xD800 <= o <= 0xDFFF:
            return "must not contain lone surrogates"
        if c in BIDI_CONTROLS and not allow_bidi:
            return "must not contain bidirectional controls (U+202A-U+202E, U+2066-U+2069)"
    return None


def no_bidi(field: str, value: str) -> None:
    """InputError when `value` holds a bidirectional control (for text checked otherwise)."""
    if not value.isascii() and not BIDI_CONTROLS.isdisjoint(value):
        fail(field, "must not contain bidirectional controls (U+202A-U+202E, U+2066-U+2069)")


def check_text(field: str, value: str, max_len: int) -> str:
    if len(value) > max_len:
        fail(field, f"must be at most {max_len} characters")
    why = bad_char(value)
    if why is not None:
        fail(field, why)
    return value


# ------------------------------------------------------------------ JSON bodies


def _no_constant(name: str) -> NoReturn:
    fail("body", f"is not RFC 8259 JSON ({name} is not a JSON number)")


def _int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INT_DIGITS:
        fail("body", f"holds an integer longer than {MAX_INT_DIGITS} digits")
    return int(text)


def _float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        fail("body", "holds a number too large for a double")
    return value


def _nesting(raw: str) -> int:
    """The deepest [ / { nesting outside strings, without recursion."""
    depth = deepest = 0
    in_string = escaped = False
    for c in raw:
        if in_string:
            if escaped:
                escaped = False
            elif c == "\\":
                escaped = True
            elif c == '"':
                in_string = False
        elif c == '"':
            in_string = True
        elif c in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif c in "]}":
            depth -= 1
    return deepest


def _check_strings(value: Any) -> None:
    """Every key and string value must be storable text (no NUL, no lone surrogate)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v:
                fail("body", "holds a NUL character (\\u0000)")
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                # JSON can spell lone UTF-16 surrogates ("\ud800"): valid JSON, not
                # valid Unicode; no cipher, HMAC or database driver can encode them.
                fail("body", "holds a string that is not valid Unicode (a lone surrogate)")
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)


_LONG_DIGITS = re.compile(rb"[0-9]{%d}" % (MAX_INT_DIGITS + 1))


def _could_be_refused(raw: bytes) -> bool:
    """Whether the strict path might refuse `raw` for its nesting or an integer's length.

    Counted on the bytes (a duplicate key's dropped value counts too, as it does there):
    at most MAX_JSON_DEPTH brackets cannot nest deeper, and without a run of more than
    MAX_INT_DIGITS digits no integer is that long.
    """
    return (
        raw.count(b"[") + raw.count(b"{") > MAX_JSON_DEPTH or _LONG_DIGITS.search(raw) is not None
    )


def _storable(value: Any) -> bool:
    """No NUL and no lone surrogate in any key or string value."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if "\x00" in v or (not v.isascii() and _lone_surrogate(v)):
                return False
        elif isinstance(v, dict):
            stack.extend(v)
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return True


def _lone_surrogate(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def decode_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` as a JSON object per RFC 8259, or InputError.

    msgspec decodes a body that passes the cheap byte checks; whatever it refuses, or
    what holds a string that cannot be stored, goes through the strict path below,
    which names the reason (so the answers are the same either way).
    """
    if not _could_be_refused(raw):
        try:
            fast = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            fast = None
        if isinstance(fast, dict) and _storable(fast):
            return fast
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        fail("body", "is not valid UTF-8")
    if _nesting(text) > MAX_JSON_DEPTH:
        fail("body", f"is nested deeper than {MAX_JSON_DEPTH} levels")
    try:
        value = json.loads(text, parse_constant=_no_constant, parse_int=_int, parse_float=_float)
    except InputError:
        raise
    except (ValueError, RecursionError, OverflowError):
        fail("body", "is not valid JSON")
    _check_strings(value)
    if not isinstance(value, dict):
        fail("body", "must be a JSON object")
    return value


# ------------------------------------------------------------------ URL parts


def path_id(request: web.Request, name: str, max_len: int = MAX_ID_CHARS) -> str:
    """A path parameter naming a row: short, printable text, or NoSuchId (it names
    nothing, so it is answered like a missing row and never reaches a query)."""
    value = request.match_info[name]
    if len(value) > max_len or bad_char(value) is not None:
        raise NoSuchId(name, "names no resource")
    return value


def query_text(request: web.Request, name: str, max_len: int) -> str | None:
    value = request.query.get(name)
    if value is None:
        return None
    return check_text(name, value, max_len)


def query_limit(request: web.Request, default: int = 50, maximum: int = 500) -> int:
    raw = request.query.get("limit")
    if raw is None:
        return default
    # `str.isdigit` accepts "²" and other digits `int` refuses: ASCII only.
    if not _LIMIT_RE.match(raw) or not 1 <= int(raw) <= maximum:
        fail("limit", f"must be an integer 1-{maximum}")
    return int(raw)


def query_cursor(request: web.Request) -> str | None:
    """The opaque cursor of a previous page, checked to decode to one we issued."""
    raw = request.query.get("cursor")
    if raw is None:
        return None
    if not raw:
        fail("cursor", "is empty (leave it out for the first page)")
    try:
        decode_cursor(raw)
    except ValueError:
        fail("cursor", "is not a cursor this server issued")
    return raw


def single_header(headers: Mapping[str, str], name: str) -> str | None:
    """A header that must appear at most once (a second Authorization is refused)."""
    getall = getattr(headers, "getall", None)
    if getall is None:
        return headers.get(name)
    values = getall(name, ())
    if len(values) > 1:
        fail(name, "must be sent once")
    return values[0] if values else None


# RFC 3339 date-time (section 5.6): what the OpenAPI document's `format: date-time` says.
_DATE_TIME_RE: Final = re.compile(
    r"^([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]{1,32})?"
    r"([Zz]|([+-])([0-9]{2}):([0-9]{2}))$"
)


def query_time(request: web.Request, name: str) -> float | None:
    """An RFC 3339 date-time query value as Unix seconds, or absent."""
    raw = request.query.get(name)
    return None if raw is None else parse_time(name, raw)


def parse_time(name: str, raw: str) -> float:
    """An RFC 3339 date-time (field `name`) as Unix seconds (a leap second counts as the
    next second's start)."""
    m = _DATE_TIME_RE.fullmatch(raw)
    if m is None:
        fail(name, "must be an RFC 3339 date-time, e.g. 2024-05-01T00:00:00Z")
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    fraction = float(m.group(7)) if m.group(7) else 0.0
    offset = timedelta(0)
    if m.group(9) is not None:
        hours, minutes = int(m.group(10)), int(m.group(11))
        if hours > 23 or minutes > 59:
            fail(name, "has an offset beyond 23:59")
        offset = timedelta(hours=hours, minutes=minutes) * (-1 if m.group(9) == "-" else 1)
    leap = second == 60
    try:
        when = datetime(year, month, day, hour, minute, 59 if leap else second, tzinfo=UTC)
        utc = when - offset
    except (ValueError, OverflowError):
        fail(name, "is not a date and time that exists")
    return utc.timestamp() + (1.0 if leap else 0.0) + fraction


ERROR_CODE_PATTERN: Final = "^[A-Z][A-Z0-9_]{0,63}$"
_ERROR_CODE_RE: Final = re.compile(ERROR_CODE_PATTERN)


def query_error_code(request: web.Request, name: str) -> str | None:
    raw = request.query.get(name)
    if raw is not None and not _ERROR_CODE_RE.fullmatch(raw):
        fail(name, "must be an error code: upper-case letters, digits and _ (1-64)")
    return raw


_AFTER_RE: Final = re.compile(r"^[0-9]{1,18}$")


def query_after(request: web.Request) -> int:
    """`after`: a timeline's last seen `seq` (0 or absent: from the start)."""
    raw = request.query.get("after")
    if raw is None:
        return 0
    if not _AFTER_RE.fullmatch(raw):
        fail("after", "must be an integer 0-999999999999999999 (a seq of this timeline)")
    return int(raw)


# ------------------------------------------------------------------ conditional, waiting, tracing

# RFC 7240 `wait=<delta-seconds>`, among other preferences (which are ignored).
_PREFER_WAIT_RE: Final = re.compile(r'^\s*wait\s*=\s*"?([0-9]{1,9})"?\s*(?:;.*)?$', re.IGNORECASE)
# RFC 9110 entity tags: "opaque" or W/"opaque"; weak and strong compare alike for If-None-Match.
_ETAG_RE: Final = re.compile(r'\s*(?:W/)?"([\x21\x23-\x7e\x80-\xff]*)"\s*')


def prefer_wait(request: web.Request, max_wait_s: int) -> int | None:
    """The seconds of a `Prefer: wait=N` (RFC 7240), at most `max_wait_s`; None when not asked
    (or 0). A preference that cannot be read is ignored, as the RFC says, never refused."""
    for header in request.headers.getall("Prefer", ()):
        for pref in header.split(","):
            m = _PREFER_WAIT_RE.match(pref)
            if m is not None:
                wait = min(int(m.group(1)), max_wait_s)
                return wait or None
    return None


def if_none_match(request: web.Request) -> list[str] | None:
    """The entity tags of If-None-Match (their opaque part; "*" for any), None when absent.
    What cannot be read as a tag matches nothing."""
    headers = request.headers.getall("If-None-Match", ())
    if not headers:
        return None
    tags: list[str] = []
    for header in headers:
        for part in header.split(","):
            if part.strip() == "*":
                tags.append("*")
                continue
            m = _ETAG_RE.fullmatch(part)
            if m is not None:
                tags.append(m.group(1))
    return tags


def traceparent(request: web.Request) -> str | None:
    """A valid W3C `traceparent`; a missing, repeated or malformed one is None (ignored: the
    daemon then starts a trace of its own)."""
    values = request.headers.getall("traceparent", ())
    return parse_traceparent(values[0]) if len(values) == 1 else None


def query_status(request: web.Request, allowed: tuple[str, ...]) -> str | None:
    """A `status` filter: one of `allowed`, or absent."""
    status = request.query.get("status")
    if status is not None and status not in allowed:
        fail("status", "must be one of: " + ", ".join(allowed))
    return status


def only_query(request: web.Request, allowed: set[str]) -> None:
    """A misspelt filter (`?stauts=DEAD`) must not silently list everything."""
    unknown = sorted(set(request.query) - allowed)
    if unknown:
        raise _unknown("unknown query parameters: ", "unknown query parameter", unknown)


def _unknown(prefix: str, message: str, unknown: list[str]) -> ApiError:
    return ApiError(
        VALIDATION_FAILED,
        prefix + ", ".join(k[:40] for k in unknown[:10]),
        [{"field": k[:64], "message": message} for k in unknown[:20]],
    )


# ------------------------------------------------------------------ request bodies


class ClientDisconnected(Exception):
    """The client hung up before its request arrived whole: its mistake, not ours."""


async def read_json_object(request: web.Request, max_bytes: int) -> dict[str, Any]:
    """The body as a JSON object, within `max_bytes`; VALIDATION_FAILED or PAYLOAD_TOO_LARGE."""
    ctype = request.content_type
    if ctype != "application/json" and not ctype.endswith("+json"):
        raise ApiError(
            UNSUPPORTED_MEDIA_TYPE,
            "Content-Type must be application/json",
            [{"field": "Content-Type", "message": "must be application/json"}],
        )
    if request.content_length is not None and request.content_length > max_bytes:
        raise ApiError(PAYLOAD_TOO_LARGE, f"the body is over {max_bytes} bytes")
    body = bytearray()
    try:
        async for chunk in request.content.iter_any():
            body += chunk
            if len(body) > max_bytes:
                raise ApiError(PAYLOAD_TOO_LARGE, f"the body is over {max_bytes} bytes")
    except (HttpProcessingError, web.RequestPayloadError):
        # A broken chunked framing or gzip/deflate stream, found while reading.
        fail("body", "is not a valid chunked, gzip or deflate stream")
    except ConnectionError:
        raise ClientDisconnected() from None
    return decode_json_object(bytes(body))


def check_fields(body: Mapping[str, Any], allowed: frozenset[str]) -> None:
    """Unknown fields are refused, all of them named."""
    if body.keys() <= allowed:
        return
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise _unknown("unknown fields: ", "unknown field", unknown)
