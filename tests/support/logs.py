"""outboxd's JSON log lines as the daemon writes them (its processor chain, bound context
variables merged), captured for a test: `capture_logs` leaves the context variables out."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from outboxd.observability import configure_logging


class Lines:
    def __init__(self, stream: io.StringIO) -> None:
        self._stream = stream

    def __call__(self, event: str | None = None) -> list[dict[str, Any]]:
        """Every line so far (parsed), or those of `event`."""
        out = [json.loads(line) for line in self._stream.getvalue().splitlines() if line]
        return out if event is None else [e for e in out if e.get("event") == event]


@contextmanager
def json_lines(level: str = "debug") -> Iterator[Lines]:
    """configure_logging's JSON lines into a buffer, the previous configuration restored
    after."""
    saved = structlog.get_config()
    stream = io.StringIO()
    configure_logging(level, "json", stream=stream)
    try:
        yield Lines(stream)
    finally:
        structlog.configure(**saved)
