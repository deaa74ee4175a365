"""The in-process fake AI's key, and an OpenAI classifier pointed at it
(tests/integration's `ai` fixture starts the fake)."""

from __future__ import annotations

from testkit.fakes.ai import FakeAI

from outboxd.config import ClassifierSettings
from outboxd.scrapers.classifier import OpenAIClassifier

AI_KEY_ENV = "OUTBOXD_TEST_AI_KEY"
# Distinctive, so a leak is unmistakable in any message.
AI_KEY = "sk-test-9f3c1a7e5b2d4c68"


def ai_settings(ai: FakeAI, timeout_s: float = 5.0) -> ClassifierSettings:
    return ClassifierSettings(
        provider="openai",
        base_url=ai.base_url,
        model="test-model",
        api_key_env=AI_KEY_ENV,
        timeout_s=timeout_s,
    )


def classifier_for(ai: FakeAI, key: str = AI_KEY) -> OpenAIClassifier:
    """A classifier on the fake (closed by its caller)."""
    return OpenAIClassifier(ai_settings(ai), {AI_KEY_ENV: key})
