"""The daemon's signal handlers (docs/contract.md#process-and-logs): SIGTERM and SIGINT set
the one stop Event; SIGHUP neither stops nor kills the daemon, it says reloading is not
supported."""

from __future__ import annotations

import asyncio
import os
import signal

from structlog.testing import capture_logs

from outboxd.daemon.app import _install_signals


async def _deliver(sig: signal.Signals) -> None:
    os.kill(os.getpid(), sig)
    for _ in range(100):  # the handler runs on the loop's next turns
        await asyncio.sleep(0.01)


async def test_sighup_logs_reload_not_supported_and_does_not_stop() -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    try:
        _install_signals(stop)
        with capture_logs() as logs:
            await _deliver(signal.SIGHUP)
            await _deliver(signal.SIGHUP)
        assert not stop.is_set()
        hups = [e for e in logs if e["event"] == "reload_not_supported"]
        assert len(hups) == 2, logs
        assert hups[0]["log_level"] == "warning" and hups[0]["signal"] == "SIGHUP"
        assert "restart" in hups[0]["detail"]

        with capture_logs() as logs:
            await _deliver(signal.SIGTERM)
        assert stop.is_set()
        assert [e["event"] for e in logs] == ["shutdown_requested"]
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            loop.remove_signal_handler(sig)
