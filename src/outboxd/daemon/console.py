"""The operator console: static pages at /ui/, and the in-memory numbers only it shows.

The pages are plain HTML, CSS and hand-written JavaScript shipped in the package
(`daemon/ui/`); no build step, nothing from another origin. They read and act
through the admin API only, with the operator's bearer token, so the console adds
no second back end and no cookie (hence no CSRF). Every response under /ui/ carries
a Content-Security-Policy that allows scripts, styles and requests from the
daemon's own origin only, and no inline script or style.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from importlib import resources

from aiohttp import web

from outboxd.daemon.claimer import Claimer
from outboxd.daemon.scheduler import Scheduler
from outboxd.observability import Metrics

CONSOLE_PREFIX = "/ui/"
# Pages the browser can open directly (the script picks the view from the path).
PAGES = (
    "/ui/",
    "/ui/jobs",
    # Job ids are UUIDs (lowercase, as the API issues them); anything else is 404 C04.
    "/ui/jobs/{job_id:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}}",
    "/ui/dead-letters",
    "/ui/websites",
    "/ui/tasks",
)
ASSETS = {
    "/ui/assets/app.js": ("app.js", "text/javascript"),
    "/ui/assets/app.css": ("app.css", "text/css"),
}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}


def _read(name: str) -> bytes:
    return resources.files("outboxd.daemon").joinpath("ui", name).read_bytes()


def _static(body: bytes, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    async def handler(_request: web.Request) -> web.Response:
        resp = web.Response(body=body, headers=SECURITY_HEADERS)
        resp.content_type = content_type
        resp.charset = "utf-8"
        return resp

    return handler


def add_console_routes(router: web.UrlDispatcher) -> None:
    """The /ui/ pages and their two assets (read once, served from memory)."""
    page = _static(_read("index.html"), "text/html")
    for path in PAGES:
        router.add_get(path, page, allow_head=False)
    for path, (name, ctype) in ASSETS.items():
        router.add_get(path, _static(_read(name), ctype), allow_head=False)


def is_console_path(path: str) -> bool:
    return path.startswith(CONSOLE_PREFIX)


# ------------------------------------------------------------------ in-memory numbers

_COMPLETED_OUTCOMES = ("succeeded", "failed", "dead")
BUCKET_S = 60
WINDOW_BUCKETS = 60


class Throughput:
    """Portal jobs accepted and finished per minute over the last hour.

    Sampled from this process's own counters (jobs accepted by its API; jobs its
    consumer finished as SUCCEEDED, FAILED or DEAD), kept in memory: a restart
    starts the chart empty, and no table is written.
    """

    def __init__(
        self, metrics: Metrics, clock: Callable[[], float] = time.time, every_s: float = 5.0
    ) -> None:
        self._metrics = metrics
        self._clock = clock
        self._every_s = every_s
        self._buckets: dict[int, list[int]] = {}
        self._last = self._totals()

    def _totals(self) -> tuple[int, int]:
        reg = self._metrics.registry
        intake = reg.get_sample_value("outboxd_jobs_accepted_total") or 0.0
        done = sum(
            reg.get_sample_value(
                "outboxd_handler_duration_seconds_count", {"kind": "jobs", "outcome": o}
            )
            or 0.0
            for o in _COMPLETED_OUTCOMES
        )
        return int(intake), int(done)

    def sample(self) -> None:
        intake, done = self._totals()
        d_in, d_done = intake - self._last[0], done - self._last[1]
        self._last = (intake, done)
        minute = int(self._clock() // BUCKET_S)
        bucket = self._buckets.setdefault(minute, [0, 0])
        bucket[0] += d_in
        bucket[1] += d_done
        for old in [m for m in self._buckets if m <= minute - WINDOW_BUCKETS]:
            del self._buckets[old]

    def series(self) -> list[tuple[float, int, int]]:
        """(minute start, accepted, finished) for each of the last 60 minutes, oldest first."""
        self.sample()
        now_minute = int(self._clock() // BUCKET_S)
        out = []
        for m in range(now_minute - WINDOW_BUCKETS + 1, now_minute + 1):
            b = self._buckets.get(m, [0, 0])
            out.append((float(m * BUCKET_S), b[0], b[1]))
        return out

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            self.sample()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self._every_s)


@dataclass
class ConsoleRuntime:
    """What the overview shows that no table holds: this process's claimer and scheduler."""

    throughput: Throughput
    claimer: Claimer | None = None
    scheduler: Scheduler | None = None

    def claimer_pace(self) -> tuple[float | None, float | None, float | None] | None:
        """(last tick, next tick, paused until) or None when this process runs no claimer."""
        if self.claimer is None:
            return None
        return self.claimer.pace()

    def schedules(self) -> list[tuple[str, str, float]]:
        if self.scheduler is None:
            return []
        return [(name, task, at.timestamp()) for name, task, at in self.scheduler.next_fires()]

    def throughput_series(self) -> list[tuple[float, int, int]]:
        return self.throughput.series()
