"""Each request to the portal and to the AI provider is counted once, by how it ended
(`outboxd_portal_requests_total{outcome}`, `outboxd_ai_requests_total{outcome}`), against
the fakes failing as the real ones do (real servers on loopback)."""

from __future__ import annotations

import dataclasses
import socket
from collections import Counter
from collections.abc import AsyncIterator

import pytest
import pytest_asyncio
from prometheus_client import generate_latest
from testkit.fakes.ai import FakeAI
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO, FakePortal

from outboxd.config import SuwonScraperSettings
from outboxd.metrics import Metrics, RequestOutcome
from outboxd.scrapers.classifier import (
    ClassificationError,
    OpenAIClassifier,
    ProviderUnavailable,
    RateLimited,
)
from outboxd.scrapers.suwon import SuwonScraper
from outboxd.scrapers.suwon_answers import PortalError
from tests.support.ai import AI_KEY, AI_KEY_ENV, ai_settings

# The default student of the fake has three semesters: index, login (and its two
# redirects), the SSO page, its target (and one redirect), profile, semesters, and one
# grades call per semester.
REQUESTS_PER_JOB = 12


class Outcomes:
    """The counting callback: what the scraper counted, in order."""

    def __init__(self) -> None:
        self.seen: list[RequestOutcome] = []

    def __call__(self, outcome: RequestOutcome) -> None:
        self.seen.append(outcome)

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.seen)


async def _progress(step: str, done: int, total: int) -> None:
    return None


def _closed_port() -> int:
    """A loopback port nothing listens on (connections to it are refused)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


@pytest_asyncio.fixture
async def portal() -> AsyncIterator[FakePortal]:
    async with FakePortal() as fake:
        yield fake


def _scraper(
    portal: FakePortal, count: Outcomes, *, timeout_s: float = 5.0, portal_url: str = ""
) -> SuwonScraper:
    settings = SuwonScraperSettings(
        portal_base_url=portal_url or portal.portal_base_url,
        info_base_url=portal.info_base_url,
        timeout_s=timeout_s,
        min_interval_s=0.0,
    )
    return SuwonScraper(settings, count=count)


async def test_a_portal_job_counts_each_request_ok(portal: FakePortal) -> None:
    """A job that succeeds counts every request, redirect hops included, as `ok`: as many
    as the portal saw, which is what docs/operations.md's politeness figures rest on."""
    count = Outcomes()
    scraper = _scraper(portal, count)
    try:
        await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, _progress)
    finally:
        await scraper.close()
    assert count.counts == {"ok": REQUESTS_PER_JOB}
    assert len(portal.requests) == REQUESTS_PER_JOB


async def test_a_refused_login_counts_rejected(portal: FakePortal) -> None:
    """The portal answers a wrong password with 200 and a page: that request is `rejected`
    (its index page before it was `ok`), and so is a 4xx rejection page."""
    for status in (200, 401):
        portal.reject_status = status
        count = Outcomes()
        scraper = _scraper(portal, count)
        try:
            with pytest.raises(PortalError) as caught:
                await scraper.fetch_record(SAMPLE_SNO, "wrong password", _progress)
        finally:
            await scraper.close()
        assert caught.value.code == "PORTAL_AUTH_FAILED"
        assert count.seen == ["ok", "rejected"], status


async def test_a_failing_portal_counts_unavailable_timeout_and_error(portal: FakePortal) -> None:
    """503: `unavailable`; no answer within timeout_s: `timeout`; connection refused:
    `error`. Each failed job counted its one failed request and nothing else."""
    count = Outcomes()
    scraper = _scraper(portal, count)
    try:
        portal.always_fail_503 = True
        with pytest.raises(PortalError):
            await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, _progress)
        assert count.seen == ["unavailable"]
        portal.always_fail_503 = False
    finally:
        await scraper.close()

    portal.delay_s = 2.0
    slow = _scraper(portal, count, timeout_s=0.3)
    try:
        with pytest.raises(PortalError):
            await slow.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, _progress)
    finally:
        await slow.close()
        portal.delay_s = 0.0
    assert count.seen == ["unavailable", "timeout"]

    gone = _scraper(portal, count, portal_url=f"http://127.0.0.1:{_closed_port()}")
    try:
        with pytest.raises(PortalError) as caught:
            await gone.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, _progress)
    finally:
        await gone.close()
    assert caught.value.code == "PORTAL_UNAVAILABLE"
    assert count.seen == ["unavailable", "timeout", "error"]


async def test_the_metrics_callback_counts_portal_requests(portal: FakePortal) -> None:
    """Wired as the daemon wires it (`Metrics.portal_request`), the counts reach /metrics."""
    metrics = Metrics()
    settings = SuwonScraperSettings(
        portal_base_url=portal.portal_base_url,
        info_base_url=portal.info_base_url,
        min_interval_s=0.0,
    )
    scraper = SuwonScraper(settings, count=metrics.portal_request)
    try:
        await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, _progress)
        portal.fail_next_n_with_503(1)
        with pytest.raises(PortalError):
            await scraper.fetch_record(SAMPLE_SNO, SAMPLE_PASSWORD, _progress)
    finally:
        await scraper.close()
    text = generate_latest(metrics.registry).decode()
    assert f'outboxd_portal_requests_total{{outcome="ok"}} {REQUESTS_PER_JOB}.0' in text
    assert 'outboxd_portal_requests_total{outcome="unavailable"} 1.0' in text


async def test_ai_requests_are_counted_by_outcome(ai: FakeAI) -> None:
    """200: `ok` (even when its answer is unusable: the provider answered); 429:
    `rate_limited`; 5xx: `unavailable`; 401: `rejected`; too slow: `timeout`;
    connection refused: `error`."""
    metrics = Metrics()
    env = {AI_KEY_ENV: AI_KEY}
    client = OpenAIClassifier(ai_settings(ai), env, metrics.ai_request)
    wrong_key = OpenAIClassifier(ai_settings(ai), {AI_KEY_ENV: "sk-wrong"}, metrics.ai_request)
    impatient = OpenAIClassifier(ai_settings(ai, timeout_s=0.3), env, metrics.ai_request)
    try:
        assert await client.classify("example.com", None)
        ai.malformed = True
        with pytest.raises(ClassificationError):
            await client.classify("example.com", None)
        ai.malformed = False
        ai.rate_limit_next_n(1, 5)
        with pytest.raises(RateLimited):
            await client.classify("example.com", None)
        ai.fail_next_n(1, 503)
        with pytest.raises(ProviderUnavailable):
            await client.classify("example.com", None)
        with pytest.raises(ClassificationError):
            await wrong_key.classify("example.com", None)
        ai.delay_s = 2.0
        with pytest.raises(ProviderUnavailable):
            await impatient.classify("example.com", None)
        ai.delay_s = 0.0
    finally:
        await client.close()
        await wrong_key.close()
        await impatient.close()
    nowhere = dataclasses.replace(ai_settings(ai), base_url=f"http://127.0.0.1:{_closed_port()}")
    gone = OpenAIClassifier(nowhere, env, metrics.ai_request)
    try:
        with pytest.raises(ProviderUnavailable):
            await gone.classify("example.com", None)
    finally:
        await gone.close()
    text = generate_latest(metrics.registry).decode()
    for outcome, n in (
        ("ok", 2),
        ("rate_limited", 1),
        ("unavailable", 1),
        ("rejected", 1),
        ("timeout", 1),
        ("error", 1),
    ):
        assert f'outboxd_ai_requests_total{{outcome="{outcome}"}} {n}.0' in text, outcome
