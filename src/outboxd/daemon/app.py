"""Running the daemon: start-up order, one shutdown Event, signals, sd_notify.

The port is bound, the store opened (daemon/startup.py) and SQS set up; then every
long-running part the roles build (daemon/components.py), an object with `run(stop)`,
is owned by one TaskGroup.
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
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog

from outboxd.config import ConfigError, Settings, is_loopback_host
from outboxd.daemon.components import Component, build_components
from outboxd.daemon.memory import settle_after_start
from outboxd.daemon.preflight import endpoint_label, sqs_endpoint
from outboxd.daemon.readiness import QueueReadiness
from outboxd.daemon.sdnotify import SystemdNotifier
from outboxd.daemon.startup import first_done, load_keys, open_when_reachable
from outboxd.errors import OutboxdError
from outboxd.http.server import bind_listeners
from outboxd.metrics import Metrics
from outboxd.observability import configure_logging, print_refusal
from outboxd.queue.sqs import KINDS, SqsQueues, resolve_region
from outboxd.storage.changes import default_instance
from outboxd.storage.db import backend_of, known_schema_version
from outboxd.storage.schema import SchemaMismatch
from outboxd.tracing import NO_TRACING, Tracing, configure_tracing
from outboxd.workers.relay import Relay

log = structlog.get_logger(__name__)


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
    except SchemaMismatch as exc:
        # Exit 2, as a refused config: restarting cannot help (systemd does not), an
        # operator migrates (or upgrades) first (docs/upgrades.md).
        status = exc.status
        log.error(
            exc.event,
            error=str(exc),
            pending=list(status.pending),
            database_schema=status.database,
            code_schema=status.known,
        )
        print_refusal(exc.event, str(exc), daemon=True)
        return 2
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
    built = build_components(
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
                await first_done(api_server.bound.wait(), running["api"])
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


async def _supervised(name: str, comp: Component, stop: asyncio.Event, failures: list[str]) -> None:
    try:
        await comp.run(stop)
    except Exception as exc:
        # A component that dies means trouble: stop everything and exit 1,
        # so systemd restarts a whole, healthy process.
        log.exception("component_crashed", component=name, error=exc)
        failures.append(name)
        stop.set()


def _name_of(running: Mapping[str, asyncio.Task[Any]], task: asyncio.Task[Any]) -> str:
    return next((n for n, t in running.items() if t is task), "?")


def default_config_path(env: Mapping[str, str]) -> Path:
    return Path(env.get("OUTBOXD_CONFIG", "config.toml"))
