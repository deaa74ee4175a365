"""What the fake servers share: `async with` around start/stop, and serving standalone
(`python -m testkit.fakes.<name> --port-file PATH`) until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Self


class FakeServer:
    """A fake that `async with` starts and stops; subclasses define start() and stop()."""

    async def start(self) -> None:
        raise NotImplementedError

    async def stop(self) -> None:
        raise NotImplementedError

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()

    def where(self) -> dict[str, str]:
        """What a client needs to reach this fake (its URLs), as written to the port file."""
        raise NotImplementedError


async def serve_until_signalled(fake: FakeServer, port_file: Path) -> None:
    """Start `fake`, write where() to `port_file` and serve until SIGTERM or SIGINT."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with fake:
        # Written then renamed, so a reader polling for the file never sees half of it.
        tmp = port_file.with_name(port_file.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(fake.where()), encoding="utf-8")
        os.replace(tmp, port_file)
        await stop.wait()
