"""An asyncio event loop on a daemon thread, driven from synchronous code.

Tests that run the daemon as a subprocess are synchronous (they block on HTTP calls and
process exits), yet the fakes and the TCP proxy are asyncio servers. `LoopThread` runs
them on a loop of their own, where they keep serving while the test blocks:

    with LoopThread() as lt:
        proxy = TcpProxy(...)
        port = lt.run(proxy.start())      # a coroutine, run to completion on the loop
        lt.call(lambda: setattr(fake, "delay_s", 1.0))   # a plain function, on the loop
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine
from concurrent.futures import Future
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


class LoopThread:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = 60.0) -> T:
        """Run `coro` on the loop; its result (or its exception) here."""
        fut: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return fut.result(timeout=timeout_s)

    def call(self, fn: Callable[[], T], timeout_s: float = 30.0) -> T:
        """Run a plain function on the loop's thread (to touch loop-owned state safely)."""

        async def wrapper() -> T:
            return fn()

        return self.run(wrapper(), timeout_s)

    def close(self) -> None:
        if self.loop.is_closed():
            return

        async def cancel_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            self.run(cancel_rest(), timeout_s=10)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._thread.join(10)
            self.loop.close()

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
