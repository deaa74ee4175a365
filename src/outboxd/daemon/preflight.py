"""Before the daemon starts: the checks that refuse a configuration which cannot work
(`preflight`), and the SQS endpoint the roles use (`sqs_endpoint`: the configured one, or
the embedded moto child on the embedded default)."""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

import structlog

from outboxd.config import ConfigError, Settings
from outboxd.errors import SecurityError
from outboxd.queue.embedded import EmbeddedSqs
from outboxd.queue.sqs import resolve_region
from outboxd.security import KeyRing
from outboxd.services.tasks import TASK_TYPES
from outboxd.storage.db import sqlite_path

log = structlog.get_logger(__name__)

EMBEDDED_EXTRA = "outboxd[embedded]"
# The user of systemd/outboxd.example.toml's [[auth.tokens]] entry, which must not stay.
PLACEHOLDER_USER = "CHANGE-ME"


def embedded_extra_missing() -> str | None:
    """The one line to show when embedded SQS is chosen but moto is not installed."""
    if importlib.util.find_spec("moto") is not None:
        return None
    return (
        f'config: sqs.endpoint_url = "embedded" needs the {EMBEDDED_EXTRA} extra, which is '
        f"not installed: {sys.executable} -m pip install '{EMBEDDED_EXTRA}' "
        "(or leave sqs.endpoint_url out to use AWS)"
    )


def preflight(settings: Settings, env: Mapping[str, str]) -> None:
    """Everything `serve` would refuse at start, short of reaching the database or SQS.

    Shared by `check-config` and `serve`; reads local files and the environment, writes
    nothing. Raises ConfigError whose str() is one line naming the key.
    """
    sqs = settings.sqs
    if sqs.endpoint_url == "embedded":
        missing = embedded_extra_missing()
        if missing is not None:
            raise ConfigError(missing)
    elif resolve_region(sqs, sqs.endpoint_url) is None:
        raise ConfigError(
            "config: sqs.region: no AWS region configured: set sqs.region (or AWS_REGION)"
        )
    keys_file = settings.security.keys_file
    try:
        if keys_file or env.get("OUTBOXD_SECRET_KEYS", "").strip():
            KeyRing.load(settings.resolve_path(keys_file) if keys_file else None, env)
        elif settings.storage.url.startswith("sqlite:///"):
            db_path = sqlite_path(settings.storage.url, settings.base_dir)
            default_file = db_path.with_name(db_path.name + ".keys")
            if default_file.exists():  # else serve creates it
                KeyRing.load(default_file, env)
        else:
            raise ConfigError(
                "config: security.keys_file: no encryption key: set security.keys_file "
                "or OUTBOXD_SECRET_KEYS"
            )
    except SecurityError as exc:
        raise ConfigError(f"config: {exc}") from None
    for i, job in enumerate(settings.scheduler.jobs):
        if job.task not in TASK_TYPES:
            raise ConfigError(
                f"config: scheduler.jobs[{i}].task: unknown task type {job.task!r} "
                f"(known: {', '.join(TASK_TYPES)})"
            )
    for i, tok in enumerate(settings.auth.tokens):
        if tok.sha256.strip("0") == "" or tok.user == PLACEHOLDER_USER:
            raise ConfigError(
                f"config: auth.tokens[{i}]: still the example's placeholder; make a token with "
                "`outboxd token create --user NAME --role admin` and paste its entry here"
            )
    cl = settings.scrapers.classifier
    if "claimer" in settings.daemon.roles and cl.provider == "rules" and not cl.rules:
        raise ConfigError(
            'config: scrapers.classifier.rules: provider "rules" with no rules fails every '
            'website; add rules (a last { category = "other" } matches the rest), or set '
            'provider = "openai"'
        )
    needs_key = "claimer" in settings.daemon.roles and cl.provider == "openai"
    if needs_key and not env.get(cl.api_key_env, "").strip():
        raise ConfigError(
            f"config: scrapers.classifier.api_key_env: environment variable "
            f"{cl.api_key_env} is not set (provider openai)"
        )


def endpoint_label(endpoint: str | None) -> str:
    return "aws" if endpoint is None else (urlsplit(endpoint).netloc or endpoint)


@contextlib.asynccontextmanager
async def sqs_endpoint(settings: Settings) -> AsyncIterator[str | None]:
    """The SQS endpoint URL, starting the embedded server when configured so."""
    if settings.sqs.endpoint_url != "embedded":
        yield settings.sqs.endpoint_url
        return
    log_path = None
    if settings.storage.url.startswith("sqlite:///"):
        log_path = sqlite_path(settings.storage.url, settings.base_dir).with_name(
            "embedded-sqs.log"
        )
    missing = embedded_extra_missing()
    if missing is not None:
        raise ConfigError(missing)
    embedded = EmbeddedSqs(log_path=log_path)
    url = await embedded.start()
    log.info("embedded_sqs_started", endpoint_url=url)
    try:
        yield url
    finally:
        await embedded.stop()
