"""Config defaults that never contradict what the user wrote, and the SQS endpoint choice."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from outboxd.config import ConfigError, Settings
from outboxd.config_file import settings_from_mapping


def load(raw: dict[str, Any]) -> Settings:
    return settings_from_mapping(raw, env={}, base_dir=Path("/srv/outboxd"))


def config_error(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as exc:
        load(raw)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    return msg


def test_only_a_short_visibility_timeout_is_valid() -> None:
    """sqs.visibility_timeout_s = 6 alone: the heartbeat follows it (a third), no error."""
    s = load({"sqs": {"visibility_timeout_s": 6}})
    assert s.sqs.visibility_timeout_s == 6
    assert s.consumer.heartbeat_s == pytest.approx(2.0)
    assert s.consumer.heartbeat_s < s.sqs.visibility_timeout_s


def test_heartbeat_default_is_a_third_of_the_visibility_timeout() -> None:
    assert load({}).consumer.heartbeat_s == pytest.approx(60 / 3)
    assert load({"sqs": {"visibility_timeout_s": 90}}).consumer.heartbeat_s == pytest.approx(30)
    # From an environment override too.
    s = settings_from_mapping({}, env={"OUTBOXD_SQS__VISIBILITY_TIMEOUT_S": "9"})
    assert s.consumer.heartbeat_s == pytest.approx(3)
    # A written heartbeat is kept as written.
    assert load({"consumer": {"heartbeat_s": 5}}).consumer.heartbeat_s == 5


@pytest.mark.parametrize(
    ("raw", "check"),
    [
        ({"relay": {"backoff_base_s": 600}}, lambda s: s.relay.backoff_max_s == 600),
        (
            {"scrapers": {"classifier": {"provider": "openai", "timeout_s": 400}}},
            lambda s: s.claimer.processing_timeout_s > 400,
        ),
        ({"sqs": {"visibility_timeout_s": 1}}, lambda s: s.consumer.heartbeat_s < 1),
    ],
)
def test_one_written_key_never_fails_on_a_default(raw: dict[str, Any], check: Any) -> None:
    """Each cross-key rule, with only one side written: the other side's default follows."""
    assert check(load(raw))


@pytest.mark.parametrize(
    ("raw", "keys"),
    [
        (
            {"sqs": {"visibility_timeout_s": 6}, "consumer": {"heartbeat_s": 6}},
            ("consumer.heartbeat_s", "sqs.visibility_timeout_s"),
        ),
        # A written heartbeat against the default visibility timeout (60): the user
        # wrote the failing value, and the message says what it is compared with.
        ({"consumer": {"heartbeat_s": 70}}, ("consumer.heartbeat_s", "sqs.visibility_timeout_s")),
        (
            {"relay": {"backoff_base_s": 10, "backoff_max_s": 5}},
            ("relay.backoff_max_s", "relay.backoff_base_s"),
        ),
        (
            {
                "scrapers": {"classifier": {"provider": "openai", "timeout_s": 60}},
                "claimer": {"processing_timeout_s": 30},
            },
            ("claimer.processing_timeout_s", "scrapers.classifier.timeout_s"),
        ),
        (
            {"scrapers": {"classifier": {"categories": ["a"], "rules": [{"category": "b"}]}}},
            ("scrapers.classifier.rules[0].category", "scrapers.classifier.categories"),
        ),
        ({"server": {"host": "0.0.0.0"}}, ("server.host", "auth.tokens")),
    ],
)
def test_written_contradiction_names_both_keys(raw: dict[str, Any], keys: tuple[str, str]) -> None:
    msg = config_error(raw)
    for key in keys:
        assert key in msg, msg


def test_absent_endpoint_means_aws() -> None:
    assert load({"sqs": {"region": "eu-west-1"}}).sqs.endpoint_url is None


@pytest.mark.parametrize("value", ["", " ", "localhost:4566", "ftp://x", "http://", "Embedded"])
def test_bad_endpoint_is_a_config_error_naming_the_key(value: str) -> None:
    msg = config_error({"sqs": {"endpoint_url": value}})
    assert msg.startswith("config: sqs.endpoint_url:"), msg


def test_empty_endpoint_from_the_environment_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"sqs\.endpoint_url"):
        settings_from_mapping({}, env={"OUTBOXD_SQS__ENDPOINT_URL": '""'})


@pytest.mark.parametrize("value", ["embedded", "http://127.0.0.1:4566", "https://sqs.example.com"])
def test_good_endpoints_are_kept(value: str) -> None:
    assert load({"sqs": {"endpoint_url": value}}).sqs.endpoint_url == value


def test_max_waiters_follows_max_connections_unless_written() -> None:
    """Held requests keep their connections: api.max_waiters is at most three quarters of
    server.max_connections. The defaults agree (768 of 1024); a written max_connections
    alone brings max_waiters along, so only a written max_waiters can break the rule."""
    defaults = load({})
    assert (defaults.server.max_connections, defaults.api.max_waiters) == (1024, 768)
    assert defaults.api.max_waiters_per_user == 100
    assert load({"server": {"max_connections": 40}}).api.max_waiters == 30
    assert load({"server": {"max_connections": 1}}).api.max_waiters == 0
    env = settings_from_mapping({}, env={"OUTBOXD_SERVER__MAX_CONNECTIONS": "200"})
    assert env.api.max_waiters == 150
    # Written and within it: kept as written.
    written = {"server": {"max_connections": 40}, "api": {"max_waiters": 10}}
    assert load(written).api.max_waiters == 10
    assert load({"api": {"max_waiters": 768}}).api.max_waiters == 768
    for raw in (
        {"api": {"max_waiters": 769}},
        {"api": {"max_waiters": 10_000}},
        {"server": {"max_connections": 40}, "api": {"max_waiters": 31}},
    ):
        msg = config_error(raw)
        assert msg.startswith("config: api.max_waiters:") and "server.max_connections" in msg, msg
    assert config_error({"api": {"max_waiters_per_user": -1}}).startswith(
        "config: api.max_waiters_per_user:"
    )
    # A max_connections of the wrong type is left for its own error, not this rule's.
    assert config_error({"server": {"max_connections": "many"}}).startswith(
        "config: server.max_connections:"
    )
