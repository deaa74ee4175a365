"""Log redaction, through the configured processor chain: what a JSON log line carries.

Secret-named keys are replaced wherever they appear (top level or nested), and a URL's
`user:password@` part is scrubbed from any string value, keeping the user.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from outboxd.observability import configure_logging

SECRET = "s3cr3t-Pa55-value"


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("debug", "json", stream)
    try:
        yield stream
    finally:
        structlog.reset_defaults()


def logged(stream: io.StringIO, **fields: Any) -> tuple[str, dict[str, Any]]:
    """One event through the configured processor chain: (the JSON line, parsed)."""
    stream.seek(0)
    stream.truncate()
    structlog.get_logger("redaction-test").info("test_event", **fields)
    line = stream.getvalue().strip()
    assert line, "nothing was logged"
    event: dict[str, Any] = json.loads(line)
    assert event["event"] == "test_event"
    return line, event


@pytest.mark.parametrize("key", ["password", "db_password", "pwd"])
def test_a_secret_named_key_is_redacted(log_lines: io.StringIO, key: str) -> None:
    line, event = logged(log_lines, **{key: SECRET, "username": "20201234"})
    assert SECRET not in line
    assert event["username"] == "20201234"
    assert key in event  # the key stays, so the line still says a value was there


def test_a_nested_password_is_redacted_and_its_siblings_kept(log_lines: io.StringIO) -> None:
    line, event = logged(
        log_lines, request={"username": "20201234", "password": SECRET, "portal": "suwon"}
    )
    assert SECRET not in line
    assert event["request"]["username"] == "20201234"
    assert event["request"]["portal"] == "suwon"
    assert "password" in event["request"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("url", f"postgresql://u:{SECRET}@h/db"),
        ("detail", f"could not connect to postgresql://u:{SECRET}@h:5432/db: refused"),
        ("nested", {"target": f"postgresql://u:{SECRET}@h/db"}),
        ("error", RuntimeError(f"failed on postgresql://u:{SECRET}@h/db")),
    ],
)
def test_a_urls_password_is_scrubbed_and_the_user_kept(
    log_lines: io.StringIO, field: str, value: Any
) -> None:
    line, _ = logged(log_lines, **{field: value})
    assert SECRET not in line
    assert "postgresql://u:" in line and "@h" in line
