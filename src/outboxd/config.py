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
from urllib.parse import urlsplit

from outboxd.cron import CronError, CronSchedule, parse_timezone

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


@dataclass(frozen=True)
class ApiSettings:
    require_dispatch: bool = False
    # `Prefer: wait=N` on GET /v1/jobs/{id}: N is clamped to this (whole seconds).
    max_wait_s: int = 60
    # Requests held at once; past it a waiting request is answered at once.
    max_waiters: int = 10_000
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
    # After this many PORTAL_AUTH_FAILED jobs for one portal username within the window,
    # its further jobs fail PORTAL_LOGIN_LOCKED without a login (0 = off).
    max_auth_failures: int = 3
    auth_failure_window_s: float = 3600.0


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
        _validate(settings)
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


def _validate(s: Settings) -> None:
    def need(cond: bool, key: str, why: str) -> None:
        if not cond:
            raise ConfigError(f"config: {key}: {why}")

    need(0 <= s.server.port <= 65535, "server.port", "must be 0-65535 (0: any free port)")
    need(s.server.max_body_bytes >= 256, "server.max_body_bytes", "must be at least 256")
    need(s.server.read_timeout_s > 0, "server.read_timeout_s", "must be positive")
    need(s.server.keepalive_timeout_s > 0, "server.keepalive_timeout_s", "must be positive")
    need(s.server.max_connections >= 1, "server.max_connections", "must be at least 1")
    need(s.server.write_timeout_s > 0, "server.write_timeout_s", "must be positive")
    need(
        s.api.max_active_jobs_per_user >= 0,
        "api.max_active_jobs_per_user",
        "must not be negative (0: no cap)",
    )
    need(
        s.api.max_websites_per_user_per_hour >= 0,
        "api.max_websites_per_user_per_hour",
        "must not be negative (0: no cap)",
    )
    need(
        1024 <= s.server.max_header_bytes <= 1024 * 1024,
        "server.max_header_bytes",
        "must be 1024-1048576",
    )
    url = s.storage.url
    need(
        url.startswith(("sqlite:///", "postgresql://", "postgres://")),
        "storage.url",
        "must start with sqlite:/// or postgresql://",
    )
    need(url != "sqlite:///", "storage.url", "names no file")
    need(1 <= s.storage.pool_size <= 200, "storage.pool_size", "must be 1-200")
    need(s.storage.acquire_timeout_s > 0, "storage.acquire_timeout_s", "must be positive")
    need(
        s.storage.start_timeout_s >= 0,
        "storage.start_timeout_s",
        "must not be negative (0: wait for the database forever)",
    )
    endpoint = s.sqs.endpoint_url
    need(
        endpoint is None
        or endpoint == "embedded"
        or (endpoint.startswith(("http://", "https://")) and bool(urlsplit(endpoint).hostname)),
        "sqs.endpoint_url",
        f'must be "embedded" or an http(s) URL; leave it out for AWS (got {endpoint!r})',
    )
    need(0 <= s.sqs.wait_time_s <= 20, "sqs.wait_time_s", "must be an integer 0-20")
    need(
        0 <= s.sqs.visibility_timeout_s <= 43200,
        "sqs.visibility_timeout_s",
        "must be an integer 0-43200",
    )
    need(1 <= s.sqs.max_receive_count <= 1000, "sqs.max_receive_count", "must be 1-1000")
    need(s.sqs.tasks_queue.endswith(".fifo"), "sqs.tasks_queue", "must end in .fifo")
    need(not s.sqs.jobs_queue.endswith(".fifo"), "sqs.jobs_queue", "must be a standard queue")
    for key in ("jobs_queue", "tasks_queue"):
        name = getattr(s.sqs, key)
        need(
            0 < len(name) <= 75 and all(c.isalnum() or c in "-_." for c in name),
            f"sqs.{key}",
            "must be 1-75 characters of letters, digits, - and _",
        )
    need(s.relay.interval_s > 0, "relay.interval_s", "must be positive")
    need(1 <= s.relay.batch_size <= 10, "relay.batch_size", "must be 1-10 (SendMessageBatch)")
    need(s.relay.max_attempts >= 1, "relay.max_attempts", "must be at least 1")
    need(s.relay.backoff_base_s > 0, "relay.backoff_base_s", "must be positive")
    need(
        s.relay.backoff_max_s >= s.relay.backoff_base_s,
        "relay.backoff_max_s",
        f"({s.relay.backoff_max_s:g}) must be at least relay.backoff_base_s "
        f"({s.relay.backoff_base_s:g})",
    )
    need(s.relay.publish_timeout_s > 0, "relay.publish_timeout_s", "must be positive")
    need(s.consumer.max_concurrency >= 1, "consumer.max_concurrency", "must be at least 1")
    need(s.consumer.heartbeat_s > 0, "consumer.heartbeat_s", "must be positive")
    need(s.consumer.backoff_base_s >= 0, "consumer.backoff_base_s", "must not be negative")
    need(
        s.sqs.visibility_timeout_s == 0 or s.consumer.heartbeat_s < s.sqs.visibility_timeout_s,
        "consumer.heartbeat_s",
        f"({s.consumer.heartbeat_s:g}) must be shorter than sqs.visibility_timeout_s "
        f"({s.sqs.visibility_timeout_s})",
    )
    need(s.consumer.dlq_sweep_s > 0, "consumer.dlq_sweep_s", "must be positive")
    need(s.metrics.refresh_s >= 0, "metrics.refresh_s", "must not be negative")
    need(s.claimer.fixed_delay_s > 0, "claimer.fixed_delay_s", "must be positive")
    need(s.claimer.retry_delay_s >= 0, "claimer.retry_delay_s", "must not be negative")
    need(s.claimer.processing_timeout_s > 0, "claimer.processing_timeout_s", "must be positive")
    need(s.claimer.max_attempts >= 1, "claimer.max_attempts", "must be at least 1")
    # A row is reclaimed after processing_timeout_s: a provider call still in
    # flight then would be made twice for one website.
    need(
        s.scrapers.classifier.provider == "rules"
        or s.claimer.processing_timeout_s > s.scrapers.classifier.timeout_s,
        "claimer.processing_timeout_s",
        f"({s.claimer.processing_timeout_s:g}) must be longer than "
        f"scrapers.classifier.timeout_s ({s.scrapers.classifier.timeout_s:g})",
    )
    su = s.scrapers.suwon
    for key in ("portal_base_url", "info_base_url"):
        need(
            getattr(su, key).startswith(("http://", "https://")),
            f"scrapers.suwon.{key}",
            "must be an http(s) URL",
        )
    need(su.timeout_s > 0, "scrapers.suwon.timeout_s", "must be positive")
    need(su.max_concurrency >= 1, "scrapers.suwon.max_concurrency", "must be at least 1")
    need(su.min_interval_s >= 0, "scrapers.suwon.min_interval_s", "must not be negative")
    need(
        su.max_auth_failures >= 0,
        "scrapers.suwon.max_auth_failures",
        "must not be negative (0: no lock)",
    )
    need(su.auth_failure_window_s > 0, "scrapers.suwon.auth_failure_window_s", "must be positive")
    cl = s.scrapers.classifier
    need(len(cl.categories) > 0, "scrapers.classifier.categories", "must not be empty")
    need(cl.timeout_s > 0, "scrapers.classifier.timeout_s", "must be positive")
    for i, rule in enumerate(cl.rules):
        need(
            rule.category in cl.categories,
            f"scrapers.classifier.rules[{i}].category",
            "must be one of scrapers.classifier.categories",
        )
    need(s.security.dead_retention_s > 0, "security.dead_retention_s", "must be positive")
    for i, tok in enumerate(s.auth.tokens):
        need(
            len(tok.sha256) == 64 and all(c in "0123456789abcdef" for c in tok.sha256.lower()),
            f"auth.tokens[{i}].sha256",
            "must be 64 hex characters",
        )
        need(bool(tok.user), f"auth.tokens[{i}].user", "must not be empty")
    hashes = [tok.sha256.lower() for tok in s.auth.tokens]
    for i, digest in enumerate(hashes):
        need(
            digest not in hashes[:i],
            "auth.tokens",
            f"entry [{i}] repeats the sha256 of entry [{hashes.index(digest)}] "
            "(one token would map to two users)",
        )
    names: set[str] = set()
    for i, job in enumerate(s.scheduler.jobs):
        key = f"scheduler.jobs[{i}]"
        need(
            bool(job.name) and job.name not in names, f"{key}.name", "must be non-empty and unique"
        )
        # The name starts every fire's SQS MessageDeduplicationId (<name>-<time>, 128 max).
        need(
            len(job.name) <= 96 and all(33 <= ord(c) <= 126 for c in job.name),
            f"{key}.name",
            "must be at most 96 letters, digits and ASCII punctuation (no spaces)",
        )
        names.add(job.name)
        need(
            (job.cron is None) != (job.every_s is None),
            key,
            "needs exactly one of cron or every_s",
        )
        if job.every_s is not None:
            need(job.every_s > 0, f"{key}.every_s", "must be positive")
        # The scheduler's own parser, so a bad expression stops the start here
        # instead of at the first tick.
        try:
            parse_timezone(job.timezone)
            if job.cron is not None:
                CronSchedule.parse(job.cron)
        except CronError as exc:
            raise ConfigError(f"config: {key}: {exc}") from None
        need(bool(job.task), f"{key}.task", "must not be empty")
    need(s.scheduler.tick_s > 0, "scheduler.tick_s", "must be positive")
    need(len(s.daemon.roles) > 0, "daemon.roles", "must name at least one role")
    for role in s.daemon.roles:
        need(role in ROLES, "daemon.roles", f"unknown role {role!r} (known: {', '.join(ROLES)})")
    need(s.daemon.shutdown_timeout_s > 0, "daemon.shutdown_timeout_s", "must be positive")
    need(
        len(s.daemon.instance_id) <= 128 and all(33 <= ord(c) <= 126 for c in s.daemon.instance_id),
        "daemon.instance_id",
        "must be at most 128 letters, digits and ASCII punctuation (no spaces)",
    )
    need(0 <= s.api.max_wait_s <= 3600, "api.max_wait_s", "must be an integer 0-3600")
    need(s.api.max_waiters >= 0, "api.max_waiters", "must not be negative")
    if not s.auth.tokens and "api" in s.daemon.roles:
        need(
            is_loopback_host(s.server.host),
            "server.host",
            "with no [[auth.tokens]] the API only binds a loopback address",
        )


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
