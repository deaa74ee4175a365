"""The HTTP layer's fast paths answer exactly as the slow ones they stand in for.

- `observability.log_request` writes the same JSON object structlog's chain renders for
  `log.info("http_request", ...)`, honours the level and the journald prefix, and falls
  back to structlog when logging was configured some other way (capture_logs).
- `observability.log_info` (the service's `job_accepted` line) does the same for any event
  of plain fields, with the bound context variables, and redacts secrets as the chain does.
- `inputs.decode_json_object` decodes with msgspec only what the strict parser would
  accept as it is; everything else gets the strict parser's answer.
- `checks.check_text_fields` reads its limits from the models (one definition).
"""

from __future__ import annotations

import io
import json
import re

import pytest
import structlog
from structlog.testing import capture_logs

from outboxd.http import checks, inputs, models
from outboxd.observability import configure_logging, log_info, log_request

FIELDS = {
    "request_id": "req-1",
    "method": "POST",
    "route": "/v1/portal-link-jobs",
    "status": 202,
    "duration_ms": 1.25,
}
ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def _line(level: str = "info", env: dict[str, str] | None = None) -> tuple[str, str]:
    """(the fast line, structlog's line for the same event), both as written."""
    fast, slow = io.StringIO(), io.StringIO()
    configure_logging(level, "json", stream=fast, env=env or {})
    log_request(**FIELDS)  # type: ignore[arg-type]
    configure_logging(level, "json", stream=slow, env=env or {})
    structlog.get_logger("t").info("http_request", **FIELDS)
    configure_logging("info", "json")
    return fast.getvalue(), slow.getvalue()


def test_the_request_line_is_the_object_structlog_would_write() -> None:
    fast, slow = _line()
    one, other = json.loads(fast), json.loads(slow)
    assert fast.endswith("\n") and fast.count("\n") == 1
    assert ISO_UTC.match(one.pop("timestamp")) and ISO_UTC.match(other.pop("timestamp"))
    assert one == other == {**FIELDS, "event": "http_request", "level": "info"}


def test_the_request_line_follows_the_level_and_the_journald_prefix() -> None:
    assert _line("warning") == ("", "")
    fast, slow = _line(env={"JOURNAL_STREAM": "8:1"})
    assert fast.startswith("<6>{") and slow.startswith("<6>{")


def test_the_request_line_goes_through_structlog_when_it_was_configured_otherwise() -> None:
    stream = io.StringIO()
    configure_logging("info", "json", stream=stream)
    try:
        with capture_logs() as logs:
            log_request(**FIELDS)  # type: ignore[arg-type]
    finally:
        configure_logging("info", "json")
    assert stream.getvalue() == ""
    assert logs == [{**FIELDS, "event": "http_request", "log_level": "info"}]


def _info_lines(fields: dict[str, object], level: str = "info") -> tuple[str, str]:
    """(log_info's line, structlog's line for the same event), with a bound context."""
    fast, slow = io.StringIO(), io.StringIO()
    structlog.contextvars.bind_contextvars(request_id="req-9", db_password="hunter2")
    try:
        configure_logging(level, "json", stream=fast, env={})
        log_info("job_accepted", dict(fields))
        configure_logging(level, "json", stream=slow, env={})
        structlog.get_logger("t").info("job_accepted", **fields)
    finally:
        structlog.contextvars.unbind_contextvars("request_id", "db_password")
        configure_logging("info", "json")
    return fast.getvalue(), slow.getvalue()


def test_an_info_line_is_the_object_structlog_would_write() -> None:
    fields = {"job_id": "j-1", "outbox_id": None, "token": "t0ps3cret", "n": 3}
    fast, slow = _info_lines(fields)
    one, other = json.loads(fast), json.loads(slow)
    assert fast.endswith("\n") and fast.count("\n") == 1
    assert ISO_UTC.match(one.pop("timestamp")) and ISO_UTC.match(other.pop("timestamp"))
    assert one == other
    assert one["token"] == one["db_password"] == "[redacted]" and "hunter2" not in fast
    assert one["request_id"] == "req-9" and one["event"] == "job_accepted"
    assert _info_lines(fields, "warning") == ("", "")


def test_an_info_line_with_lists_is_the_object_structlog_would_write() -> None:
    # The relay's `outbox_sent` line: a batch's ids as lists, through the fast path.
    fields = {
        "count": 2,
        "outbox_ids": ["o-1", "o-2"],
        "job_ids": ["j-1", None],
        "message_ids": ["m-1", "see postgres://u:pw@h/db"],
        "api_tokens": ["t0ps3cret", "other"],
        "task_ids": [],
    }
    fast, slow = _info_lines(fields)
    one, other = json.loads(fast), json.loads(slow)
    one.pop("timestamp"), other.pop("timestamp")
    assert one == other
    assert one["outbox_ids"] == ["o-1", "o-2"] and one["task_ids"] == []
    assert one["api_tokens"] == "[redacted]" and "t0ps3cret" not in fast
    assert one["message_ids"][1] == "see postgres://u:***@h/db" and "pw@" not in fast


def test_an_info_line_with_other_values_goes_through_structlog() -> None:
    fields = {
        "job_id": "j-1",
        "dsn_hint": "postgres://u:pw@h/db",
        "error": ValueError("postgres://u:pw@h/db failed"),
        "nested": [{"password": "hunter3"}],
    }
    fast, slow = _info_lines(fields)
    one, other = json.loads(fast), json.loads(slow)
    one.pop("timestamp"), other.pop("timestamp")
    assert one == other and "pw@" not in fast and "hunter3" not in fast


@pytest.mark.parametrize(
    "raw",
    [
        b'{"a": 1}',
        b'{"portal": "suwon", "username": "u", "password": "p\\u00e9"}',
        b'{"a": [1, 2.5, -0, true, null, {"b": "c"}]}',
        b'{"a": 1, "a": 2}',
        b' {"a": "x"} ',
        b'{"a": ' + b"[" * 32 + b"]" * 32 + b"}",
        b'{"a": ' + b"[" * 31 + b"]" * 31 + b"}",
        b'{"a": ' + b"9" * 64 + b"}",
        b'{"a": ' + b"9" * 65 + b"}",
        b'{"a": "' + b"9" * 80 + b'"}',
        b'{"a": [[1]], "a": ' + b"[" * 40 + b"]" * 40 + b"}",
        b'{"a": 1, "a": ' + b"1" * 70 + b"}",
        b'{"a": NaN}',
        b'{"a": 1e400}',
        b'{"a": "\\u0000"}',
        b'{"a": "\\ud800"}',
        b'{"\\ud800": 1}',
        b'{"a": "\xff"}',
        b"\xef\xbb\xbf{}",
        b"[1]",
        b'"text"',
        b"{} x",
        b"",
    ],
)
def test_the_fast_decoder_answers_as_the_strict_one(raw: bytes) -> None:
    def outcome(decode: object) -> object:
        try:
            return ("ok", decode(raw))  # type: ignore[operator]
        except inputs.InputError as exc:
            return ("refused", exc.field, exc.message)

    assert outcome(inputs.decode_json_object) == outcome(_strict_only)


def _strict_only(raw: bytes) -> object:
    """decode_json_object with its byte checks forcing the strict path."""
    original = inputs._could_be_refused
    inputs._could_be_refused = lambda _raw: True
    try:
        return inputs.decode_json_object(raw)
    finally:
        inputs._could_be_refused = original


def test_request_checks_take_their_limits_from_the_models() -> None:
    check = checks.check_text_fields(models.PortalLinkRequest, ("portal", "username", "password"))
    good = {"portal": "suwon", "username": "u", "password": "p"}
    assert check(good) == good
    for body, field, message in [
        ({}, "portal", "is required"),
        ({**good, "portal": "elsewhere"}, "portal", "must be one of: suwon"),
        ({**good, "username": 7}, "username", "must be a string"),
        ({**good, "username": "  "}, "username", "must not be empty"),
        ({**good, "username": "x" * 65}, "username", "must be at most 64 characters"),
        ({**good, "password": "a\x00b"}, "password", "must not contain NUL characters"),
    ]:
        with pytest.raises(inputs.InputError) as caught:
            check(body)
        assert (caught.value.field, caught.value.message) == (field, message)
    assert checks.wire_names(models.WebsiteRequest) == {"domain", "faviconUrl"}
    optional = checks.check_text_fields(models.TaskRequest, ("dedup_id",))
    assert optional({}) == optional({"dedupId": None}) == {"dedup_id": None}
