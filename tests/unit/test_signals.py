"""The daemon's signal handlers (docs/contract.md#process-and-logs): SIGTERM and SIGINT set
the one stop Event; SIGHUP neither stops nor kills the daemon, it says reloading is not
supported."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from structlog.testing import capture_logs

from outboxd.daemon.app import _install_signals
from tests.support.waits import eventually


async def _deliver(sig: signal.Signals, logs: list[dict[str, Any]], event: str) -> None:
    """Send `sig` to this process; back once its handler has logged `event` (the handler
    runs on one of the loop's next turns)."""
    seen = sum(e["event"] == event for e in logs)
    os.kill(os.getpid(), sig)
    await eventually(lambda: sum(e["event"] == event for e in logs) > seen, 5, what=event)


async def test_sighup_logs_reload_not_supported_and_does_not_stop() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        _install_signals(stop)
        with capture_logs() as logs:
            await _deliver(signal.SIGHUP, logs, "reload_not_supported")
            await _deliver(signal.SIGHUP, logs, "reload_not_supported")
        assert not stop.is_set()
        hups = [e for e in logs if e["event"] == "reload_not_supported"]
        assert len(hups) == 2, logs
        assert hups[0]["log_level"] == "warning" and hups[0]["signal"] == "SIGHUP"
        assert "restart" in hups[0]["detail"]

        with capture_logs() as logs:
            await _deliver(signal.SIGTERM, logs, "shutdown_requested")
        assert stop.is_set()
        assert [e["event"] for e in logs] == ["shutdown_requested"]
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
