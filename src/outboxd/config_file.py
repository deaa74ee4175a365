"""Reading the settings: TOML, `OUTBOXD_<SECTION>__<KEY>` overrides, the defaults that
follow other keys, and the rules (each value in range, the combinations that cannot work),
as one-line `ConfigError`s naming the key. What the settings are is `config.py`."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tomllib
import types
import typing
from collections.abc import Mapping
from functools import reduce
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from outboxd.config import (
    DEFAULT_RULES,
    ROLES,
    ClaimerSettings,
    ConfigError,
    RelaySettings,
    Settings,
    is_loopback_host,
    waiters_within,
)
from outboxd.cron import CronError, CronSchedule, parse_timezone


def load_settings(path: str | os.PathLike[str], env: Mapping[str, str] | None = None) -> Settings:
    """Read, override from the environment, and validate a config file."""
    file = Path(path)
    try:
        raw = tomllib.loads(file.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config: file not found: {file}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config: {file}: invalid TOML: {exc}") from None
    return settings_from_mapping(raw, env=env, base_dir=file.resolve().parent)


def settings_from_mapping(
    raw: Mapping[str, Any],
    env: Mapping[str, str] | None = None,
    base_dir: Path | None = None,
) -> Settings:
    """Settings from a parsed TOML document (or a test's dict): the environment's overrides
    applied, the defaults that follow other keys filled in, then every rule checked."""
    data: dict[str, Any] = json.loads(json.dumps(raw, default=str)) if raw else {}
    _apply_env(data, os.environ if env is None else env)
    data.pop("base_dir", None)
    _derive_defaults(data)
    settings: Settings = _build(Settings, data, "")
    settings = dataclasses.replace(settings, base_dir=base_dir or Path.cwd())
    validate(settings)
    return settings


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


def validate(s: Settings) -> None:
    def need(cond: bool, key: str, why: str) -> None:
        if not cond:
            raise ConfigError(f"config: {key}: {why}")

    # The plain bounds name each key once: the value checked is the one the message names.
    def value(key: str) -> Any:
        return reduce(getattr, key.split("."), s)

    def positive(*keys: str) -> None:
        for key in keys:
            need(value(key) > 0, key, "must be positive")

    def at_least_one(*keys: str) -> None:
        for key in keys:
            need(value(key) >= 1, key, "must be at least 1")

    def not_negative(*keys: str, why: str = "must not be negative") -> None:
        for key in keys:
            need(value(key) >= 0, key, why)

    need(0 <= s.server.port <= 65535, "server.port", "must be 0-65535 (0: any free port)")
    need(s.server.max_body_bytes >= 256, "server.max_body_bytes", "must be at least 256")
    positive("server.read_timeout_s", "server.keepalive_timeout_s")
    at_least_one("server.max_connections")
    positive("server.write_timeout_s")
    not_negative(
        "api.max_active_jobs_per_user",
        "api.max_websites_per_user_per_hour",
        why="must not be negative (0: no cap)",
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
    positive("storage.acquire_timeout_s")
    not_negative(
        "storage.start_timeout_s", why="must not be negative (0: wait for the database forever)"
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
    positive("relay.interval_s")
    need(1 <= s.relay.batch_size <= 10, "relay.batch_size", "must be 1-10 (SendMessageBatch)")
    at_least_one("relay.max_attempts")
    positive("relay.backoff_base_s")
    need(
        s.relay.backoff_max_s >= s.relay.backoff_base_s,
        "relay.backoff_max_s",
        f"({s.relay.backoff_max_s:g}) must be at least relay.backoff_base_s "
        f"({s.relay.backoff_base_s:g})",
    )
    positive("relay.publish_timeout_s")
    at_least_one("consumer.max_concurrency")
    positive("consumer.heartbeat_s")
    not_negative("consumer.backoff_base_s")
    need(
        s.sqs.visibility_timeout_s == 0 or s.consumer.heartbeat_s < s.sqs.visibility_timeout_s,
        "consumer.heartbeat_s",
        f"({s.consumer.heartbeat_s:g}) must be shorter than sqs.visibility_timeout_s "
        f"({s.sqs.visibility_timeout_s})",
    )
    positive("consumer.dlq_sweep_s")
    not_negative("consumer.progress_interval_s")
    not_negative("metrics.refresh_s")
    positive("claimer.fixed_delay_s")
    not_negative("claimer.retry_delay_s")
    positive("claimer.processing_timeout_s")
    at_least_one("claimer.max_attempts")
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
    positive("scrapers.suwon.timeout_s")
    at_least_one("scrapers.suwon.max_concurrency")
    not_negative("scrapers.suwon.min_interval_s")
    not_negative("scrapers.suwon.max_auth_failures", why="must not be negative (0: no lock)")
    not_negative(
        "scrapers.suwon.max_auth_failures_total", why="must not be negative (0: no throttle)"
    )
    positive("scrapers.suwon.auth_failure_window_s")
    cl = s.scrapers.classifier
    need(len(cl.categories) > 0, "scrapers.classifier.categories", "must not be empty")
    positive("scrapers.classifier.timeout_s")
    for i, rule in enumerate(cl.rules):
        need(
            rule.category in cl.categories,
            f"scrapers.classifier.rules[{i}].category",
            "must be one of scrapers.classifier.categories",
        )
    positive("security.dead_retention_s")
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
    positive("scheduler.tick_s")
    windows = (
        ("scrapers.suwon.maintenance", s.scrapers.suwon.maintenance),
        ("scrapers.classifier.maintenance", s.scrapers.classifier.maintenance),
    )
    for section, entries in windows:
        for i, window in enumerate(entries):
            key = f"{section}[{i}]"
            need(window.duration_s > 0, f"{key}.duration_s", "must be positive")
            try:
                parse_timezone(window.timezone)
                CronSchedule.parse(window.cron)
            except CronError as exc:
                raise ConfigError(f"config: {key}: {exc}") from None
    positive("audit.retention_s", "retention.finished_s", "retention.dead_s")
    at_least_one("retention.batch_rows")
    for name in ("portal", "ai", "sqs"):
        need(
            getattr(s.breakers, name).open_after >= 1, f"breakers.{name}.open_after", "must be >= 1"
        )
        positive(f"breakers.{name}.probe_s")
    need(len(s.daemon.roles) > 0, "daemon.roles", "must name at least one role")
    for role in s.daemon.roles:
        need(role in ROLES, "daemon.roles", f"unknown role {role!r} (known: {', '.join(ROLES)})")
    positive("daemon.shutdown_timeout_s")
    need(
        len(s.daemon.instance_id) <= 128 and all(33 <= ord(c) <= 126 for c in s.daemon.instance_id),
        "daemon.instance_id",
        "must be at most 128 letters, digits and ASCII punctuation (no spaces)",
    )
    need(0 <= s.api.max_wait_s <= 3600, "api.max_wait_s", "must be an integer 0-3600")
    not_negative("api.max_waiters", "api.max_waiters_per_user")
    # Each held request keeps its connection: held ones alone must never fill the listener.
    # Only a value written can fail this (api.max_waiters follows server.max_connections
    # where it is not: config.py _derive_defaults).
    need(
        s.api.max_waiters <= waiters_within(s.server.max_connections),
        "api.max_waiters",
        f"({s.api.max_waiters}) must stay below server.max_connections "
        f"({s.server.max_connections}) with room to spare: at most three quarters of it "
        f"({waiters_within(s.server.max_connections)})",
    )
    if not s.auth.tokens and "api" in s.daemon.roles:
        need(
            is_loopback_host(s.server.host),
            "server.host",
            "with no [[auth.tokens]] the API only binds a loopback address",
        )
