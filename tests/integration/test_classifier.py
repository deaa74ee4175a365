"""The classifier against rules and against a real (fake) OpenAI-compatible HTTP server."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
import pytest_asyncio
from testkit.fakes.ai import FakeAI

from outboxd.config import ClassifierRule, ClassifierSettings
from outboxd.scrapers.classifier import (
    ClassificationError,
    OpenAIClassifier,
    ProviderUnavailable,
    RateLimited,
    RulesClassifier,
    build_classifier,
    parse_retry_after,
)
from tests.support.ai import AI_KEY, AI_KEY_ENV, ai_settings
from tests.support.waits import eventually

REPO_ROOT = Path(__file__).resolve().parents[2]


def rules_settings(*rules: ClassifierRule) -> ClassifierSettings:
    return ClassifierSettings(provider="rules", rules=rules)


@pytest_asyncio.fixture
async def make_client() -> AsyncIterator[Callable[..., OpenAIClassifier]]:
    made: list[OpenAIClassifier] = []

    def make(settings: ClassifierSettings, key: str = AI_KEY) -> OpenAIClassifier:
        client = OpenAIClassifier(settings, {AI_KEY_ENV: key})
        made.append(client)
        return client

    yield make
    for client in made:
        await client.close()


@pytest_asyncio.fixture
async def client(ai: FakeAI, make_client: Callable[..., OpenAIClassifier]) -> OpenAIClassifier:
    return make_client(ai_settings(ai))


# --- rules -------------------------------------------------------------------------------


async def test_rules_first_matching_rule_wins() -> None:
    """When several rules match, the earliest one in configured order decides."""
    classifier = RulesClassifier(
        rules_settings(
            ClassifierRule("news", contains="news"),
            ClassifierRule("education", suffix="edu"),
            ClassifierRule("other"),
        )
    )
    assert await classifier.classify("news.mit.edu", None) == "news"
    assert await classifier.classify("cs.mit.edu", None) == "education"


async def test_rules_suffix_matches_on_label_boundary() -> None:
    """A suffix matches the whole domain or a dot-separated tail, never a part of a label."""
    classifier = RulesClassifier(
        rules_settings(
            ClassifierRule("education", suffix="edu"),
            ClassifierRule("education", suffix=".ac.kr"),
        )
    )
    assert await classifier.classify("mit.edu", None) == "education"
    assert await classifier.classify("edu", None) == "education"
    assert await classifier.classify("suwon.ac.kr", None) == "education"
    assert await classifier.classify("MIT.EDU.", None) == "education"
    for domain in ("notedu", "fakeedu.com", "xac.kr"):
        with pytest.raises(ClassificationError):
            await classifier.classify(domain, None)


async def test_rules_suffix_and_contains_both_required() -> None:
    """A rule with both a suffix and a substring matches only domains that satisfy both."""
    classifier = RulesClassifier(
        rules_settings(ClassifierRule("shopping", suffix="com", contains="shop"))
    )
    assert await classifier.classify("myshop.com", None) == "shopping"
    with pytest.raises(ClassificationError):
        await classifier.classify("myshop.org", None)
    with pytest.raises(ClassificationError):
        await classifier.classify("example.com", None)


async def test_rules_catch_all_matches_anything() -> None:
    """A rule with neither suffix nor substring matches every domain that reaches it."""
    classifier = RulesClassifier(
        rules_settings(ClassifierRule("government", suffix="gov"), ClassifierRule("other"))
    )
    assert await classifier.classify("usa.gov", None) == "government"
    assert await classifier.classify("example.org", None) == "other"


async def test_rules_no_match_raises() -> None:
    """A domain no rule matches raises ClassificationError("no rule matches")."""
    classifier = RulesClassifier(rules_settings(ClassifierRule("education", suffix="edu")))
    with pytest.raises(ClassificationError) as info:
        await classifier.classify("example.com", None)
    assert info.value.message == "no rule matches"


def test_rules_reject_category_outside_list() -> None:
    """A rule naming a category that is not configured is refused at construction."""
    with pytest.raises(ValueError, match="bogus"):
        RulesClassifier(rules_settings(ClassifierRule("bogus")))


# --- openai-compatible -------------------------------------------------------------------


async def test_openai_returns_category(ai: FakeAI, client: OpenAIClassifier) -> None:
    """The provider's answer for the domain is returned, falling back to its default."""
    ai.categories_by_domain["bbc.co.uk"] = "news"
    assert await client.classify("bbc.co.uk", "https://bbc.co.uk/favicon.ico") == "news"
    assert await client.classify("python.org", None) == "technology"


async def test_openai_request_shape(ai: FakeAI, client: OpenAIClassifier) -> None:
    """The request names the model, uses temperature 0, lists the categories and the domain."""
    await client.classify("example.com", None)
    body = ai.requests[-1]
    assert body["model"] == "test-model"
    assert body["temperature"] == 0
    system, user = body["messages"]
    assert system["role"] == "system" and user["role"] == "user"
    for category in ClassifierSettings().categories:
        assert category in system["content"]
    assert "Domain: example.com" in user["content"].splitlines()


async def test_openai_answer_is_normalised(ai: FakeAI, client: OpenAIClassifier) -> None:
    """Whitespace, capitals and one trailing period around a valid category are tolerated."""
    ai.answer_override = "  News.\n"
    assert await client.classify("example.com", None) == "news"


async def test_openai_answer_outside_categories(ai: FakeAI, client: OpenAIClassifier) -> None:
    """An answer that is not one of the categories is a ClassificationError."""
    ai.answer_override = "weather"
    with pytest.raises(ClassificationError) as info:
        await client.classify("example.com", None)
    assert not isinstance(info.value, ProviderUnavailable)
    assert "answer outside categories" in info.value.message
    assert "weather" in info.value.message


@pytest.mark.parametrize(
    "body",
    [b'{"object": "list", "data": []}', b"<html>gateway says hi</html>", b"x" * 5000],
)
async def test_openai_malformed_response(ai: FakeAI, client: OpenAIClassifier, body: bytes) -> None:
    """A 200 that is not a chat completion is a ClassificationError with a short message."""
    ai.malformed = True
    ai.malformed_body = body
    with pytest.raises(ClassificationError) as info:
        await client.classify("example.com", None)
    assert not isinstance(info.value, ProviderUnavailable)
    assert info.value.message.startswith("malformed response")
    assert len(info.value.message) <= 200


async def test_openai_429_retry_after_seconds(ai: FakeAI, client: OpenAIClassifier) -> None:
    """A 429 with Retry-After in seconds raises RateLimited carrying that delay."""
    ai.rate_limit_next_n(1, retry_after_s=17)
    with pytest.raises(RateLimited) as info:
        await client.classify("example.com", None)
    assert info.value.retry_after_s == pytest.approx(17)
    assert await client.classify("example.com", None) == "technology"


async def test_openai_429_retry_after_http_date(ai: FakeAI, client: OpenAIClassifier) -> None:
    """A 429 with Retry-After as an HTTP-date raises RateLimited with the seconds until then."""
    ai.rate_limit_next_n(1, retry_after_s=120, http_date=True)
    with pytest.raises(RateLimited) as info:
        await client.classify("example.com", None)
    assert info.value.retry_after_s == pytest.approx(120, abs=3)


@pytest.mark.parametrize(("retry_after", "expected"), [(None, 30.0), (99999, 3600.0)])
async def test_openai_429_retry_after_default_and_cap(
    ai: FakeAI, client: OpenAIClassifier, retry_after: float | None, expected: float
) -> None:
    """A 429 without Retry-After waits 30 s, and a huge Retry-After is capped at an hour."""
    ai.rate_limit_next_n(1, retry_after_s=retry_after)
    with pytest.raises(RateLimited) as info:
        await client.classify("example.com", None)
    assert info.value.retry_after_s == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("5", 5.0),
        ("  0 ", 0.0),
        ("soon", 30.0),
        ("-4", 30.0),
        ("", 30.0),
        ("Thu, 01 Jan 1970 00:00:00 GMT", 0.0),
        ("Thu, 01 Jan 1970 00:01:40 GMT", 40.0),
    ],
)
def test_parse_retry_after(value: str, expected: float) -> None:
    """Retry-After parses seconds and HTTP-dates; junk and negatives fall back to 30 s."""
    assert parse_retry_after(value, now=60.0) == expected


@pytest.mark.parametrize("status", [500, 502, 503])
async def test_openai_5xx_is_provider_unavailable(
    ai: FakeAI, client: OpenAIClassifier, status: int
) -> None:
    """A 5xx answer raises ProviderUnavailable, and the next call can succeed."""
    ai.fail_next_n(1, status=status)
    with pytest.raises(ProviderUnavailable) as info:
        await client.classify("example.com", None)
    assert str(status) in info.value.message
    assert await client.classify("example.com", None) == "technology"


async def test_openai_always_fail(ai: FakeAI, client: OpenAIClassifier) -> None:
    """With the provider failing every call, every classification raises ProviderUnavailable."""
    ai.always_fail = True
    for _ in range(2):
        with pytest.raises(ProviderUnavailable):
            await client.classify("example.com", None)


async def test_openai_timeout_is_provider_unavailable(
    ai: FakeAI, make_client: Callable[..., OpenAIClassifier]
) -> None:
    """An answer slower than timeout_s raises ProviderUnavailable within about timeout_s."""
    ai.delay_s = 10
    client = make_client(ai_settings(ai, timeout_s=0.3))
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable, match="timed out"):
        await client.classify("example.com", None)
    assert time.monotonic() - started < 3


async def test_openai_connection_refused_is_provider_unavailable(
    make_client: Callable[..., OpenAIClassifier],
) -> None:
    """Nobody listening on the port raises ProviderUnavailable."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    settings = ClassifierSettings(
        provider="openai", base_url=f"http://127.0.0.1:{port}/v1", api_key_env=AI_KEY_ENV
    )
    with pytest.raises(ProviderUnavailable, match="unreachable"):
        await make_client(settings).classify("example.com", None)


async def test_openai_wrong_key_is_auth_error(
    ai: FakeAI, make_client: Callable[..., OpenAIClassifier]
) -> None:
    """A rejected key is a ClassificationError saying auth failed, without echoing the key."""
    wrong = "sk-wrong-0d1e2a3d4b5e"
    client = make_client(ai_settings(ai), key=wrong)
    with pytest.raises(ClassificationError) as info:
        await client.classify("example.com", None)
    assert not isinstance(info.value, ProviderUnavailable)
    assert "auth failed" in info.value.message
    assert AI_KEY_ENV in info.value.message
    assert wrong not in info.value.message and wrong not in str(info.value)
    assert ai.calls[-1].status == 401


async def test_api_key_never_in_messages(
    ai: FakeAI, make_client: Callable[..., OpenAIClassifier]
) -> None:
    """No failure mode puts the API key into an exception message or the client's repr."""
    client = make_client(ai_settings(ai))
    failures: list[Callable[[], None]] = [
        lambda: setattr(ai, "answer_override", AI_KEY),
        lambda: ai.fail_next_n(1, status=500),
        lambda: ai.rate_limit_next_n(1, retry_after_s=1),
    ]
    for arrange in failures:
        ai.answer_override = None
        arrange()
        with pytest.raises((ClassificationError, RateLimited)) as info:
            await client.classify("example.com", None)
        assert AI_KEY not in str(info.value)
    ai.answer_override = None
    ai.malformed = True
    ai.malformed_body = json.dumps({"echo": AI_KEY}).encode()
    with pytest.raises(ClassificationError) as err:
        await client.classify("example.com", None)
    assert AI_KEY not in err.value.message
    assert AI_KEY not in repr(client)


# --- build_classifier --------------------------------------------------------------------


@pytest.mark.parametrize("env", [{}, {AI_KEY_ENV: ""}, {AI_KEY_ENV: "   "}])
def test_build_openai_without_key_names_env_var(env: dict[str, str]) -> None:
    """Provider openai with its key variable unset or blank fails at build time naming it."""
    settings = ClassifierSettings(provider="openai", api_key_env=AI_KEY_ENV)
    with pytest.raises(ValueError, match=AI_KEY_ENV):
        build_classifier(settings, env)


async def test_build_picks_provider(ai: FakeAI) -> None:
    """build_classifier returns rules or an OpenAI client as the settings ask."""
    rules = build_classifier(rules_settings(ClassifierRule("other")), {})
    assert isinstance(rules, RulesClassifier)
    assert await rules.classify("example.com", None) == "other"
    client = build_classifier(ai_settings(ai), {AI_KEY_ENV: AI_KEY})
    try:
        assert isinstance(client, OpenAIClassifier)
        assert await client.classify("example.com", None) == "technology"
    finally:
        await client.close()
        await client.close()


# --- the fake itself ---------------------------------------------------------------------


async def test_fake_records_calls(ai: FakeAI, client: OpenAIClassifier) -> None:
    """The fake records each call's domain and status, and the peak concurrency."""
    ai.delay_s = 0.2
    ai.rate_limit_next_n(1, retry_after_s=1)
    results = await asyncio.gather(
        client.classify("a.example", None),
        client.classify("b.example", None),
        client.classify("b.example", None),
        return_exceptions=True,
    )
    assert sum(isinstance(r, RateLimited) for r in results) == 1
    assert sorted(c.domain for c in ai.calls) == ["a.example", "b.example", "b.example"]
    assert sorted(c.status for c in ai.calls) == [200, 200, 429]
    assert all(c.finished_at_monotonic >= c.started_at_monotonic for c in ai.calls)
    assert ai.in_flight_max == 3
    assert ai.in_flight_by_domain_max == {"a.example": 1, "b.example": 2}


async def _wait_for_file(path: Path, proc: subprocess.Popen[bytes], deadline_s: float) -> None:
    def written() -> bool:
        assert proc.poll() is None, "fake AI exited early"
        return path.exists()

    await eventually(written, deadline_s, what=f"{path} to be written")


async def test_fake_standalone_serves_and_records(
    tmp_path: Path, make_client: Callable[..., OpenAIClassifier]
) -> None:
    """Run as a module, the fake writes its base_url, records wall-clock calls, stops on SIGTERM."""
    port_file, record_file = tmp_path / "ai.json", tmp_path / "calls.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "testkit.fakes.ai",
            "--port-file",
            str(port_file),
            "--record-file",
            str(record_file),
            "--api-key",
            AI_KEY,
            "--category",
            "bbc.co.uk=news",
        ],
        cwd=REPO_ROOT,
    )
    try:
        await _wait_for_file(port_file, proc, deadline_s=15)
        base_url = json.loads(port_file.read_text())["base_url"]
        settings = ClassifierSettings(provider="openai", base_url=base_url, api_key_env=AI_KEY_ENV)
        before = time.time()
        assert await make_client(settings).classify("bbc.co.uk", None) == "news"
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    (line,) = record_file.read_text().splitlines()
    record = json.loads(line)
    assert record["domain"] == "bbc.co.uk" and record["status"] == 200
    assert before - 1 <= record["start"] <= record["end"] <= time.time()
