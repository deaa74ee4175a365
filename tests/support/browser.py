"""Debian's chromium, driven by Playwright's Python package (never `playwright install`).

`launch_chromium()` starts the system browser headless with no network services of
its own (no component updates, sync or background fetches). `RequestLog` records
every request a page makes: what it asked for, when, with which headers, and how many
were in flight at once.
"""

from __future__ import annotations

import os
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "img"


def require_chromium() -> None:
    """CI (OUTBOXD_REQUIRE_POSTGRES set) fails without the browser; elsewhere it skips."""
    if CHROMIUM.exists():
        return
    why = f"{CHROMIUM} is missing (apt-get install chromium; .ci/run does it)"
    if os.environ.get("OUTBOXD_REQUIRE_POSTGRES"):
        pytest.fail(why)
    pytest.skip(why)


def screenshot_path(name: str, tmp_path: Path) -> Path:
    """docs/img/<name> when OUTBOXD_UPDATE_SCREENSHOTS=1, else a file under tmp_path."""
    if os.environ.get("OUTBOXD_UPDATE_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        return SCREENSHOTS / name
    return tmp_path / name


@dataclass(frozen=True)
class Sent:
    """One request as the page sent it (`at` on the monotonic clock, header names lowercase)."""

    at: float
    method: str
    url: str
    path: str
    headers: dict[str, str]


class RequestLog:
    """Every request of a page: URLs, per-path counts, the requests themselves, and the
    most in flight at once."""

    def __init__(self, page: Any) -> None:
        self._lock = threading.Lock()
        self.urls: list[str] = []
        self.sent: list[Sent] = []
        self.paths: Counter[str] = Counter()
        self.in_flight = 0
        self.max_in_flight = 0
        page.on("request", self._start)
        page.on("requestfinished", self._end)
        page.on("requestfailed", self._end)

    def _is_api(self, request: Any) -> bool:
        return urlsplit(request.url).path.startswith("/v1/")

    def _start(self, request: Any) -> None:
        path = urlsplit(request.url).path
        sent = Sent(time.monotonic(), request.method, request.url, path, dict(request.headers))
        with self._lock:
            self.urls.append(request.url)
            self.sent.append(sent)
            self.paths[path] += 1
            if self._is_api(request):
                self.in_flight += 1
                self.max_in_flight = max(self.max_in_flight, self.in_flight)

    def _end(self, request: Any) -> None:
        with self._lock:
            if self._is_api(request):
                self.in_flight -= 1

    def api_since(self, at: float) -> list[Sent]:
        """The API requests (/v1/...) sent at or after `at`."""
        with self._lock:
            return [s for s in self.sent if s.at >= at and s.path.startswith("/v1/")]

    def reset_peak(self) -> None:
        with self._lock:
            self.max_in_flight = self.in_flight
