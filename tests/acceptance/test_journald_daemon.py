"""The daemon under journald: every stdout line is `<N>{json}`, and a database or SQS that
cannot be reached is logged at priority 4 (warning) or more urgent, so
`journalctl -u outboxd -p warning` shows it."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import DaemonProcess, dump_toml
from testkit.moto import free_port

from outboxd.security import generate_key
from tests.support import postgres as pg
from tests.support.ops import run_cli
from tests.support.waits import eventually_sync

LINE = re.compile(r"^<([0-7])>(\{.*\})$")
JOURNAL = {"JOURNAL_STREAM": "8:424242"}


def parse(stdout: str) -> list[tuple[int, dict[str, Any]]]:
    out = []
    for line in stdout.splitlines():
        m = LINE.match(line)
        assert m, f"not <N>{{json}}: {line!r}"
        out.append((int(m.group(1)), json.loads(m.group(2))))
    assert out, "no log lines"
    return out


def serve_once(
    path: Path, timeout_s: float, *, config: dict[str, Any] | None = None, keys: bool = True
) -> subprocess.CompletedProcess[str]:
    """`outboxd serve` under journald (with a fresh secret key unless `keys` is False) on
    the config at `path` (written from `config` if given), run until it exits."""
    if config is not None:
        path.write_text(dump_toml(config))
    env = {**JOURNAL, "OUTBOXD_SECRET_KEYS": generate_key()} if keys else JOURNAL
    return run_cli("serve", "--config", str(path), timeout_s=timeout_s, env=env)


def test_database_unreachable_at_start_is_waited_for_then_an_error(tmp_path: Path) -> None:
    """serve waits for a database it cannot reach (a warning, priority 4), and with
    storage.start_timeout_s set gives up after it: an error line naming the key and the
    real cause, exit 1."""
    dead = free_port()
    config = {
        "storage": {
            "url": f"postgresql://outboxd@127.0.0.1:{dead}/outboxd",
            "start_timeout_s": 2,
        },
        "sqs": {"endpoint_url": f"http://127.0.0.1:{free_port()}"},
    }
    done = serve_once(tmp_path / "c.toml", 90, config=config)
    assert done.returncode == 1, done.stderr
    assert done.stderr == "", done.stderr  # every line is JSON, on stdout
    lines = parse(done.stdout)
    waiting = [(p, e) for p, e in lines if e["event"] == "storage_waiting"]
    assert waiting and waiting[0][0] == 4 and waiting[0][1]["level"] == "warning", lines
    assert "Connect" in waiting[0][1]["error"], waiting
    failed = [(p, e) for p, e in lines if e["event"] == "daemon_failed"]
    assert len(failed) == 1, lines
    assert failed[0][0] <= 4 and failed[0][0] == 3
    assert failed[0][1]["level"] == "error"
    assert "storage.start_timeout_s (2 s)" in failed[0][1]["error"], failed
    assert "Connect" in failed[0][1]["error"], failed
    assert {p for p, e in lines if e["level"] == "info"} == {6}


def test_sqs_unreachable_logs_a_warning_and_every_line_is_prefixed(tmp_path: Path) -> None:
    config = {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": "sqlite:///outboxd.db"},
        "sqs": {"endpoint_url": f"http://127.0.0.1:{free_port()}", "wait_time_s": 1},
        "daemon": {"roles": ["api", "relay", "consumer"], "shutdown_timeout_s": 5},
    }
    daemon = DaemonProcess(tmp_path, config, env=JOURNAL)
    try:
        daemon.start()
        with contextlib.suppress(AssertionError):  # the assertions below say what is not
            eventually_sync(lambda: "sqs_unavailable" in daemon.logs(), 60)
        assert daemon.terminate(timeout_s=40) == 0
    finally:
        daemon.kill()
    lines = parse(daemon.logs())
    levels = {e["event"]: (p, e["level"]) for p, e in lines}
    assert levels["sqs_unavailable"] == (4, "warning"), lines
    assert levels["daemon_ready"] == (6, "info")
    # The start line that says which SQS this is; queue URLs unknown while it is down.
    endpoint = next(e for _, e in lines if e["event"] == "sqs_endpoint")
    assert endpoint["endpoint"].startswith("127.0.0.1:") and endpoint["queue_urls"] is None
    # The helper that tests use still reads the events through the prefix.
    assert [e["event"] for e in daemon.events()] == [e["event"] for _, e in lines]


@pytest.mark.postgres
def test_embedded_sqs_with_postgres_or_a_public_bind_warns(
    pg_database: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Embedded SQS keeps messages in memory: with Postgres, or bound beyond loopback, the
    daemon says so at start. (192.0.2.1 is TEST-NET: the bind fails, first, and nothing is
    sent.)"""
    name, dsn = pg.create_database()  # its own: the daemon migrates and republishes
    request.addfinalizer(lambda: pg.drop_database(name))
    config = {
        "server": {"host": "192.0.2.1", "port": 0},
        "storage": {"url": dsn},
        "sqs": {"endpoint_url": "embedded"},
        "auth": {"tokens": [{"sha256": "ab" * 32, "user": "ops"}]},
        "daemon": {"roles": ["api", "relay"], "shutdown_timeout_s": 5},
    }
    done = serve_once(tmp_path / "c.toml", 120, config=config)
    assert done.returncode == 1, done.stdout[-3000:]  # the bind failed
    lines = parse(done.stdout)
    warned = {e["reason"] for p, e in lines if e["event"] == "embedded_sqs_not_for_production"}
    assert warned == {"postgres storage", "non-loopback bind"}, lines
    assert all(p == 4 for p, e in lines if e["event"] == "embedded_sqs_not_for_production")
    # The port is bound before anything starts: the embedded SQS never did.
    assert not any(e["event"] == "sqs_endpoint" for _, e in lines), lines
    (failed,) = [e for _, e in lines if e["event"] == "daemon_failed"]
    assert "cannot listen on 192.0.2.1:0" in failed["error"]


def test_a_refused_config_is_an_error_line_in_the_journal(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text('[sqs]\nendpoint_url = ""\n')
    done = serve_once(path, 60, keys=False)
    assert done.returncode == 2
    (line,) = done.stderr.splitlines()
    m = LINE.match(line)
    assert m and m.group(1) == "3", line  # an error, as one JSON object
    event = json.loads(m.group(2))
    assert (event["event"], event["level"]) == ("config_invalid", "error")
    assert event["error"].startswith("config: sqs.endpoint_url:"), event
