"""`outboxd serve` on a port that is taken (another daemon runs there): it stops before it
touches the database or the queues, so it neither migrates, nor republishes the other
daemon's rows, nor starts a worker beside it."""

from __future__ import annotations

import socket
from pathlib import Path

from testkit.moto import MotoServer

from tests.acceptance.conftest import DaemonFactory, offline_config
from tests.support.db import raw_scalar


async def test_a_daemon_on_a_taken_port_stops_before_touching_anything(
    backend: str,
    fresh_db_url: str,
    moto_server: MotoServer,
    spawn_daemon: DaemonFactory,
    secret_keys_file: Path,
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = offline_config(
            moto_server,
            "unused.db",
            server={"port": port},
            storage={"url": fresh_db_url},
            security={"keys_file": str(secret_keys_file)},
        )
        second = spawn_daemon(config, name="second")
        second.spawn()
        code = second.wait_exit(30)

    assert code == 1, second.all_output()
    failed = [e for e in second.events() if e.get("event") == "daemon_failed"]
    assert len(failed) == 1, second.all_output()
    assert f"127.0.0.1:{port}" in failed[0]["error"] and "in use" in failed[0]["error"]
    started = {e.get("event") for e in second.events()}
    assert not started & {"migrations_applied", "sqs_endpoint", "relay_started"}, started
    # Nothing was created in the database: no migration ran.
    if backend == "sqlite":
        assert not Path(fresh_db_url.removeprefix("sqlite:///")).exists()
    else:
        tables = await raw_scalar(
            fresh_db_url,
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'",
        )
        assert tables == 0
