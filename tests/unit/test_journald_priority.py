"""Under journald (JOURNAL_STREAM set) every log line is `<N>` + one JSON object."""

from __future__ import annotations

import io
import json
import re

import structlog

from outboxd.observability import configure_logging

LINE = re.compile(r"^<(\d)>(\{.*\})$")


def _emit(env: dict[str, str]) -> list[str]:
    stream = io.StringIO()
    configure_logging(level="debug", fmt="json", stream=stream, env=env)
    log = structlog.get_logger("t")
    log.debug("d_event")
    log.info("i_event", password="hunter2")
    log.warning("w_event")
    log.error("e_event")
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        log.exception("x_event")
    log.critical("c_event")
    return stream.getvalue().splitlines()


def test_every_line_carries_the_syslog_priority_of_its_level() -> None:
    lines = _emit({"JOURNAL_STREAM": "8:12345"})
    assert len(lines) == 6, lines
    seen: dict[str, int] = {}
    for line in lines:
        m = LINE.match(line)
        assert m, line
        event = json.loads(m.group(2))  # exactly one JSON object after the prefix
        seen[event["event"]] = int(m.group(1))
    assert seen == {
        "d_event": 7,
        "i_event": 6,
        "w_event": 4,
        "e_event": 3,
        "x_event": 3,
        "c_event": 2,
    }
    assert "hunter2" not in "\n".join(lines)


def test_no_prefix_without_journald() -> None:
    lines = _emit({})
    assert len(lines) == 6
    for line in lines:
        assert line.startswith("{"), line
        json.loads(line)


def test_empty_journal_stream_is_not_journald() -> None:
    assert all(line.startswith("{") for line in _emit({"JOURNAL_STREAM": ""}))
