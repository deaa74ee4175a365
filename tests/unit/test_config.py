"""Config: one-line validation errors naming the key, env overrides, paths, check-config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outboxd.config import ConfigError, Settings
from outboxd.config_file import load_settings, settings_from_mapping
from outboxd.storage.db import sqlite_path
from tests.support.ops import run_cli


def load(raw: dict[str, Any], env: dict[str, str] | None = None) -> Settings:
    return settings_from_mapping(raw, env=env or {}, base_dir=Path("/srv/outboxd"))


def config_error(raw: dict[str, Any], env: dict[str, str] | None = None) -> str:
    with pytest.raises(ConfigError) as exc:
        load(raw, env)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_defaults_are_valid() -> None:
    """An empty config: SQLite beside the config; SQS is AWS (embedded only when written)."""
    s = load({})
    assert s.storage.url == "sqlite:///var/outboxd.db"
    assert s.sqs.endpoint_url is None
    assert s.sqs.wait_time_s == 20 and s.relay.batch_size == 10


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"nope": 1}, "nope"),
        ({"sqs": {"wait_time": 5}}, "sqs.wait_time"),
        ({"server": {"hostname": "x"}}, "server.hostname"),
        ({"scrapers": {"suwon": {"timeout": 3}}}, "scrapers.suwon.timeout"),
        ({"auth": {"tokens": [{"sha256": "a" * 64, "user": "u", "extra": 1}]}}, "auth.tokens[0]"),
    ],
)
def test_unknown_key_is_named(raw: dict[str, Any], key: str) -> None:
    """An unknown key stops validation with one line naming the key."""
    msg = config_error(raw)
    assert key in msg and "unknown" in msg


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"server": {"port": "8080"}}, "server.port"),
        ({"sqs": {"wait_time_s": 1.5}}, "sqs.wait_time_s"),
        ({"sqs": {"wait_time_s": True}}, "sqs.wait_time_s"),
        ({"api": {"require_dispatch": "yes"}}, "api.require_dispatch"),
        ({"relay": {"interval_s": "1"}}, "relay.interval_s"),
        ({"daemon": {"roles": "api"}}, "daemon.roles"),
        ({"storage": []}, "storage"),
        ({"logging": {"format": "xml"}}, "logging.format"),
    ],
)
def test_wrong_type_is_named(raw: dict[str, Any], key: str) -> None:
    """A value of the wrong type stops validation with one line naming the key."""
    assert key in config_error(raw)


@pytest.mark.parametrize(
    ("raw", "key"),
    [
        ({"sqs": {"wait_time_s": 21}}, "sqs.wait_time_s"),
        ({"sqs": {"wait_time_s": -1}}, "sqs.wait_time_s"),
        ({"relay": {"batch_size": 11}}, "relay.batch_size"),
        ({"relay": {"batch_size": 0}}, "relay.batch_size"),
        ({"server": {"port": 70000}}, "server.port"),
        ({"storage": {"url": "mysql://x/y"}}, "storage.url"),
        ({"storage": {"pool_size": 0}}, "storage.pool_size"),
        ({"sqs": {"tasks_queue": "tasks"}}, "sqs.tasks_queue"),
        ({"relay": {"publish_timeout_s": 0}}, "relay.publish_timeout_s"),
        ({"daemon": {"roles": ["api", "web"]}}, "daemon.roles"),
        ({"metrics": {"refresh_s": -1}}, "metrics.refresh_s"),
        ({"consumer": {"dlq_sweep_s": 0}}, "consumer.dlq_sweep_s"),
        ({"auth": {"tokens": [{"sha256": "xyz", "user": "u"}]}}, "auth.tokens[0].sha256"),
    ],
)
def test_impossible_value_is_named(raw: dict[str, Any], key: str) -> None:
    """An impossible value stops validation with one line naming the key."""
    assert key in config_error(raw)


def test_boundary_values_are_accepted() -> None:
    """wait_time_s 0 and 20 and batch_size 1 and 10 are all valid."""
    for wait in (0, 20):
        assert load({"sqs": {"wait_time_s": wait}}).sqs.wait_time_s == wait
    for size in (1, 10):
        assert load({"relay": {"batch_size": size}}).relay.batch_size == size


def test_env_overrides_a_single_value() -> None:
    """OUTBOXD_SQS__WAIT_TIME_S=5 overrides [sqs] wait_time_s and leaves the rest alone."""
    s = load(
        {"sqs": {"wait_time_s": 10, "max_receive_count": 3}}, {"OUTBOXD_SQS__WAIT_TIME_S": "5"}
    )
    assert s.sqs.wait_time_s == 5
    assert s.sqs.max_receive_count == 3
    s2 = load({}, {"OUTBOXD_SCRAPERS__SUWON__VERIFY_TLS": "false", "OUTBOXD_SERVER__HOST": "::1"})
    assert s2.scrapers.suwon.verify_tls is False
    assert s2.server.host == "::1"


def test_env_override_is_validated_like_the_file() -> None:
    """An impossible or unknown environment override is rejected naming the key."""
    assert "sqs.wait_time_s" in config_error({}, {"OUTBOXD_SQS__WAIT_TIME_S": "21"})
    assert "sqs.bogus" in config_error({}, {"OUTBOXD_SQS__BOGUS": "1"})


def test_env_variables_without_section_separator_are_ignored() -> None:
    """OUTBOXD_CONFIG and other single-word variables are not overrides."""
    s = load({}, {"OUTBOXD_CONFIG": "/etc/outboxd.toml", "OUTBOXD_SECRET_KEYS": "abc"})
    assert s == load({})


def test_relative_sqlite_path_is_relative_to_the_config_file(tmp_path: Path) -> None:
    """sqlite:///rel resolves against the config file's folder; sqlite:////abs is absolute."""
    folder = tmp_path / "etc"
    folder.mkdir()
    cfg = folder / "outboxd.toml"
    cfg.write_text('[storage]\nurl = "sqlite:///var/outboxd.db"\n')
    s = load_settings(cfg, env={})
    assert s.base_dir == folder.resolve()
    assert sqlite_path(s.storage.url, s.base_dir) == folder.resolve() / "var" / "outboxd.db"
    cfg.write_text('[storage]\nurl = "sqlite:////var/lib/outboxd/outboxd.db"\n')
    s = load_settings(cfg, env={})
    assert sqlite_path(s.storage.url, s.base_dir) == Path("/var/lib/outboxd/outboxd.db")
    assert s.resolve_path("keys") == folder.resolve() / "keys"


def test_toml_errors_are_one_line(tmp_path: Path) -> None:
    """A missing file or invalid TOML is a one-line ConfigError."""
    with pytest.raises(ConfigError) as missing:
        load_settings(tmp_path / "absent.toml", env={})
    assert "\n" not in str(missing.value)
    bad = tmp_path / "bad.toml"
    bad.write_text("[server\nport = 1\n")
    with pytest.raises(ConfigError) as invalid:
        load_settings(bad, env={})
    assert "\n" not in str(invalid.value)


def test_check_config_exits_2_with_one_line(tmp_path: Path) -> None:
    """`outboxd check-config` on a bad file exits 2 printing one line naming the key; good: 0."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[sqs]\nwait_time_s = 21\n")
    proc = run_cli("check-config", "--config", str(bad), cwd=tmp_path)
    assert proc.returncode == 2, proc
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1, lines
    assert "sqs.wait_time_s" in lines[0]

    good = tmp_path / "good.toml"
    good.write_text(
        '[sqs]\nwait_time_s = 5\nregion = "eu-west-1"\n[storage]\nurl = "sqlite:///var/x.db"\n'
    )
    ok = run_cli("check-config", "--config", str(good), cwd=tmp_path)
    assert ok.returncode == 0, ok
