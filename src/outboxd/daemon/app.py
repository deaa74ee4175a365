"""Wiring: roles -> components, one shutdown Event, signals, sd_notify.

Every long-running part is an object with `run(stop)`, owned by one TaskGroup.
SIGTERM/SIGINT set the stop event: the API stops accepting, loops stop
claiming and receiving, in-flight work gets `daemon.shutdown_timeout_s` to
finish, and whatever is still running then is cancelled and released. A
second signal exits at once; the outbox makes that safe too.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog
from aiohttp import web

from outboxd.config import ConfigError, ServerSettings, Settings, is_loopback_host
from outboxd.daemon.memory import settle_after_start
from outboxd.daemon.preflight import endpoint_label, sqs_endpoint
from outboxd.daemon.readiness import DependencyReadiness, QueueReadiness
from outboxd.daemon.runtime import ConsoleRuntime, Throughput
from outboxd.daemon.sdnotify import SystemdNotifier
from outboxd.errors import OutboxdError, StorageUnavailable
from outboxd.http.app import create_app
from outboxd.http.deps import ApiDeps
from outboxd.http.server import GuardedSite, bind_listeners, guard_app
from outboxd.metrics import Metrics
from outboxd.observability import configure_logging, unfiltered_logger
from outboxd.queue.sqs import KINDS, SqsQueues, resolve_region
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
from outboxd.services.tasks import TaskService
from outboxd.services.websites import WebsiteService
from outboxd.storage.changes import default_instance
from outboxd.storage.db import backend_of, known_schema_version, sqlite_path
from outboxd.storage.store import SqlStore, first_step, open_configured
from outboxd.tracing import NO_TRACING, Tracing, configure_tracing
from outboxd.workers.breaker_loop import BreakerLoop
from outboxd.workers.claimer import Claimer
from outboxd.workers.consumer import Consumer
from outboxd.workers.job_changes import JobChangeFeed
from outboxd.workers.loops import DB_RETRY_BASE_S, DB_RETRY_CAP_S, backoff, sleep_or_stop
from outboxd.workers.pacing import portal_pacing
from outboxd.workers.relay import Relay
from outboxd.workers.scheduler import Scheduler

log = structlog.get_logger(__name__)


class Component(Protocol):
    async def run(self, stop: asyncio.Event) -> None: ...


async def open_configured_store(settings: Settings) -> SqlStore:
    store = await open_configured(settings)
    if settings.storage.auto_migrate:
        applied = await first_step(store, store.db.migrate())
        if applied:
            log.info("migrations_applied", migrations=applied)
    await first_step(store, warn_if_schema_newer(store))
    return store


async def warn_if_schema_newer(store: SqlStore) -> None:
    """`schema_newer_than_code` (a warning, once at start) when a newer release migrated the
    database: this code runs on it, blind to what the newer migrations added."""
    database = await store.db.schema_version()
    known = known_schema_version(store.db.backend)
    if database is not None and database > known:
        log.warning(
            "schema_newer_than_code",
            database_schema=database,
            code_schema=known,
            hint="a newer outboxd migrated this database: run that release, or one as new",
        )


# While `serve` waits for its database or migrates: a `storage_waiting` line at most this
# often, and systemd's start timeout pushed back by START_EXTEND_S every START_EXTEND_EVERY_S.
STORAGE_WAITING_LOG_S = 10.0
START_EXTEND_S = 30.0
START_EXTEND_EVERY_S = 10.0


async def open_when_reachable(
    settings: Settings, stop: asyncio.Event, notifier: SystemdNotifier
) -> SqlStore | None:
    """The store, opened (and migrated) once the database answers; None when `stop` is set
    first. A database that cannot be reached is waited for with a capped backoff, for
    ever or `storage.start_timeout_s` (then StorageUnavailable naming the key and the
    cause); any other failure (a wrong password, a failed migration) is raised at once.
    Meanwhile systemd's start timeout is extended, so neither the wait nor a long
    migration is killed as a start that hangs."""
    limit_s = settings.storage.start_timeout_s
    started = time.monotonic()
    last_line = -STORAGE_WAITING_LOG_S
    attempts = 0

    async def extend() -> None:
        while True:
            notifier.extend_start(START_EXTEND_S)
            await asyncio.sleep(START_EXTEND_EVERY_S)

    extender = asyncio.create_task(extend())
    try:
        while not stop.is_set():
            attempts += 1
            try:
                store = await _unless_stopped(open_configured_store(settings), stop)
            except StorageUnavailable as exc:
                waited = time.monotonic() - started
                if limit_s and waited >= limit_s:
                    raise StorageUnavailable(
                        f"the database did not answer within storage.start_timeout_s "
                        f"({limit_s:g} s): {exc}"
                    ) from None
                if time.monotonic() - last_line >= STORAGE_WAITING_LOG_S:
                    last_line = time.monotonic()
                    log.warning(
                        "storage_waiting",
                        error=exc,
                        waited_s=round(waited, 1),
                        attempts=attempts,
                        start_timeout_s=limit_s or None,
                    )
                notifier.status(f"waiting for the database ({attempts} tries): {exc}")
                delay = backoff(attempts, DB_RETRY_BASE_S, DB_RETRY_CAP_S, jitter=False)
                if limit_s:
                    delay = min(delay, max(0.0, started + limit_s - time.monotonic()))
                await sleep_or_stop(stop, delay)
                continue
            if store is not None and attempts > 1:
                log.info(
                    "storage_ready",
                    waited_s=round(time.monotonic() - started, 1),
                    attempts=attempts,
                )
            return store
        return None
    finally:
        extender.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await extender


async def _unless_stopped(work: Awaitable[SqlStore], stop: asyncio.Event) -> SqlStore | None:
    """`work`'s store, or None (the work cancelled, a store it opened closed) once `stop` is set."""
    task = asyncio.ensure_future(work)
    await _first(stop.wait(), task)
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, OutboxdError):
        store = await task
        await store.close()
    return None


def load_keys(settings: Settings, env: Mapping[str, str]) -> KeyRing:
    keys_file = (
        settings.resolve_path(settings.security.keys_file) if settings.security.keys_file else None
    )
    default_file = None
    if settings.storage.url.startswith("sqlite:///"):
        # The embedded default keeps its key beside the database it protects.
        db_path = sqlite_path(settings.storage.url, settings.base_dir)
        default_file = db_path.with_name(db_path.name + ".keys")
    keys, created = KeyRing.load(keys_file, env, default_file)
    if created and default_file is not None:
        log.warning(
            "encryption_key_created",
            path=str(default_file),
            hint="back this file up with the database; set security.keys_file in production",
        )
    return keys


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
        gauges=StatsGauges(metrics, admin, readiness, settings.metrics.refresh_s),
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


def _install_signals(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        if stop.is_set():
            log.warning("second_signal_exit", signal=signal.Signals(signum).name)
            os._exit(1)
        log.info("shutdown_requested", signal=signal.Signals(signum).name)
        stop.set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal, sig)

    def on_hangup() -> None:
        # SIGHUP's default would end the process with no drain and no line.
        log.warning(
            "reload_not_supported",
            signal="SIGHUP",
            detail="the config is read at start only; restart the daemon to apply a change",
        )

    loop.add_signal_handler(signal.SIGHUP, on_hangup)


async def run(settings: Settings, env: Mapping[str, str] | None = None) -> int:
    """Run the daemon until a signal; the process exit code."""
    env = os.environ if env is None else env
    configure_logging(settings.logging.level, settings.logging.format, env=env)
    stop = asyncio.Event()
    _install_signals(stop)
    notifier = SystemdNotifier(env)
    roles = set(settings.daemon.roles)
    log.info(
        "daemon_starting",
        roles=sorted(roles),
        storage=settings.storage.url.split(":")[0],
        pid=os.getpid(),
    )
    if settings.sqs.endpoint_url == "embedded":
        # Its messages live only in memory; the outbox republishes them after a restart,
        # but one SQS per process defeats several instances and is no production queue.
        if not settings.storage.url.startswith("sqlite:///"):
            log.warning(
                "embedded_sqs_not_for_production",
                reason="postgres storage",
                detail="embedded SQS keeps messages in memory only; leave sqs.endpoint_url "
                "out to use AWS",
            )
        if "api" in roles and not is_loopback_host(settings.server.host):
            log.warning(
                "embedded_sqs_not_for_production",
                reason="non-loopback bind",
                host=settings.server.host,
                detail="embedded SQS keeps messages in memory only; leave sqs.endpoint_url "
                "out to use AWS",
            )
    if not settings.auth.tokens and "api" in roles:
        log.warning(
            "auth_disabled",
            detail="no [[auth.tokens]]: every caller is user 'local' "
            "with role admin; the API binds loopback only",
        )
    tracing = configure_tracing(env, settings.daemon.instance_id or default_instance())
    # From the start: a wait for the database is the event loop's too.
    watchdog = asyncio.create_task(notifier.run_watchdog(stop))
    try:
        async with contextlib.AsyncExitStack() as stack:
            code = await _serve(settings, env, stop, roles, notifier, stack, tracing)
    except (OutboxdError, OSError, ValueError, ConfigError) as exc:
        log.error("daemon_failed", error=exc)
        return 1
    except Exception as exc:
        log.exception("daemon_failed", error=exc)
        return 1
    finally:
        watchdog.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watchdog
        await asyncio.to_thread(tracing.shutdown)
    log.info("daemon_stopped", exit_code=code)
    return code


async def _serve(
    settings: Settings,
    env: Mapping[str, str],
    stop: asyncio.Event,
    roles: set[str],
    notifier: SystemdNotifier,
    stack: contextlib.AsyncExitStack,
    tracing: Tracing = NO_TRACING,
) -> int:
    metrics = Metrics(roles, schema=known_schema_version(backend_of(settings.storage.url)))
    listeners: list[socket.socket] = []
    if "api" in roles:
        if not settings.auth.tokens and not is_loopback_host(settings.server.host):
            raise ValueError("refusing to bind a non-loopback address with no auth tokens")
        # Before the database and the queues: a port that is taken (another daemon runs)
        # stops this one before it migrates, republishes or starts a worker.
        where = f"{settings.server.host}:{settings.server.port}"
        try:
            listeners = bind_listeners(settings.server.host, settings.server.port)
        except OSError as exc:
            raise OSError(
                exc.errno, f"cannot listen on {where} ({exc.strerror}; is another daemon running?)"
            ) from None
        for sock in listeners:
            stack.callback(sock.close)
    store = await open_when_reachable(settings, stop, notifier)
    if store is None:
        return 0  # stopped while waiting for the database
    stack.push_async_callback(store.close)
    notifier.status("starting: " + ", ".join(sorted(roles)))
    keys = load_keys(settings, env)
    endpoint = await stack.enter_async_context(sqs_endpoint(settings))

    async def republish(lost_before: float) -> None:
        n = await store.republish_unfinished(lost_before)
        log.warning("outbox_republished_after_queue_loss", rows=n)

    queues = SqsQueues(
        settings.sqs,
        endpoint,
        max_connections=settings.consumer.max_concurrency * 2 + 16,
        on_recreated=republish,
    )
    if settings.sqs.endpoint_url == "embedded":
        # The embedded server starts empty every time: what the last run had published
        # and not finished is gone from it.
        await republish(time.time())
    stack.push_async_callback(queues.close)
    queue_readiness = QueueReadiness(queues)
    await queue_readiness.start_once()
    log.info(
        "sqs_endpoint",
        endpoint=endpoint_label(endpoint),
        embedded=settings.sqs.endpoint_url == "embedded",
        region=queues.region or resolve_region(settings.sqs, endpoint),
        queue_urls=(
            {
                f"{kind}{'_dlq' if dlq else ''}": queues.queue_url(kind, dlq)
                for kind in KINDS
                for dlq in (False, True)
            }
            if queue_readiness.up.is_set()
            else None
        ),
        queues=[settings.sqs.jobs_queue, settings.sqs.tasks_queue],
    )

    relay = Relay.shaped(store.backend, store, queues, settings.relay, metrics, stop, tracing)
    built = _build(
        settings, env, roles, store, keys, queues, relay, metrics, stack, tracing, listeners
    )
    components: list[tuple[str, Component]] = [("sqs_connect", queue_readiness), *built.components]
    api_server = built.api_server
    # Everything is built: what exists now lives as long as the process.
    settle_after_start()
    failures: list[str] = []
    async with asyncio.TaskGroup() as tg:
        running = {
            name: tg.create_task(_supervised(name, comp, stop, failures))
            for name, comp in components
        }

        async def announce_ready() -> None:
            if api_server is not None:
                await _first(api_server.bound.wait(), running["api"])
                if not api_server.bound.is_set():
                    return
            notifier.ready(status="outboxd running: " + ", ".join(sorted(roles)))
            log.info("daemon_ready", roles=sorted(roles))

        tg.create_task(announce_ready())

        async def enforce_deadline() -> None:
            await stop.wait()
            notifier.stopping()
            pending = [t for t in running.values() if not t.done()]
            if not pending:
                return
            _done, still = await asyncio.wait(pending, timeout=settings.daemon.shutdown_timeout_s)
            for t in still:
                log.warning("shutdown_deadline_cancel", component=_name_of(running, t))
                t.cancel()

        tg.create_task(enforce_deadline())
        await stop.wait()
    await relay.drain(settings.relay.publish_timeout_s + 1.0)
    return 1 if failures else 0


@dataclass
class _Built:
    components: list[tuple[str, Component]]
    api_server: ApiServer | None


def _build(
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
) -> _Built:
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
                    settings.security.dead_retention_s,
                    portal_settings=settings.scrapers.suwon,
                    storage_probe=store.db.ping,
                    tracing=tracing,
                    breakers=breakers,
                    audit_retention_s=settings.audit.retention_s,
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
    if "scheduler" in roles and settings.scheduler.jobs:
        console.scheduler = Scheduler(settings.scheduler, tasks)
        components.append(("scheduler", console.scheduler))

    if roles & {"consumer", "claimer", "relay"}:
        hold_s = settings.breakers.portal.probe_s + settings.sqs.visibility_timeout_s
        loop = BreakerLoop(breakers, metrics, hold_s, choose_probes="consumer" in roles)
        components.append(("breakers", loop))
    return _Built(components, api_server)


async def _supervised(name: str, comp: Component, stop: asyncio.Event, failures: list[str]) -> None:
    try:
        await comp.run(stop)
    except Exception as exc:
        # A component that dies means trouble: stop everything and exit 1,
        # so systemd restarts a whole, healthy process.
        log.exception("component_crashed", component=name, error=exc)
        failures.append(name)
        stop.set()


async def _first(aw: Awaitable[Any], other: asyncio.Task[Any]) -> None:
    waiter = asyncio.ensure_future(aw)
    try:
        await asyncio.wait({waiter, other}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        waiter.cancel()


def _name_of(running: Mapping[str, asyncio.Task[Any]], task: asyncio.Task[Any]) -> str:
    return next((n for n, t in running.items() if t is task), "?")


def default_config_path(env: Mapping[str, str]) -> Path:
    return Path(env.get("OUTBOXD_CONFIG", "config.toml"))
