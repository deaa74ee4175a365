"""Typed, frozen settings read from TOML, with `OUTBOXD_<SECTION>__<KEY>` overrides.

Every value is validated at start: an unknown key, a wrong type or an impossible
value raises `ConfigError` whose message is one line naming the key.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

ROLES = ("api", "relay", "consumer", "claimer", "scheduler")


class ConfigError(Exception):
    """A configuration problem; str() is one line naming the key."""


@dataclass(frozen=True)
class ServerSettings:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 64 * 1024
    # A request's headers and body must arrive within this, or the connection is closed.
    read_timeout_s: float = 15.0
    # An idle keep-alive connection is closed after this.
    keepalive_timeout_s: float = 60.0
    # Connections beyond this are answered 503 and closed at once.
    max_connections: int = 1024
    # A response that makes no progress (the client does not read) for this long is aborted.
    write_timeout_s: float = 30.0
    # The request line and headers together; past it (or 64 fields) 431, nothing kept.
    max_header_bytes: int = 16 * 1024


def waiters_within(max_connections: int) -> int:
    """The most requests `api.max_waiters` may hold on `server.max_connections`: three
    quarters, so a quarter of the connections (one at least) is always left to everyone
    else: other users, /healthz, /readyz (docs/decisions/0030-per-user-bounds.md)."""
    return max_connections * 3 // 4


@dataclass(frozen=True)
class ApiSettings:
    require_dispatch: bool = False
    # `Prefer: wait=N` on GET /v1/jobs/{id}: N is clamped to this (whole seconds).
    max_wait_s: int = 60
    # Requests held at once; past it a waiting request is answered at once. Each keeps its
    # connection: at most `waiters_within(server.max_connections)`, and that when absent
    # (see _derive_defaults): 768 for the default 1024 connections.
    max_waiters: int = 768
    # One user's share of them (0: no request of anyone is held).
    max_waiters_per_user: int = 100
    # Per-user caps, 0 = off: one token may serve a whole backend.
    max_active_jobs_per_user: int = 0
    max_websites_per_user_per_hour: int = 0


@dataclass(frozen=True)
class StorageSettings:
    url: str = "sqlite:///var/outboxd.db"
    auto_migrate: bool = True
    pool_size: int = 10
    # How long a request waits for a pooled connection or a locked SQLite file
    # before answering STORAGE_UNAVAILABLE instead of hanging.
    acquire_timeout_s: float = 5.0
    # How long `serve` waits for a database that cannot be reached at start; 0: forever.
    start_timeout_s: float = 0.0


@dataclass(frozen=True)
class SqsSettings:
    # Absent (None): real AWS, the region's endpoint and the standard credential chain.
    # "embedded": moto's server as a child process (development only, needs the
    # outboxd[embedded] extra). Anything else: an SQS-compatible http(s) URL.
    endpoint_url: str | None = None
    region: str | None = None
    jobs_queue: str = "outboxd-jobs"
    tasks_queue: str = "outboxd-tasks.fifo"
    create_queues: bool = True
    max_receive_count: int = 5
    visibility_timeout_s: int = 60
    wait_time_s: int = 20


@dataclass(frozen=True)
class RelaySettings:
    interval_s: float = 1.0
    batch_size: int = 10
    max_attempts: int = 10
    backoff_base_s: float = 1.0
    backoff_max_s: float = 300.0
    publish_timeout_s: float = 2.0


@dataclass(frozen=True)
class ConsumerSettings:
    max_concurrency: int = 4
    # When absent: a third of sqs.visibility_timeout_s (see _derive_defaults).
    heartbeat_s: float = 20.0
    backoff_base_s: float = 5.0
    # How often each DLQ is swept: messages of work no longer DEAD are deleted.
    dlq_sweep_s: float = 60.0


@dataclass(frozen=True)
class ClaimerSettings:
    fixed_delay_s: float = 1.0
    retry_delay_s: float = 60.0
    processing_timeout_s: float = 300.0
    max_attempts: int = 5
    # "cluster": every instance on the database shares one pace (docs/pacing.md).
    pace_scope: Literal["instance", "cluster"] = "instance"


@dataclass(frozen=True)
class SuwonScraperSettings:
    portal_base_url: str = "https://portal.suwon.ac.kr"
    info_base_url: str = "https://info.suwon.ac.kr"
    timeout_s: float = 20.0
    max_concurrency: int = 2
    min_interval_s: float = 0.2
    verify_tls: bool = True
    # "cluster": min_interval_s and max_concurrency hold across instances (docs/pacing.md).
    pace_scope: Literal["instance", "cluster"] = "instance"
    # After this many PORTAL_AUTH_FAILED jobs from one user for one portal username within
    # the window, that user's further jobs for it fail PORTAL_LOGIN_LOCKED without a login
    # (0 = off). After max_auth_failures_total from anyone, the username's jobs wait and
    # try one login at a time, spaced by a doubling delay (0 = off).
    max_auth_failures: int = 3
    auth_failure_window_s: float = 3600.0
    max_auth_failures_total: int = 10


@dataclass(frozen=True)
class ClassifierRule:
    """One offline rule: matches a domain ending in `suffix` and/or containing `contains`.

    A rule with neither matches every domain (a catch-all, put it last).
    """

    category: str
    suffix: str | None = None
    contains: str | None = None


DEFAULT_CATEGORIES = (
    "news",
    "shopping",
    "education",
    "technology",
    "entertainment",
    "finance",
    "government",
    "social",
    "other",
)


# The offline rules when none are configured: a few obvious ones and a catch-all last, so
# the default classifies every website (most as "other") instead of failing each one
# max_attempts times with "no rule matches".
DEFAULT_RULES = (
    ClassifierRule("education", suffix="ac.kr"),
    ClassifierRule("education", suffix="edu"),
    ClassifierRule("government", suffix="gov"),
    ClassifierRule("news", contains="news"),
    ClassifierRule("other"),
)


@dataclass(frozen=True)
class ClassifierSettings:
    provider: Literal["rules", "openai"] = "rules"
    base_url: str = "https://api.openai.com/v1"
    model: str = "gpt-4o-mini"
    api_key_env: str = "OPENAI_API_KEY"
    categories: tuple[str, ...] = DEFAULT_CATEGORIES
    timeout_s: float = 30.0
    rules: tuple[ClassifierRule, ...] = DEFAULT_RULES


@dataclass(frozen=True)
class ScrapersSettings:
    suwon: SuwonScraperSettings = field(default_factory=SuwonScraperSettings)
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)


@dataclass(frozen=True)
class SecuritySettings:
    keys_file: str | None = None
    dead_retention_s: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class TokenEntry:
    sha256: str
    user: str
    role: Literal["user", "admin"] = "user"


@dataclass(frozen=True)
class AuthSettings:
    tokens: tuple[TokenEntry, ...] = ()


@dataclass(frozen=True)
class ScheduleEntry:
    name: str
    task: str
    cron: str | None = None
    every_s: float | None = None
    timezone: str = "UTC"
    payload: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class SchedulerSettings:
    jobs: tuple[ScheduleEntry, ...] = ()
    tick_s: float = 1.0


@dataclass(frozen=True)
class DaemonSettings:
    roles: tuple[str, ...] = ROLES
    shutdown_timeout_s: float = 30.0
    # Names this daemon in the job events it records; empty: "<host name>:<pid>".
    instance_id: str = ""


@dataclass(frozen=True)
class LoggingSettings:
    level: Literal["debug", "info", "warning", "error"] = "info"
    format: Literal["json", "console"] = "json"


@dataclass(frozen=True)
class MetricsSettings:
    # The gauges read from the database and SQS are refreshed at most this often,
    # however many scrapers ask (0: at every scrape that finds no refresh running).
    refresh_s: float = 5.0


@dataclass(frozen=True)
class Settings:
    server: ServerSettings = field(default_factory=ServerSettings)
    api: ApiSettings = field(default_factory=ApiSettings)
    storage: StorageSettings = field(default_factory=StorageSettings)
    sqs: SqsSettings = field(default_factory=SqsSettings)
    relay: RelaySettings = field(default_factory=RelaySettings)
    consumer: ConsumerSettings = field(default_factory=ConsumerSettings)
    claimer: ClaimerSettings = field(default_factory=ClaimerSettings)
    scrapers: ScrapersSettings = field(default_factory=ScrapersSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    # The folder relative paths (sqlite:///rel, keys_file) are resolved against.
    base_dir: Path = field(default_factory=Path.cwd)

    @classmethod
    def from_toml(
        cls, path: str | os.PathLike[str], env: Mapping[str, str] | None = None
    ) -> Settings:
        """Read, override from the environment, and validate a config file."""
        file = Path(path)
        try:
            raw = tomllib.loads(file.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ConfigError(f"config: file not found: {file}") from None
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"config: {file}: invalid TOML: {exc}") from None
        return cls.from_mapping(raw, env=env, base_dir=file.resolve().parent)

    @classmethod
    def from_mapping(
        cls,
        raw: Mapping[str, Any],
        env: Mapping[str, str] | None = None,
        base_dir: Path | None = None,
    ) -> Settings:
        data: dict[str, Any] = json.loads(json.dumps(raw, default=str)) if raw else {}
        _apply_env(data, os.environ if env is None else env)
        data.pop("base_dir", None)
        _derive_defaults(data)
        settings: Settings = _build(cls, data, "")
        settings = dataclasses.replace(settings, base_dir=base_dir or Path.cwd())
        from outboxd.config_checks import validate  # it reads the classes above

        validate(settings)
        return settings

    def resolve_path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else (self.base_dir / p)


ENV_PREFIX = "OUTBOXD_"


def _apply_env(data: dict[str, Any], env: Mapping[str, str]) -> None:
    """`OUTBOXD_SQS__WAIT_TIME_S=5` sets [sqs] wait_time_s; values parse as TOML when they can."""
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX) or "__" not in name:
            continue
        path = [part.lower() for part in name[len(ENV_PREFIX) :].split("__")]
        if not all(path):
            continue
        target = data
        for part in path[:-1]:
            nxt = target.setdefault(part, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"config: {name}: {'.'.join(path[:-1])} is not a section")
            target = nxt
        target[path[-1]] = _parse_env_value(value)


def _number(section: Any, key: str) -> float | None:
    value = section.get(key) if isinstance(section, dict) else None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def _derive_defaults(data: dict[str, Any]) -> None:
    """Defaults that follow another key, filled in only where the user wrote nothing.

    So a rule relating two keys can only fail on a value the user wrote: setting just
    `sqs.visibility_timeout_s = 6` gives a 2 s heartbeat, not the 20 s that would
    contradict it. A source value of the wrong type is left for _build to report.
    """

    def fill(section: str, key: str, value: float | None) -> None:
        target = data.get(section)
        if value is None or (target is not None and not isinstance(target, dict)):
            return
        data.setdefault(section, {}).setdefault(key, value)

    connections = _number(data.get("server"), "max_connections")
    if connections is not None and connections.is_integer():
        fill("api", "max_waiters", waiters_within(int(connections)))
    visibility = _number(data.get("sqs"), "visibility_timeout_s")
    if visibility is not None and visibility > 0:
        fill("consumer", "heartbeat_s", visibility / 3)
    base = _number(data.get("relay"), "backoff_base_s")
    if base is not None:
        fill("relay", "backoff_max_s", max(RelaySettings.backoff_max_s, base))
    scrapers = data.get("scrapers")
    classifier = scrapers.get("classifier") if isinstance(scrapers, dict) else None
    categories = classifier.get("categories") if isinstance(classifier, dict) else None
    if isinstance(classifier, dict) and isinstance(categories, list) and "rules" not in classifier:
        # Own categories and no rules: the default rules whose category is among them.
        classifier["rules"] = [
            {k: v for k, v in dataclasses.asdict(r).items() if v is not None}
            for r in DEFAULT_RULES
            if r.category in categories
        ]
    timeout = _number(
        scrapers.get("classifier") if isinstance(scrapers, dict) else None, "timeout_s"
    )
    if timeout is not None:
        fill(
            "claimer",
            "processing_timeout_s",
            max(ClaimerSettings.processing_timeout_s, 2 * timeout),
        )


def _parse_env_value(value: str) -> Any:
    try:
        return tomllib.loads(f"v = {value}")["v"]
    except tomllib.TOMLDecodeError:
        return value


def _build(tp: type[Any], data: Any, where: str) -> Any:
    if not isinstance(data, dict):
        raise ConfigError(f"config: {where or 'root'}: expected a table")
    hints = typing.get_type_hints(tp)
    known = {f.name for f in dataclasses.fields(tp) if f.init and f.name != "base_dir"}
    for key in data:
        if key not in known:
            raise ConfigError(f"config: {_join(where, key)}: unknown key")
    kwargs = {key: _coerce(hints[key], value, _join(where, key)) for key, value in data.items()}
    try:
        return tp(**kwargs)
    except TypeError as exc:  # a missing required field
        raise ConfigError(f"config: {where or 'root'}: {exc}") from None


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _coerce(tp: Any, value: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        last: ConfigError | None = None
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _coerce(arg, value, where)
            except ConfigError as exc:
                last = exc
        raise last or ConfigError(f"config: {where}: wrong type")
    if origin is Literal:
        if value not in args:
            allowed = ", ".join(repr(a) for a in args)
            raise ConfigError(f"config: {where}: must be one of {allowed}, got {value!r}")
        return value
    if origin is tuple:
        if not isinstance(value, list):
            raise ConfigError(f"config: {where}: expected an array")
        return tuple(_coerce(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (Mapping, dict) or tp is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config: {where}: expected a table")
        return types.MappingProxyType(dict(value))
    if dataclasses.is_dataclass(tp):
        return _build(typing.cast(type[Any], tp), value, where)
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"config: {where}: expected true or false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"config: {where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"config: {where}: expected a number, got {value!r}")
        if not math.isfinite(value):
            # TOML spells inf and nan; no duration, delay or size is either.
            raise ConfigError(f"config: {where}: must be a finite number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, str):
            raise ConfigError(f"config: {where}: expected a string, got {value!r}")
        return value
    if tp is typing.Any:
        return value
    raise ConfigError(f"config: {where}: unsupported type")  # pragma: no cover


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
