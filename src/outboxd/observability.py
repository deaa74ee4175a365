"""Structured JSON logs with redaction, and the Prometheus metrics of one daemon."""

from __future__ import annotations

import asyncio
import contextvars
import functools
import json
import logging
import os
import re
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, MutableMapping
from dataclasses import KW_ONLY, dataclass, field
from datetime import UTC, datetime
from typing import Any, TextIO, TypeVar

import msgspec
import structlog

# Keys that are secrets whatever their value, compared lowercased with "-" as "_".
SECRET_KEYS = frozenset(
    {
        "password",
        "passwd",
        "pwd",
        "pass",
        "secret",
        "token",
        "authorization",
        "cookie",
        "set_cookie",
        "api_key",
        "apikey",
        "credential",
        "credentials",
        "ciphertext",
        "sealed",
        "dsn",
        "private_key",
    }
)
# Any other key whose name looks like a secret (`db_password`, `aws_secret_access_key`,
# `x_api_key`) is redacted too, unless its value is a number or a boolean: counts
# such as `dead_credentials=3` or `tokens_configured=2` are not secrets and survive.
SECRET_KEY_RE = re.compile(
    r"pass(word|wd)?$|^pwd$|secret|token|authorization|api_?key|credential|cookie|ciphertext"
    r"|^dsn$|private_key",
    re.IGNORECASE,
)
REDACTED = "[redacted]"
# A URL's user:password@ part, wherever it appears in a string value.
_URL_PASSWORD_RE = re.compile(r"(?P<scheme>[a-z][a-z0-9+.-]*://)(?P<user>[^:/@\s]*):[^@/\s]*@")


def scrub_url(text: str) -> str:
    return _URL_PASSWORD_RE.sub(r"\g<scheme>\g<user>:***@", text)


@functools.lru_cache(maxsize=4096)
def _secret_name(key: str) -> tuple[bool, bool]:
    """(a secret whatever its value, a secret unless its value is a number or None).

    Log keys are few and repeat on every line: each is judged once (bounded cache).
    """
    if key.lower().replace("-", "_") in SECRET_KEYS:
        return True, True
    return False, SECRET_KEY_RE.search(key) is not None


def is_secret(key: object, value: Any) -> bool:
    if not isinstance(key, str):
        return False
    always, by_name = _secret_name(key)
    if always:
        return True
    if isinstance(value, bool | int | float) or value is None:
        return False
    return by_name


def _redact(value: Any, depth: int = 0) -> Any:
    if depth > 8:
        return value
    if isinstance(value, Mapping):
        return {
            k: (REDACTED if is_secret(k, v) else _redact(v, depth + 1)) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        return [_redact(v, depth + 1) for v in value]
    if isinstance(value, str) and "@" in value:
        return scrub_url(value)
    return value


def redact_secrets(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    for key in list(event_dict):
        if key == "event":
            continue
        if is_secret(key, event_dict[key]):
            event_dict[key] = REDACTED
        else:
            event_dict[key] = _redact(event_dict[key])
    return event_dict


def _error_fields(
    _logger: Any, _method: str, event_dict: MutableMapping[str, Any]
) -> MutableMapping[str, Any]:
    """Turn `error=exc` into its type and message, as docs/contract.md#process-and-logs says."""
    err = event_dict.get("error")
    if isinstance(err, BaseException):
        event_dict["error_type"] = type(err).__name__
        # An exception with no message (a bare TimeoutError) still names what happened.
        event_dict["error"] = scrub_url(str(err) or type(err).__name__)[:500]
    return event_dict


# syslog priorities (sd-daemon(3)): journald reads a leading `<N>` as the line's PRIORITY,
# so `journalctl -p warning` finds warnings. "exception" is structlog's error with a trace.
SYSLOG_PRIORITY = {"critical": 2, "exception": 3, "error": 3, "warning": 4, "info": 6, "debug": 7}


class JournalPriorityPrefix:
    """Wraps a renderer: `<N>` + the rendered line, N the syslog priority of its level."""

    def __init__(self, renderer: Any) -> None:
        self._renderer = renderer

    def __call__(self, logger: Any, method: str, event_dict: MutableMapping[str, Any]) -> str:
        level = str(event_dict.get("level", method)).lower()
        priority = SYSLOG_PRIORITY.get(level, SYSLOG_PRIORITY.get(method, 6))
        return f"<{priority}>{self._renderer(logger, method, event_dict)}"


class _RequestLine:
    """The access log line written directly: the same JSON object the processor chain
    would render for `log.info("http_request", ...)`, at a fraction of its cost.

    Its fields are fixed and none can carry a secret: a request id that matched
    [A-Za-z0-9._:-] or was generated, an HTTP method token, the route's template (never
    the raw path), a status and a duration. So redaction has nothing to do here.
    """

    __slots__ = ("enabled", "prefix", "renderer", "stream")

    def __init__(self, stream: TextIO, journal: bool, enabled: bool) -> None:
        self.stream = stream
        self.prefix = f"<{SYSLOG_PRIORITY['info']}>" if journal else ""
        self.enabled = enabled
        self.renderer: object = None  # the last processor configure_logging installed

    def current(self) -> bool:
        """Whether structlog still runs the configuration this line was made for
        (capture_logs or another configure() replaces the processors)."""
        processors = structlog.get_config()["processors"]
        return bool(processors) and processors[-1] is self.renderer

    def write(self, fields: dict[str, Any]) -> None:
        """`fields` (event included) as one info line, with its level and timestamp."""
        fields["level"] = "info"
        fields["timestamp"] = datetime.now(UTC).isoformat().replace("+00:00", "Z")
        self.stream.write(self.prefix + _line_encoder.encode(fields).decode() + "\n")
        self.stream.flush()


_request_line: _RequestLine | None = None
_CTX_PREFIX = structlog.contextvars.STRUCTLOG_KEY_PREFIX
_CTX_PREFIX_LEN = len(_CTX_PREFIX)
_line_encoder = msgspec.json.Encoder()
_access_log = structlog.get_logger("outboxd.access")


def log_request(
    request_id: str,
    method: str,
    route: str,
    status: int,
    duration_ms: float,
    quiet: bool = False,
) -> None:
    """One structured line per HTTP request (event `http_request`, level info; `quiet`:
    debug, for the probes and scrapes that come every few seconds)."""
    line = _request_line
    if quiet or line is None or not line.current():
        # Probes and scrapes at debug; not configured by configure_logging (tests,
        # capture_logs): the usual path.
        (_access_log.debug if quiet else _access_log.info)(
            "http_request",
            request_id=request_id,
            method=method,
            route=route,
            status=status,
            duration_ms=duration_ms,
        )
        return
    if not line.enabled:
        return
    line.write(
        {
            "request_id": request_id,
            "method": method,
            "route": route,
            "status": status,
            "duration_ms": duration_ms,
            "event": "http_request",
        }
    )


_service_log = structlog.get_logger("outboxd.services")
_PLAIN = (str, int, float, bool, type(None))


def log_info(event: str, fields: dict[str, Any]) -> None:
    """`log.info(event, **fields)` for a hot path: the same JSON object the processor
    chain renders (the fields, the event, the bound context variables, level and
    timestamp, secrets redacted), written directly at a fraction of the chain's cost.

    Plain values (str, numbers, booleans, None) and lists of them (the relay's
    `outbox_sent` line lists a batch's ids), and no `exc_info`; anything else, or a
    logging configuration other than configure_logging's (capture_logs in tests), takes
    the usual path. `fields` becomes the line's dict.
    """
    line = _request_line
    if line is None or not line.current() or "exc_info" in fields:
        _service_log.info(event, **fields)
        return
    if not line.enabled:
        return
    fields["event"] = event
    ctx = contextvars.copy_context()
    for var in ctx:
        if var.name.startswith(_CTX_PREFIX):
            value = ctx[var]
            if value is not Ellipsis:
                fields.setdefault(var.name[_CTX_PREFIX_LEN:], value)
    # What redact_secrets does, for these value types only (its Mapping test is an ABC
    # check per value, the larger part of the line's cost for a list of ids).
    for key, value in fields.items():
        if isinstance(value, list):
            if not all(isinstance(v, _PLAIN) for v in value):
                break
            if is_secret(key, value):
                fields[key] = REDACTED
            elif any(isinstance(v, str) and "@" in v for v in value):
                fields[key] = [scrub_url(v) if isinstance(v, str) else v for v in value]
        elif not isinstance(value, _PLAIN):
            break
        elif key != "event" and is_secret(key, value):
            fields[key] = REDACTED
        elif isinstance(value, str) and "@" in value:
            fields[key] = scrub_url(value)
    else:
        line.write(fields)
        return
    del fields["event"]
    _service_log.info(event, **fields)


T = TypeVar("T")


def detached(work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
    """`work` as a task that starts from an empty context, not the caller's.

    A request that starts work done for many (a dispatch batch, a commit group, a
    notification, an ANALYZE) must not lend that work its `request_id` and `trace_id`:
    every line the work logs would name one request that happened to start it."""
    return asyncio.get_running_loop().create_task(work, context=contextvars.Context())


def configure_logging(
    level: str = "info",
    fmt: str = "json",
    stream: TextIO | None = None,
    env: Mapping[str, str] | None = None,
) -> None:
    """JSON (or console) lines on stdout; with `<N>` priority prefixes under journald.

    systemd sets JOURNAL_STREAM when stdout is connected to the journal.
    """
    global _request_line
    renderer: Any = (
        structlog.processors.JSONRenderer(ensure_ascii=False)
        if fmt == "json"
        else structlog.dev.ConsoleRenderer(colors=False)
    )
    journal = bool((os.environ if env is None else env).get("JOURNAL_STREAM"))
    if journal:
        renderer = JournalPriorityPrefix(renderer)
    level_no = logging.getLevelNamesMapping()[level.upper()]
    _request_line = (
        _RequestLine(stream or sys.stdout, journal, level_no <= logging.INFO)
        if fmt == "json"
        else None
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _error_fields,
            redact_secrets,
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level_no),
        logger_factory=structlog.PrintLoggerFactory(file=stream or sys.stdout),
        cache_logger_on_first_use=False,
    )
    if _request_line is not None:
        _request_line.renderer = renderer
    # What libraries log through the standard library (asyncio's "Task exception was never
    # retrieved", a warning) becomes a JSON line too, not plain text on stderr.
    root = logging.getLogger()
    root.handlers = [h for h in root.handlers if not isinstance(h, _StdlibLines)]
    root.addHandler(_StdlibLines())
    logging.captureWarnings(True)


class _StdlibLines(logging.Handler):
    """A standard-library log record as the structured event `library_log`."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            method = record.levelname.lower()
            if method not in ("debug", "info", "warning", "error", "critical"):
                method = "warning"
            fields: dict[str, Any] = {"logger": record.name, "message": record.getMessage()}
            if record.exc_info:
                fields["exc_info"] = record.exc_info
            getattr(structlog.get_logger(record.name), method)("library_log", **fields)
        except Exception:
            self.handleError(record)


def unfiltered_logger(name: str) -> Any:
    """A logger that writes whatever `logging.level` says, through the same processors: for
    the one start-up line a supervisor reads (the address a `port = 0` API listens on)."""
    return structlog.wrap_logger(
        None,
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
        logger_factory_args=(name,),
    )


def print_refusal(event: str, text: str, daemon: bool = False) -> None:
    """Why a command or `serve` refuses to start, one line on stderr. Under systemd the unit's
    stderr is the journal too: marked as an error (<3>), so `journalctl -p warning` shows
    why the service does not start. `serve`'s output is JSON lines, so for `daemon` the line
    is a JSON object with `event` too, unless stderr is a terminal (a log reader parses
    every line)."""
    prefix = "<3>" if os.environ.get("JOURNAL_STREAM") else ""
    if daemon and not sys.stderr.isatty():
        text = json.dumps(
            {
                "event": event,
                "level": "error",
                "timestamp": datetime.now(UTC).isoformat().replace("+00:00", "Z"),
                "error": text,
            },
            ensure_ascii=False,
        )
    print(f"{prefix}{text}", file=sys.stderr)


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).isoformat().replace("+00:00", "Z")


@dataclass(eq=False, repr=False)
class OutageLog:
    """The log lines of one component while a dependency it needs is down: one when the
    outage starts, at most one every `every_s` while it lasts, one when it ends; never
    one per failed attempt (a loop retrying every second would write thousands).

    Events (each with `component`, the part of the daemon that saw it):
    - `<dependency>_unavailable` (warning): the first failure; `error`, `since`;
    - `<dependency>_still_unavailable` (warning): `count` failures so far, `since`,
      `outage_s`, the latest `error`;
    - `<dependency>_recovered` (info): the first success after; `outage_s`, `count`.
    `dependency` is `storage` (the database) or `sqs`. The caller says what a failure and
    a success are; the clocks are injected so tests need no sleeps.
    """

    dependency: str
    component: str
    _: KW_ONLY
    every_s: float = 60.0
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    logger: Any = None
    _started: float | None = field(default=None, init=False)  # on `clock`, while down
    _since: str = field(default="", init=False)  # the start on the wall clock, ISO 8601
    _last_line: float = field(default=0.0, init=False)
    _count: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if self.logger is None:
            self.logger = structlog.get_logger("outboxd.outage")

    @property
    def down(self) -> bool:
        return self._started is not None

    @property
    def count(self) -> int:
        """Failures since the outage started (0 while up)."""
        return self._count

    def failed(self, error: BaseException | str, **fields: Any) -> int:
        """Record one failure; the failures of this outage so far."""
        now = self.clock()
        self._count += 1
        if self._started is None:
            self._started = self._last_line = now
            self._since = _iso(self.wall())
            self.logger.warning(
                f"{self.dependency}_unavailable",
                component=self.component,
                since=self._since,
                error=error,
                **fields,
            )
        elif now - self._last_line >= self.every_s:
            self._last_line = now
            self.logger.warning(
                f"{self.dependency}_still_unavailable",
                component=self.component,
                since=self._since,
                outage_s=round(now - self._started, 1),
                count=self._count,
                error=error,
                **fields,
            )
        return self._count

    def recovered(self, **fields: Any) -> None:
        """Record a success: the outage, if there was one, is over."""
        if self._started is None:
            return
        self.logger.info(
            f"{self.dependency}_recovered",
            component=self.component,
            since=self._since,
            outage_s=round(self.clock() - self._started, 1),
            count=self._count,
            **fields,
        )
        self._started = None
        self._count = 0
