"""The settings: typed, frozen dataclasses, one a config section, with their defaults.

How they are read from TOML and the environment, and checked, is `config_file.py`; an
unknown key, a wrong type or an impossible value raises `ConfigError` there, whose message
is one line naming the key.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from outboxd.errors import OutboxdError

ROLES = ("api", "relay", "consumer", "claimer", "scheduler")


class ConfigError(OutboxdError):
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
    # (see config_file._derive_defaults): 768 for the default 1024 connections.
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
    # When absent: a third of sqs.visibility_timeout_s (see config_file._derive_defaults).
    heartbeat_s: float = 20.0
    backoff_base_s: float = 5.0
    # How often each DLQ is swept: messages of work no longer DEAD are deleted.
    dlq_sweep_s: float = 60.0
    # A run's progress is written at most this often: steps within it of the last write
    # are held and written with the next write, at most this long later (0: every step
    # at once). docs/decisions/0037-progress-written-per-interval.md.
    progress_interval_s: float = 1.0


@dataclass(frozen=True)
class ClaimerSettings:
    fixed_delay_s: float = 1.0
    retry_delay_s: float = 60.0
    processing_timeout_s: float = 300.0
    max_attempts: int = 5
    # "cluster": every instance on the database shares one pace (docs/pacing.md).
    pace_scope: Literal["instance", "cluster"] = "instance"


@dataclass(frozen=True)
class MaintenanceWindow:
    """A time an outside system is closed: from each time `cron` fires (in `timezone`, an
    IANA name) for `duration_s`. Inside it nothing calls the system, not even a probe."""

    cron: str
    duration_s: float
    timezone: str = "UTC"


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
    # When the portal is closed: no call at all, its jobs wait (docs/operations.md).
    maintenance: tuple[MaintenanceWindow, ...] = ()


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
    # When the provider is closed: no call at all, the rows wait.
    maintenance: tuple[MaintenanceWindow, ...] = ()


@dataclass(frozen=True)
class ScrapersSettings:
    suwon: SuwonScraperSettings = field(default_factory=SuwonScraperSettings)
    classifier: ClassifierSettings = field(default_factory=ClassifierSettings)


@dataclass(frozen=True)
class BreakerSettings:
    # Runs in a row, from any instance, ending in an outage failure that open the breaker.
    open_after: int = 5
    # While open: one probe for the whole cluster this often.
    probe_s: float = 30.0


@dataclass(frozen=True)
class BreakersSettings:
    portal: BreakerSettings = field(default_factory=BreakerSettings)
    ai: BreakerSettings = field(default_factory=BreakerSettings)
    sqs: BreakerSettings = field(default_factory=BreakerSettings)


@dataclass(frozen=True)
class AuditSettings:
    # Audit rows older than this are removed by outbox.prune (which records that it did).
    retention_s: float = 400 * 86400.0


@dataclass(frozen=True)
class RetentionSettings:
    # outbox.prune removes SUCCEEDED, FAILED and CANCELLED jobs (their events, outbox rows and
    # payloads with them), COMPLETED work rows and finished task runs once finished this long,
    # DEAD jobs after dead_s, in transactions of at most batch_rows rows. It runs every hour
    # unless [[scheduler.jobs]] schedules outbox.prune otherwise.
    finished_s: float = 30 * 86400.0
    dead_s: float = 90 * 86400.0
    batch_rows: int = 1000


@dataclass(frozen=True)
class SecuritySettings:
    keys_file: str | None = None
    dead_retention_s: float = 7 * 24 * 3600.0


@dataclass(frozen=True)
class TokenEntry:
    sha256: str
    user: str
    role: Literal["user", "viewer", "operator", "admin"] = "user"


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
    breakers: BreakersSettings = field(default_factory=BreakersSettings)
    audit: AuditSettings = field(default_factory=AuditSettings)
    retention: RetentionSettings = field(default_factory=RetentionSettings)
    security: SecuritySettings = field(default_factory=SecuritySettings)
    auth: AuthSettings = field(default_factory=AuthSettings)
    scheduler: SchedulerSettings = field(default_factory=SchedulerSettings)
    daemon: DaemonSettings = field(default_factory=DaemonSettings)
    logging: LoggingSettings = field(default_factory=LoggingSettings)
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    # The folder relative paths (sqlite:///rel, keys_file) are resolved against.
    base_dir: Path = field(default_factory=Path.cwd)

    def resolve_path(self, value: str) -> Path:
        p = Path(value)
        return p if p.is_absolute() else (self.base_dir / p)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
