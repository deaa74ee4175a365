"""`outboxd serve` on a port that is taken (another daemon runs there): it stops before it
touches the database or the queues, so it neither migrates, nor republishes the other
daemon's rows, nor starts a worker beside it.

Start-up waits only for a database it cannot reach: one that answers with a refusal (a role
it does not know, as a wrong password is) or a migration that fails exits 1 at once, naming
the cause, instead of waiting for ever (daemon/startup.py `open_when_reachable`)."""

from __future__ import annotations

import socket
import sqlite3
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from tests.acceptance.conftest import DaemonFactory, offline_config
from tests.conftest import postgres_only
from tests.support.db import raw_execute, raw_scalar

# Well within the wait a database that cannot be reached would get (for ever by default),
# and long enough for a start on a busy machine.
FAILS_WITHIN_S = 30


def _fails_at_once(daemon: DaemonProcess) -> str:
    """The daemon exits 1 without waiting for its database: the `daemon_failed` error."""
    daemon.spawn()
    code = daemon.wait_exit(FAILS_WITHIN_S)
    assert code == 1, daemon.all_output()[-3000:]
    events = [e.get("event") for e in daemon.events()]
    assert "storage_waiting" not in events, daemon.all_output()[-3000:]
    failed = [e for e in daemon.events() if e.get("event") == "daemon_failed"]
    assert len(failed) == 1, daemon.all_output()[-3000:]
    return str(failed[0]["error"])


def _config(
    moto: MotoServer, url: str, keys_file: Path, **sections: dict[str, Any]
) -> dict[str, Any]:
    """A daemon on the database `url`, its key file and queues of its own."""
    return offline_config(
        moto, "unused.db", storage={"url": url}, security={"keys_file": str(keys_file)}, **sections
    )


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
        config = _config(moto_server, fresh_db_url, secret_keys_file, server={"port": port})
        second = spawn_daemon(config, name="second")
        error = _fails_at_once(second)

    assert f"127.0.0.1:{port}" in error and "in use" in error, error
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


@postgres_only
def test_a_database_that_refuses_the_login_exits_1_at_once(
    fresh_db_url: str,
    moto_server: MotoServer,
    spawn_daemon: DaemonFactory,
    secret_keys_file: Path,
) -> None:
    """The server answers and refuses the login (a role it does not know; a wrong password
    is refused the same way): no wait, exit 1 naming the refusal."""
    parts = urlsplit(fresh_db_url)
    host = parts.netloc.rsplit("@", 1)[-1]
    refused = urlunsplit(parts._replace(netloc=f"no_such_role_outboxd@{host}"))
    error = _fails_at_once(spawn_daemon(_config(moto_server, refused, secret_keys_file)))
    assert "no_such_role_outboxd" in error and "does not exist" in error, error


async def test_a_failing_migration_exits_1_at_once(
    backend: str,
    fresh_db_url: str,
    moto_server: MotoServer,
    spawn_daemon: DaemonFactory,
    secret_keys_file: Path,
) -> None:
    """The database answers but the first migration fails (a `jobs` table that is not
    ours is in the way): no wait, exit 1 naming the failure."""
    if backend == "sqlite":
        path = Path(fresh_db_url.removeprefix("sqlite:///"))
        path.parent.mkdir(parents=True)
        with sqlite3.connect(path) as conn:
            conn.execute("CREATE TABLE jobs (not_ours INTEGER)")
    else:
        await raw_execute(fresh_db_url, "CREATE TABLE jobs (not_ours INTEGER)")
    error = _fails_at_once(spawn_daemon(_config(moto_server, fresh_db_url, secret_keys_file)))
    assert "jobs" in error and "already exists" in error, error
