"""Log redaction: secrets by exact key or secret-looking name with a non-number value;
counts named like secrets (`dead_credentials`) survive."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
import structlog

from outboxd.observability import REDACTED, configure_logging, redact_secrets


def _logged(**fields: Any) -> dict[str, Any]:
    stream = io.StringIO()
    configure_logging("debug", "json", stream=stream)
    try:
        structlog.get_logger("t").info("event_under_test", **fields)
    finally:
        configure_logging("info", "json")
    line: dict[str, Any] = json.loads(stream.getvalue().splitlines()[-1])
    return line


def test_prune_counts_survive() -> None:
    counts = {"relay_sent": 4, "dead_credentials": 2, "finished_jobs": 3, "finished_tasks": 0}
    line = _logged(task_id="t1", **counts)
    for key, n in counts.items():
        assert line[key] == n, line


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("password", "hunter2-secret"),
        ("password", 123456),  # an exact key is redacted whatever its value
        ("db_password", "hunter2-secret"),
        ("pwd", "hunter2-secret"),
        ("passwd", "hunter2-secret"),
        ("Authorization", "Bearer hunter2-secret"),
        ("token", "hunter2-secret"),
        ("api_key", "hunter2-secret"),
        ("aws_secret_access_key", "hunter2-secret"),
        ("set-cookie", "sid=hunter2-secret"),
        ("credentials", "hunter2-secret"),
        ("sealed", "aGVsbG8taHVudGVyMi1zZWNyZXQ="),
    ],
)
def test_secret_keys_are_redacted(key: str, value: Any) -> None:
    line = _logged(**{key: value})
    assert line[key] == REDACTED
    assert "hunter2" not in json.dumps(line) and "123456" not in json.dumps(line)


def test_nested_passwords_and_url_passwords_are_redacted() -> None:
    line = _logged(
        request={"body": {"username": "u", "password": "hunter2-secret"}, "n": [{"pwd": "x1"}]},
        url="postgresql://u:hunter2-secret@h/db",
        error="connect to postgresql://app:hunter2-secret@db:5432/x failed",
    )
    text = json.dumps(line)
    assert "hunter2" not in text and '"x1"' not in text
    assert line["request"]["body"]["username"] == "u"
    assert line["url"] == "postgresql://u:***@h/db"


def test_the_processor_alone() -> None:
    event = {
        "event": "e",
        "dead_credentials": 5,
        "tokens_configured": 2,
        "password": None,
        "db_password": "p",
    }
    out = redact_secrets(None, "info", dict(event))
    assert out["dead_credentials"] == 5 and out["tokens_configured"] == 2
    assert out["password"] == REDACTED and out["db_password"] == REDACTED
