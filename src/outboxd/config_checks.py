"""The settings' rules: each value in range and the combinations that cannot work, as
one-line `ConfigError`s naming the key (called by `Settings.from_mapping`)."""

from __future__ import annotations

from functools import reduce
from typing import Any
from urllib.parse import urlsplit

from outboxd.config import ROLES, ConfigError, Settings, is_loopback_host, waiters_within
from outboxd.cron import CronError, CronSchedule, parse_timezone


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
