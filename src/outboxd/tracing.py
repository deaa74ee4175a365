"""Trace context: W3C `traceparent` values, and optional OpenTelemetry spans.

A portal job carries one trace from the request that made it to the worker that runs it:
the API keeps a valid incoming `traceparent` (or starts a trace), stores it with the job,
the relay sends it as an SQS message attribute, and the consumer continues it. Log lines
about the job carry its `trace_id`.

Spans are sent only with the `outboxd[otel]` extra installed and
OTEL_EXPORTER_OTLP_ENDPOINT (or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) set; the imports are
guarded, so without the extra every span here is a no-op that still hands out trace
context.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator, Mapping
from contextvars import Token
from typing import Any, Final

import structlog

from outboxd.security import random_bytes

log = structlog.get_logger(__name__)

# version 00: "00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>", lowercase. A later
# version may append fields after a "-"; version ff is invalid (W3C Trace Context, 3.2).
_TRACEPARENT_RE: Final = re.compile(
    r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?$"
)
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16
# The longest header value looked at: a later version's extra fields are not ours to keep.
_MAX_LEN: Final = 512


def parse_traceparent(value: str | None) -> str | None:
    """`value` as a version-00 traceparent when it is a valid one (a later version is read
    as its first four fields), else None: an invalid header is ignored, never refused."""
    if value is None or len(value) > _MAX_LEN:
        return None
    m = _TRACEPARENT_RE.match(value.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return None
    if version == "00" and rest:
        return None  # version 00 has exactly four fields
    return f"00-{trace_id}-{span_id}-{flags}"


def new_traceparent(parent: str | None = None) -> str:
    """A new span's traceparent: in `parent`'s trace (its flags kept), or a new sampled trace."""
    # The buffered random source: on the request's path, no system call per id (0014).
    if parent is not None:
        _, trace_id, _, flags = parent.split("-")
    else:
        trace_id, flags = random_bytes(16).hex(), "01"
    span_id = random_bytes(8).hex()
    if span_id == _ZERO_SPAN:  # invalid by the spec; 2**-64, but never hand one out
        span_id = "0" * 15 + "1"
    return f"00-{trace_id}-{span_id}-{flags}"


def trace_id_of(traceparent: str | None) -> str | None:
    """The 32 hex trace id of a traceparent (None for None)."""
    if not traceparent:
        return None
    parts = traceparent.split("-")
    return parts[1] if len(parts) >= 4 else None


class _TraceContext:
    """A block in one trace: `trace_id` bound in the log context (restored after it)."""

    __slots__ = ("_tokens", "traceparent")

    def __init__(self, traceparent: str) -> None:
        self.traceparent = traceparent
        self._tokens: Mapping[str, Token[Any]] = {}

    def __enter__(self) -> str:
        self._tokens = structlog.contextvars.bind_contextvars(
            trace_id=trace_id_of(self.traceparent)
        )
        return self.traceparent

    def __exit__(self, *exc_info: object) -> None:
        structlog.contextvars.reset_contextvars(**self._tokens)


class Tracing:
    """Spans for the API, the relay and the consumer: OpenTelemetry when configured, else
    trace context only. `span` always yields the traceparent of the span it stands for."""

    def __init__(self, tracer: Any = None, provider: Any = None) -> None:
        self._tracer = tracer
        self._provider = provider

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def span(
        self,
        name: str,
        parent: str | None,
        kind: str = "internal",
        attributes: Mapping[str, Any] | None = None,
    ) -> contextlib.AbstractContextManager[str]:
        """A span named `name`, a child of `parent` (a traceparent; None starts a trace),
        current while the block runs, with its trace id bound as the log lines' `trace_id`;
        yields its own traceparent."""
        if self._tracer is None:
            # The request's path: a plain object, not a generator-based context manager.
            return _TraceContext(new_traceparent(parent))
        return self._otel_span(name, parent, kind, attributes)

    @contextlib.contextmanager
    def _otel_span(
        self, name: str, parent: str | None, kind: str, attributes: Mapping[str, Any] | None
    ) -> Iterator[str]:
        with (
            self._tracer.start_as_current_span(
                name, context=_context(parent), kind=_kind(kind), attributes=dict(attributes or {})
            ) as span,
            _TraceContext(_traceparent_of(span)) as traceparent,
        ):
            yield traceparent

    def record(
        self,
        name: str,
        parent: str | None,
        start_s: float,
        end_s: float,
        kind: str = "internal",
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        """A finished span from `start_s` to `end_s` (Unix seconds), child of `parent`: for
        work done for many traces at once (one SendMessageBatch), one span per trace."""
        if self._tracer is None:
            return
        span = self._tracer.start_span(
            name,
            context=_context(parent),
            kind=_kind(kind),
            attributes=dict(attributes or {}),
            start_time=int(start_s * 1e9),
        )
        span.end(end_time=int(end_s * 1e9))

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Send what is buffered (at the daemon's end)."""
        if self._provider is None:
            return
        try:
            self._provider.force_flush(int(timeout_s * 1000))
            self._provider.shutdown()
        except Exception as exc:  # exporting is best effort
            log.warning("tracing_shutdown_failed", error=exc)


NO_TRACING: Final = Tracing()
_ENDPOINT_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


def configure_tracing(env: Mapping[str, str], instance: str) -> Tracing:
    """OpenTelemetry spans over OTLP/HTTP when an endpoint is configured in `env` and the
    `outboxd[otel]` extra is installed; else trace context only (logged once when the
    endpoint is set but the extra is missing)."""
    if not any(env.get(k) for k in _ENDPOINT_VARIABLES):
        return NO_TRACING
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        log.warning(
            "tracing_unavailable",
            detail="OTEL_EXPORTER_OTLP_ENDPOINT is set but the outboxd[otel] extra is not "
            "installed: no spans are sent",
        )
        return NO_TRACING
    resource = Resource.create(
        {"service.name": env.get("OTEL_SERVICE_NAME", "outboxd"), "service.instance.id": instance}
    )
    # A provider of its own, not the global one: several daemons may share a process (tests).
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    log.info("tracing_enabled", exporter="otlp_http")
    return Tracing(provider.get_tracer("outboxd"), provider)


def _kind(kind: str) -> Any:
    from opentelemetry.trace import SpanKind

    return {
        "server": SpanKind.SERVER,
        "producer": SpanKind.PRODUCER,
        "consumer": SpanKind.CONSUMER,
    }.get(kind, SpanKind.INTERNAL)


def _context(parent: str | None) -> Any:
    from opentelemetry.context import Context
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    if parent is None:
        return Context()  # a root: not whatever span happens to be current
    return TraceContextTextMapPropagator().extract({"traceparent": parent}, context=Context())


def _traceparent_of(span: Any) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"
