"""Website classification: an OpenAI-compatible chat-completions client and offline rules.

The claimer calls `Classifier.classify` with no transaction held and decides what an
outcome means for the work row (docs/contract.md#the-fixed-delay-claimer):

- a returned category is applied;
- `RateLimited` (HTTP 429) pauses the claimer and does not count as an attempt;
- `ClassificationError` and its subclass `ProviderUnavailable` count as an attempt and
  the row is retried after `claimer.retry_delay_s`.

Exception messages are safe to log and to store as `lastError`: short, and never
containing the API key (some providers echo the key back in their 401 body).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Mapping
from email.utils import parsedate_to_datetime
from typing import Any, Protocol

import aiohttp

from outboxd.config import ClassifierRule, ClassifierSettings
from outboxd.errors import OutboxdError
from outboxd.metrics import RequestOutcome

__all__ = [
    "ClassificationError",
    "Classifier",
    "OpenAIClassifier",
    "ProviderUnavailable",
    "RateLimited",
    "RulesClassifier",
    "build_classifier",
    "parse_retry_after",
]

MESSAGE_LIMIT = 200
RETRY_AFTER_DEFAULT_S = 30.0
# A provider asking for hours would park the claimer for hours; an hour is already
# longer than any real quota window, and the next 429 will say so again if needed.
RETRY_AFTER_MAX_S = 3600.0


class ClassificationError(OutboxdError):
    """An attempt that reached (or may have reached) the provider and gave no category."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class ProviderUnavailable(ClassificationError):
    """Connection refused, timeout or 5xx: the request may or may not have been processed."""


class RateLimited(OutboxdError):
    """HTTP 429: come back after `retry_after_s` seconds; not an attempt."""

    def __init__(self, retry_after_s: float) -> None:
        super().__init__(f"rate limited; retry after {retry_after_s:g}s")
        self.retry_after_s = retry_after_s
        self.message = str(self)


CountRequest = Callable[[RequestOutcome], None]
"""Called once per request to the provider with how it ended (`Metrics.ai_request`)."""


def _uncounted(_outcome: RequestOutcome) -> None:
    return None


class Classifier(Protocol):
    async def classify(self, domain: str, favicon_url: str | None) -> str:
        """Return one of the configured categories, or raise one of this module's errors."""
        ...

    async def close(self) -> None: ...


def parse_retry_after(value: str | None, now: float | None = None) -> float:
    """Seconds to wait from a `Retry-After` header (delay-seconds or HTTP-date).

    Absent or unparseable gives 30 s; the result is capped at an hour.
    """
    if value is None or not value.strip():
        return RETRY_AFTER_DEFAULT_S
    text = value.strip()
    seconds: float
    try:
        seconds = float(text)
    except ValueError:
        try:
            when = parsedate_to_datetime(text)
        except (TypeError, ValueError, IndexError):
            return RETRY_AFTER_DEFAULT_S
        if when.tzinfo is None:
            # RFC 9110 dates are always GMT; a naive result means the zone was "-0000".
            return RETRY_AFTER_DEFAULT_S
        seconds = max(0.0, when.timestamp() - (time.time() if now is None else now))
    if math.isnan(seconds) or seconds < 0:
        return RETRY_AFTER_DEFAULT_S
    return min(seconds, RETRY_AFTER_MAX_S)


def _normalise_domain(domain: str) -> str:
    return domain.strip().lower().removesuffix(".")


class RulesClassifier:
    """Offline classification: the first rule (in configured order) that matches wins.

    `suffix` matches on a label boundary: "edu" and ".edu" both match "edu" and
    "mit.edu" but not "notedu"; `contains` is a plain substring test. A rule with
    both needs both; a rule with neither matches anything.
    """

    def __init__(self, settings: ClassifierSettings) -> None:
        unknown = [r.category for r in settings.rules if r.category not in settings.categories]
        if unknown:
            raise ValueError(f"classifier rule category not in categories: {unknown[0]!r}")
        self._rules: tuple[ClassifierRule, ...] = settings.rules

    @staticmethod
    def _matches(rule: ClassifierRule, domain: str) -> bool:
        if rule.suffix is not None:
            suffix = rule.suffix.strip().lower().strip(".")
            if not (domain == suffix or domain.endswith("." + suffix)):
                return False
        return rule.contains is None or rule.contains.lower() in domain

    async def classify(self, domain: str, favicon_url: str | None) -> str:
        name = _normalise_domain(domain)
        for rule in self._rules:
            if self._matches(rule, name):
                return rule.category
        raise ClassificationError("no rule matches")

    async def close(self) -> None:
        return None


def _one_line(value: str) -> str:
    # The fake AI (and our own prompt contract) reads "Domain: <domain>" from its own
    # line; a newline smuggled in a value must not forge or split that line.
    return " ".join(value.split())


class OpenAIClassifier:
    """Asks an OpenAI-compatible `/chat/completions` endpoint for one category word.

    The user message carries `Domain: <domain>` on its own line (testkit/fakes/ai.py
    relies on that convention) and, when known, `Favicon: <url>`.
    """

    def __init__(
        self,
        settings: ClassifierSettings,
        env: Mapping[str, str],
        count: CountRequest = _uncounted,
    ) -> None:
        key = env.get(settings.api_key_env, "").strip()
        if not key:
            raise ValueError(
                f"scrapers.classifier: environment variable {settings.api_key_env} "
                "is not set (needed by provider openai)"
            )
        self._api_key = key
        self._url = settings.base_url.rstrip("/") + "/chat/completions"
        self._model = settings.model
        self._key_env = settings.api_key_env
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_s)
        self._by_lower = {c.lower(): c for c in settings.categories}
        self._system_prompt = (
            "You classify websites by their domain name. Answer with exactly one word, "
            "which must be one of these categories: "
            + ", ".join(settings.categories)
            + ". No punctuation, no explanation."
        )
        self._session: aiohttp.ClientSession | None = None
        self._count = count

    def __repr__(self) -> str:
        return f"OpenAIClassifier(url={self._url!r}, model={self._model!r})"

    def _get_session(self) -> aiohttp.ClientSession:
        # Created on first use rather than in __init__ because aiohttp binds a session
        # to the running loop, and build_classifier runs before the loop exists.
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    def _safe(self, text: str) -> str:
        """One short line with the API key blotted out, fit for logs and lastError."""
        line = _one_line(text).replace(self._api_key, "***")
        if len(line) > MESSAGE_LIMIT:
            line = line[: MESSAGE_LIMIT - 3] + "..."
        return line

    def _payload(self, domain: str, favicon_url: str | None) -> dict[str, Any]:
        user = f"Classify this website.\nDomain: {_one_line(domain)}\n"
        if favicon_url:
            user += f"Favicon: {_one_line(favicon_url)}\n"
        return {
            "model": self._model,
            "messages": [
                {"role": "system", "content": self._system_prompt},
                {"role": "user", "content": user},
            ],
            "temperature": 0,
        }

    async def classify(self, domain: str, favicon_url: str | None) -> str:
        session = self._get_session()
        headers = {"Authorization": f"Bearer {self._api_key}"}
        try:
            async with session.post(
                self._url, json=self._payload(domain, favicon_url), headers=headers
            ) as resp:
                status = resp.status
                retry_after = resp.headers.get("Retry-After")
                body = await resp.read()
        except TimeoutError:
            self._count("timeout")
            raise ProviderUnavailable("provider timed out") from None
        except aiohttp.ClientError as exc:
            self._count("error")
            # The exception text can hold the URL but never the headers, so it is safe.
            raise ProviderUnavailable(
                self._safe(f"provider unreachable: {type(exc).__name__}: {exc}")
            ) from None

        self._count(_outcome(status))
        text = body.decode("utf-8", errors="replace")
        if status == 429:
            raise RateLimited(parse_retry_after(retry_after))
        if status in (401, 403):
            raise ClassificationError(
                self._safe(f"auth failed (HTTP {status}): check {self._key_env}: {text}")
            )
        if status >= 500:
            raise ProviderUnavailable(self._safe(f"provider error HTTP {status}: {text}"))
        if status != 200:
            raise ClassificationError(self._safe(f"unexpected HTTP {status}: {text}"))
        return self._answer(text)

    def _answer(self, text: str) -> str:
        try:
            data = json.loads(text)
            content = data["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError):
            raise ClassificationError(self._safe(f"malformed response: {text}")) from None
        if not isinstance(content, str):
            raise ClassificationError(self._safe(f"malformed response: {text}"))
        answer = content.strip().lower().removesuffix(".").strip()
        category = self._by_lower.get(answer)
        if category is None:
            raise ClassificationError(self._safe(f"answer outside categories: {content!r}"))
        return category

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


def _outcome(status: int) -> RequestOutcome:
    """How an answer with this HTTP status counts (a 200 whose body is unusable is `ok`:
    the provider answered)."""
    if status == 429:
        return "rate_limited"
    if status >= 500:
        return "unavailable"
    if status >= 400:
        return "rejected"
    return "ok"


def build_classifier(
    settings: ClassifierSettings, env: Mapping[str, str], count: CountRequest = _uncounted
) -> Classifier:
    """The classifier the settings ask for; `ValueError` when its API key is missing.
    `count` sees every request to the provider (the offline rules make none)."""
    if settings.provider == "openai":
        return OpenAIClassifier(settings, env, count)
    return RulesClassifier(settings)
