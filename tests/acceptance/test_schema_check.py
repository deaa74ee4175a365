"""Where a database's schema stands against this release, as an operator asks before an
upgrade (`outboxd migrate --check`) and as `serve` checks it at start (docs/upgrades.md);
both backends, the commands as subprocesses.

- `migrate --check` exits 0 when this release runs on the schema as it is (its own, or a
  newer release's that only expanded it: said so), 3 listing the pending migrations one a
  line, 4 when a newer release's contract migration rules this release out; it changes
  nothing, and never creates a SQLite file.
- `serve` with `storage.auto_migrate = false` on a schema with migrations pending exits 2
  naming them (a `schema_not_migrated` log line and one line on stderr) without serving;
  after `outboxd migrate` it serves. On a schema contracted past it, it exits 2 whether it
  may migrate or not (`schema_too_new`).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
from testkit.moto import MotoServer

from outboxd import __version__
from outboxd.storage.db import backend_of, known_schema_version, load_migrations, sqlite_path
from tests.acceptance.conftest import DaemonFactory, http_request, offline_config
from tests.support.db import raw_rows
from tests.support.ops import run_cli, write_config
from tests.support.previous_release import PREVIOUS_SCHEMA
from tests.support.schema import (
    contracted_past_this_code,
    migrate_up_to,
    newer_migration,
    previous_schema,
)
from tests.support.waits import eventually_sync

EXITS_WITHIN_S = 30


def _cli_config(tmp_path: Path, db_url: str) -> str:
    # The embedded SQS, never AWS: no command here reaches a queue.
    config = {"storage": {"url": db_url}, "sqs": {"endpoint_url": "embedded"}}
    return str(write_config(tmp_path, config))


def _check(config: str) -> tuple[int, list[str]]:
    done = run_cli("migrate", "--check", "--config", config)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, done.stdout.splitlines()


def _applied(db_url: str) -> list[int]:
    rows = asyncio.run(raw_rows(db_url, "SELECT version FROM schema_migrations ORDER BY version"))
    return [int(r["version"]) for r in rows]


def _all_names(db_url: str) -> list[str]:
    return [name for _, name, _ in load_migrations(backend_of(db_url))]


@pytest.fixture
def behind(fresh_db_url: str) -> tuple[str, list[str]]:
    """A database at the previous release's schema: the URL and the migrations pending."""
    pending = asyncio.run(migrate_up_to(fresh_db_url, PREVIOUS_SCHEMA))
    assert pending, "this release carries migrations the previous one did not"
    return fresh_db_url, pending


def test_migrate_check_lists_the_pending_migrations_and_changes_nothing(
    behind: tuple[str, list[str]], tmp_path: Path
) -> None:
    db_url, pending = behind
    config = _cli_config(tmp_path, db_url)
    before = _applied(db_url)

    code, lines = _check(config)

    assert code == 3, lines
    assert [line.strip() for line in lines[1:]] == pending
    assert f"{len(pending)} migration(s) pending" in lines[0]
    previous = previous_schema(db_url)
    known = known_schema_version(backend_of(db_url))
    assert f"the database is at schema {previous}, outboxd " in lines[0], lines[0]
    assert lines[0].endswith(f" needs {known}:")
    assert _applied(db_url) == before  # nothing applied by a check
    assert _check(config)[0] == 3

    migrated = run_cli("migrate", "--config", config)
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == "applied: " + ", ".join(pending)
    code, lines = _check(config)
    assert code == 0, lines
    current = f"up to date: the database is at schema {known}, as outboxd {__version__} needs"
    assert lines == [current]


def test_migrate_check_on_a_database_never_migrated_lists_every_migration(
    backend: str, fresh_db_url: str, tmp_path: Path
) -> None:
    """A SQLite file that does not exist is not created (nor its folder); an empty Postgres
    database gets no table."""
    code, lines = _check(_cli_config(tmp_path, fresh_db_url))

    assert code == 3, lines
    assert [line.strip() for line in lines[1:]] == _all_names(fresh_db_url)
    if backend == "sqlite":
        path = sqlite_path(fresh_db_url, tmp_path)
        assert "no database at" in lines[0]
        assert not path.parent.exists()
    else:
        tables = asyncio.run(
            raw_rows(fresh_db_url, "SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        )
        assert tables == []


def test_migrate_check_on_a_newer_releases_schema_says_so_and_exits_0(
    fresh_db_url: str, tmp_path: Path
) -> None:
    config = _cli_config(tmp_path, fresh_db_url)
    assert run_cli("migrate", "--config", config).returncode == 0
    known = known_schema_version(backend_of(fresh_db_url))
    asyncio.run(newer_migration(fresh_db_url, known + 1))

    code, lines = _check(config)

    assert code == 0, lines
    assert len(lines) == 1
    assert lines[0].startswith(
        f"up to date: the database is at schema {known + 1}, migrated by a newer release; "
    )
    assert lines[0].endswith(f"(schema {known}) runs on it")


def _serve_config(
    moto: MotoServer, db_url: str, keys_file: Path, auto_migrate: bool
) -> dict[str, Any]:
    return offline_config(
        moto,
        "unused.db",
        storage={"url": db_url, "auto_migrate": auto_migrate},
        security={"keys_file": str(keys_file)},
    )


def _refused(daemon: Any, event: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The daemon exits 2 without serving: its error line on stdout, its line on stderr."""
    daemon.spawn()
    code = daemon.wait_exit(EXITS_WITHIN_S)
    assert code == 2, daemon.all_output()[-3000:]
    events = daemon.events()
    assert "daemon_ready" not in {e.get("event") for e in events}, daemon.all_output()[-3000:]
    (logged,) = [e for e in events if e.get("event") == event]
    assert logged["level"] == "error"
    err = [
        json.loads(line)
        for line in daemon.stderr_path.read_text("utf-8").splitlines()
        if line.startswith("{")
    ]
    (printed,) = err
    assert printed["event"] == event and printed["level"] == "error"
    return logged, printed


def test_serve_without_auto_migrate_on_an_older_schema_exits_2_naming_the_migrations(
    behind: tuple[str, list[str]],
    moto_server: MotoServer,
    spawn_daemon: DaemonFactory,
    secret_keys_file: Path,
    tmp_path: Path,
) -> None:
    db_url, pending = behind
    config = _serve_config(moto_server, db_url, secret_keys_file, auto_migrate=False)

    logged, printed = _refused(spawn_daemon(config, name="behind"), "schema_not_migrated")

    assert logged["pending"] == pending
    assert logged["database_schema"] == previous_schema(db_url)
    assert logged["code_schema"] == known_schema_version(backend_of(db_url))
    for name in pending:
        assert name in printed["error"]
    assert "outboxd migrate" in printed["error"]
    assert _applied(db_url)[-1] == previous_schema(db_url)

    # The operator migrates first, then the same daemon serves.
    assert run_cli("migrate", "--config", _cli_config(tmp_path, db_url)).returncode == 0
    daemon = spawn_daemon(config, name="migrated")
    base = daemon.start()

    def ready() -> bool:
        return http_request("GET", f"{base}/readyz").status == 200

    eventually_sync(ready, 30, what="the daemon ready on the migrated schema")
    assert daemon.terminate() == 0, daemon.all_output()[-3000:]


def test_serve_without_auto_migrate_on_a_database_never_migrated_exits_2(
    backend: str,
    fresh_db_url: str,
    moto_server: MotoServer,
    spawn_daemon: DaemonFactory,
    secret_keys_file: Path,
    tmp_path: Path,
) -> None:
    """A SQLite file that does not exist is refused before opening it would create it."""
    config = _serve_config(moto_server, fresh_db_url, secret_keys_file, auto_migrate=False)

    logged, _ = _refused(spawn_daemon(config, name="never"), "schema_not_migrated")

    assert logged["pending"] == _all_names(fresh_db_url)
    assert logged["database_schema"] is None
    if backend == "sqlite":
        assert not sqlite_path(fresh_db_url, tmp_path).parent.exists()


@pytest.mark.parametrize("auto_migrate", [False, True])
def test_a_schema_contracted_past_this_release_is_refused(
    fresh_db_url: str,
    moto_server: MotoServer,
    spawn_daemon: DaemonFactory,
    secret_keys_file: Path,
    tmp_path: Path,
    auto_migrate: bool,
) -> None:
    """A newer release's contract migration says older code must not run: `migrate --check`
    exits 4, `serve` exits 2 (`schema_too_new`), migrating or not."""
    config = _cli_config(tmp_path, fresh_db_url)
    assert run_cli("migrate", "--config", config).returncode == 0
    contract = asyncio.run(contracted_past_this_code(fresh_db_url))
    known = known_schema_version(backend_of(fresh_db_url))

    code, lines = _check(config)
    assert code == 4, lines
    assert len(lines) == 1
    assert lines[0].startswith(f"too new: the database is at schema {contract}, contracted ")
    assert f"knows schema {known + 1}" in lines[0]

    serve = _serve_config(moto_server, fresh_db_url, secret_keys_file, auto_migrate)
    logged, printed = _refused(spawn_daemon(serve, name="old-code"), "schema_too_new")
    assert logged["database_schema"] == contract and logged["code_schema"] == known
    assert "restore a backup" in printed["error"]
