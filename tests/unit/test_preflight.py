"""What `check-config` and `serve` refuse before reaching anything (docs/contract.md#cli):
a scheduled task that is no known task type, an [[auth.tokens]] entry left at the shipped
example's placeholder, and the offline classifier with no rules while the claimer runs.
And the classifier's default: rules that classify every website."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

import pytest

from outboxd.config import DEFAULT_RULES, ConfigError, Settings
from outboxd.config_file import settings_from_mapping
from outboxd.daemon.preflight import preflight
from outboxd.scrapers.classifier import RulesClassifier
from outboxd.security import generate_key, generate_token, hash_token
from outboxd.services.tasks import TASK_TYPES

ROOT = Path(__file__).resolve().parents[2]
ENV = {"OUTBOXD_SECRET_KEYS": generate_key()}


def settings(raw: dict[str, Any]) -> Settings:
    base: dict[str, Any] = {
        "storage": {"url": "postgresql://u@127.0.0.1:1/db"},
        "sqs": {"region": "eu-west-1"},
    }
    return settings_from_mapping({**base, **raw}, env={}, base_dir=Path("/srv/outboxd"))


def refusal(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as exc:
        preflight(settings(raw), ENV)
    line = str(exc.value)
    assert "\n" not in line, line
    return line


def test_a_scheduled_task_of_no_known_type_is_refused() -> None:
    jobs = [
        {"name": "ok", "every_s": 60, "task": "noop"},
        {"name": "typo", "cron": "0 3 * * *", "task": "outbox.purne"},
    ]
    line = refusal({"scheduler": {"jobs": jobs}})
    assert line.startswith("config: scheduler.jobs[1].task:"), line
    assert "outbox.purne" in line and all(t in line for t in TASK_TYPES)


def test_every_known_task_type_passes() -> None:
    jobs = [{"name": f"j{i}", "every_s": 60, "task": t} for i, t in enumerate(TASK_TYPES)]
    preflight(settings({"scheduler": {"jobs": jobs}}), ENV)


def test_the_examples_placeholder_token_is_refused() -> None:
    example = tomllib.loads((ROOT / "systemd" / "outboxd.example.toml").read_text())
    placeholder = example["auth"]["tokens"][0]
    line = refusal({"auth": {"tokens": [placeholder]}})
    assert line.startswith("config: auth.tokens[0]:") and "token create" in line, line
    # Either half of it alone is still the placeholder.
    real = hash_token(generate_token())
    assert "auth.tokens[1]" in refusal(
        {
            "auth": {
                "tokens": [
                    {"sha256": real, "user": "ops"},
                    {"sha256": hash_token(generate_token()), "user": placeholder["user"]},
                ]
            }
        }
    )
    assert "auth.tokens[0]" in refusal({"auth": {"tokens": [{**placeholder, "user": "ops"}]}})
    preflight(settings({"auth": {"tokens": [{"sha256": real, "user": "ops"}]}}), ENV)


def test_rules_without_any_rule_are_refused_while_the_claimer_runs() -> None:
    no_rules = {"scrapers": {"classifier": {"provider": "rules", "rules": []}}}
    line = refusal(no_rules)
    assert line.startswith("config: scrapers.classifier.rules:"), line
    assert 'category = "other"' in line and "openai" in line
    # Without the claimer role nothing classifies, so nothing is wrong.
    preflight(settings({**no_rules, "daemon": {"roles": ["api", "relay"]}}), ENV)


async def test_the_default_rules_classify_every_website() -> None:
    s = settings({})
    assert s.scrapers.classifier.provider == "rules"
    assert s.scrapers.classifier.rules == DEFAULT_RULES
    preflight(s, ENV)
    rules = RulesClassifier(s.scrapers.classifier)
    assert await rules.classify("www.suwon.ac.kr", None) == "education"
    assert await rules.classify("mit.edu", None) == "education"
    assert await rules.classify("usa.gov", None) == "government"
    assert await rules.classify("dailynews.example", None) == "news"
    assert await rules.classify("anything.example", None) == "other"


def test_own_categories_keep_the_default_rules_that_fit_them() -> None:
    s = settings({"scrapers": {"classifier": {"categories": ["education", "other"]}}})
    assert {r.category for r in s.scrapers.classifier.rules} == {"education", "other"}
    s = settings({"scrapers": {"classifier": {"categories": ["a", "b"]}}})
    assert s.scrapers.classifier.rules == ()
    assert "scrapers.classifier.rules" in refusal(
        {"scrapers": {"classifier": {"categories": ["a", "b"]}}}
    )
