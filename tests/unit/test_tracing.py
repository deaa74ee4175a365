"""Trace context (outboxd/tracing.py): which traceparent headers are kept, and the daemon
running without the otel extra."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
import structlog

from outboxd.tracing import NO_TRACING, Tracing, new_traceparent, parse_traceparent, trace_id_of
from tests.support.logs import json_lines

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"


@pytest.mark.parametrize(
    ("value", "kept"),
    [
        (f"00-{TRACE}-{SPAN}-01", f"00-{TRACE}-{SPAN}-01"),
        (f"00-{TRACE}-{SPAN}-00", f"00-{TRACE}-{SPAN}-00"),
        (f"  00-{TRACE}-{SPAN}-01  ", f"00-{TRACE}-{SPAN}-01"),
        # A later version is read as its first four fields.
        (f"01-{TRACE}-{SPAN}-01-whatever", f"00-{TRACE}-{SPAN}-01"),
        (f"00-{TRACE}-{SPAN}-01-extra", None),  # version 00 has exactly four
        (f"ff-{TRACE}-{SPAN}-01", None),
        (f"00-{'0' * 32}-{SPAN}-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE.upper()}-{SPAN}-01", None),
        (f"00-{TRACE[:-1]}-{SPAN}-01", None),
        ("", None),
        ("garbage", None),
        (None, None),
        ("00-" + "a" * 600, None),
    ],
)
def test_only_a_valid_traceparent_is_kept(value: str | None, kept: str | None) -> None:
    assert parse_traceparent(value) == kept


def test_a_new_span_stays_in_its_parents_trace() -> None:
    parent = f"00-{TRACE}-{SPAN}-00"
    child = new_traceparent(parent)
    assert parse_traceparent(child) == child
    assert trace_id_of(child) == TRACE and child.endswith("-00") and SPAN not in child
    root = new_traceparent()
    assert parse_traceparent(root) == root and trace_id_of(root) != TRACE
    with NO_TRACING.span("x", parent) as tp:
        assert trace_id_of(tp) == TRACE
    assert trace_id_of(None) is None


def test_the_daemon_runs_without_the_otel_extra() -> None:
    """With opentelemetry not importable and an endpoint set, tracing is off (logged), trace
    context still works, and nothing of the daemon imports it."""
    code = """
import sys

class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError("not installed")
        return None

sys.meta_path.insert(0, Block())
import outboxd.cli, outboxd.daemon.app, outboxd.http.app, outboxd.workers.consumer
from outboxd.tracing import NO_TRACING, configure_tracing
tracing = configure_tracing({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}, "x")
assert tracing is NO_TRACING and not tracing.enabled
with tracing.span("x", None) as tp:
    assert tp.startswith("00-") and len(tp) == 55
assert not [m for m in sys.modules if m.startswith("opentelemetry")]
print("ran without it")
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert "ran without it" in out.stdout
    assert "tracing_unavailable" in out.stdout + out.stderr


async def test_a_span_unbinds_its_trace_id_when_it_ends() -> None:
    """A line logged after a span ended, in the same task, carries no trace_id (not the
    ended span's); a span inside another gives the outer one's back when it ends."""
    log = structlog.get_logger("test")
    tracing = Tracing()

    async def work() -> tuple[str, str]:
        with tracing.span("outer", None) as outer:
            log.info("in_outer")
            with tracing.span("inner", None) as inner:  # a trace of its own
                log.info("in_inner")
            log.info("back_in_outer")
        log.info("after")
        return outer, inner

    with json_lines() as lines:
        outer, inner = await asyncio.create_task(work())
    trace_ids = {e["event"]: e.get("trace_id") for e in lines()}
    assert trace_id_of(outer) != trace_id_of(inner)
    assert trace_ids == {
        "in_outer": trace_id_of(outer),
        "in_inner": trace_id_of(inner),
        "back_in_outer": trace_id_of(outer),
        "after": None,
    }
