"""What the roles build: the components `serve` runs, and the HTTP API's dependencies.

Each component is an object with `run(stop)`; daemon/app.py opens the store and the
queues, asks `build_components` for what its roles need, and runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from aiohttp import web

from outboxd.config import ServerSettings, Settings
from outboxd.daemon.readiness import DependencyReadiness
from outboxd.daemon.runtime import ConsoleRuntime, Throughput
from outboxd.http.app import create_app, trim_middleware_chain
from outboxd.http.deps import ApiDeps
from outboxd.http.server import GuardedSite, guard_app
from outboxd.metrics import Metrics
from outboxd.observability import unfiltered_logger
from outboxd.queue.sqs import SqsQueues
from outboxd.scrapers.classifier import build_classifier
from outboxd.scrapers.suwon import SuwonScraper
from outboxd.security import KeyRing, TokenVerifier
from outboxd.services.admin import AdminService
from outboxd.services.audit import AuditLog
from outboxd.services.breakers import Breakers
from outboxd.services.gauges import StatsGauges
from outboxd.services.job_waits import JobWaits
from outboxd.services.portal_jobs import Dispatcher, PortalJobService
from outboxd.services.portal_logins import PortalLoginAdmin
from outboxd.services.tasks import Retention, TaskService
from outboxd.services.websites import WebsiteService
from outboxd.storage.changes import default_instance
from outboxd.storage.store import SqlStore
from outboxd.tracing import NO_TRACING, Tracing
from outboxd.workers.breaker_loop import BreakerLoop
from outboxd.workers.claimer import Claimer
from outboxd.workers.consumer import Consumer
from outboxd.workers.job_changes import JobChangeFeed
from outboxd.workers.pacing import portal_pacing
from outboxd.workers.relay import Relay
from outboxd.workers.scheduler import Scheduler

log = structlog.get_logger(__name__)


class Component(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


def build_api_deps(
    settings: Settings,
    store: SqlStore,
    keys: KeyRing,
    metrics: Metrics,
    queues: SqsQueues | None,
    dispatcher: Dispatcher | None,
    runtime: ConsoleRuntime | None = None,
    tracing: Tracing = NO_TRACING,
    breakers: Breakers | None = None,
) -> ApiDeps:
    """Everything the HTTP API needs, wired the same way in the daemon and in tests."""
    readiness = DependencyReadiness(store, queues)
    admin = AdminService(store, readiness if queues is not None else None)
    return ApiDeps(
        settings=settings,
        store=store,
        jobs=PortalJobService(
            store,
            keys,
            dispatcher,
            settings.api.require_dispatch,
            max_active_jobs=settings.api.max_active_jobs_per_user,
        ),
        websites=WebsiteService(
            store, max_per_user_per_hour=settings.api.max_websites_per_user_per_hour
        ),
        tasks=TaskService(store),
        admin=admin,
        tokens=TokenVerifier((t.sha256, t.user, t.role) for t in settings.auth.tokens),
        metrics=metrics,
        readiness=readiness,
        gauges=StatsGauges(
            metrics, admin, readiness, settings.metrics.refresh_s, growth=store
        ),
        logins=PortalLoginAdmin(store, keys, settings.scrapers.suwon),
        runtime=runtime,
        waits=JobWaits(
            store, store.changes, settings.api.max_waiters, settings.api.max_waiters_per_user
        ),
        tracing=tracing,
        breakers=breakers if breakers is not None else Breakers(settings, store, metrics),
        audit=AuditLog(store, settings.daemon.instance_id or default_instance()),
    )


class ApiServer:
    def __init__(
        self,
        app: web.Application,
        host: str,
        port: int,
        shutdown_timeout_s: float,
        limits: ServerSettings | None = None,
        sockets: Sequence[socket.socket] = (),
    ):
        self._limits = limits or ServerSettings()
        self._sockets = sockets
        guard_app(app)
        self._handler_kwargs: dict[str, Any] = {
            "access_log": None,
            "keepalive_timeout": self._limits.keepalive_timeout_s,
            # How long an answered request's unread body may keep draining.
            "lingering_time": min(10.0, self._limits.read_timeout_s),
        }
        self._runner = web.AppRunner(
            app, shutdown_timeout=shutdown_timeout_s, handle_signals=False, **self._handler_kwargs
        )
        self._host = host
        self._port = port
        self.bound = asyncio.Event()
        self.address: tuple[str, int] | None = None
        self.url: str | None = None

    async def run(self, stop: asyncio.Event) -> None:
        await self._runner.setup()
        trim_middleware_chain(self._runner.app)
        site = GuardedSite(
            self._runner, self._host, self._port, self._limits, self._handler_kwargs, self._sockets
        )
        try:
            await site.start()
            sockets = site.sockets
            if sockets:
                addr = sockets[0].getsockname()
                self.address = (str(addr[0]), int(addr[1]))
            port = self.address[1] if self.address else self._port
            host = self.address[0] if self.address else self._host
            self.url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
            # Whatever logging.level says: how whoever started a `port = 0` API finds it.
            unfiltered_logger(__name__).info(
                "api_listening", host=self._host, port=port, url=self.url
            )
            if sys.stderr.isatty():
                sys.stderr.write(f"outboxd: listening on {self.url}\n")
                sys.stderr.flush()
            self.bound.set()
            await stop.wait()
        finally:
            # Stops accepting, then lets in-flight requests finish (shutdown_timeout).
            await self._runner.cleanup()
            log.info("api_stopped")


@dataclass
class Built:
    components: list[tuple[str, Component]]
    api_server: ApiServer | None


def build_components(
    settings: Settings,
    env: Mapping[str, str],
    roles: set[str],
    store: SqlStore,
    keys: KeyRing,
    queues: SqsQueues,
    relay: Relay,
    metrics: Metrics,
    stack: contextlib.AsyncExitStack,
    tracing: Tracing,
    listeners: list[socket.socket],
) -> Built:
    """The components `roles` ask for, on the store and the queues `_serve` opened."""
    breakers = Breakers(settings, store, metrics)
    relay.use_breaker(breakers.sqs)
    tasks = TaskService(store)
    components: list[tuple[str, Component]] = []
    api_server: ApiServer | None = None
    console = ConsoleRuntime(Throughput(metrics))
    if "api" in roles:
        deps = build_api_deps(
            settings,
            store,
            keys,
            metrics,
            queues=queues,
            dispatcher=relay,
            runtime=console,
            tracing=tracing,
            breakers=breakers,
        )
        api_server = ApiServer(
            create_app(deps),
            settings.server.host,
            settings.server.port,
            settings.daemon.shutdown_timeout_s,
            settings.server,
            listeners,
        )
        components.append(("api", api_server))
        components.append(("console_throughput", console.throughput))
        if deps.waits is not None:
            # Held requests: answered at once on stop, woken by other processes' changes.
            components.append(("job_waits", deps.waits))
            components.append(("job_changes", JobChangeFeed(store, store.changes)))
    if "relay" in roles:
        components.append(("relay", relay))
    if "consumer" in roles:
        scraper = SuwonScraper(
            settings.scrapers.suwon,
            pacing=portal_pacing(settings.scrapers.suwon, store),
            count=metrics.portal_request,
        )
        stack.push_async_callback(scraper.close)
        components.append(
            (
                "consumer",
                Consumer(
                    store,
                    queues,
                    scraper,
                    keys,
                    settings.consumer,
                    settings.sqs,
                    metrics,
                    Retention.of(settings),
                    portal_settings=settings.scrapers.suwon,
                    storage_probe=store.db.ping,
                    tracing=tracing,
                    breakers=breakers,
                ),
            )
        )
    if "claimer" in roles:
        classifier = build_classifier(settings.scrapers.classifier, env, metrics.ai_request)
        stack.push_async_callback(classifier.close)
        console.claimer = Claimer(
            store,
            classifier,
            settings.claimer,
            metrics,
            pace=store,
            breaker=breakers.ai,
            instance=store.instance,
        )
        components.append(("claimer", console.claimer))
    if "scheduler" in roles:
        console.scheduler = Scheduler(settings.scheduler, tasks)
        components.append(("scheduler", console.scheduler))

    if roles & {"consumer", "claimer", "relay"}:
        hold_s = settings.breakers.portal.probe_s + settings.sqs.visibility_timeout_s
        loop = BreakerLoop(breakers, metrics, hold_s, choose_probes="consumer" in roles)
        components.append(("breakers", loop))
    return Built(components, api_server)
