"""A client generated from the live /openapi.json types every field.

openapi-python-client generates a client from the document a running daemon serves;
`mypy --strict` then checks a script that uses it as a caller naturally would
(client_usage/use_client.py: 0 errors) and one that misuses it (client_usage/misuse.py:
exactly its lines commented as wrong), and the script runs against that daemon.

Offline: the generator reads the document from a file (`--path`, never `--url`), writes
no project metadata (`--meta none`) and runs no post hooks (no formatter), and any HTTP
it might still try goes to a proxy on a closed loopback port.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer, free_port

from outboxd.security import generate_token, hash_token
from tests.acceptance.conftest import http_request, offline_config

pytestmark = pytest.mark.slow

ADMIN_TOKEN = generate_token()
USAGE = Path(__file__).parent / "client_usage"
BIN = Path(sys.executable).parent


@pytest.fixture
def live_daemon(moto_server: MotoServer, tmp_path: Path) -> Iterator[DaemonProcess]:
    config = offline_config(
        moto_server,
        "var/outboxd.db",
        # No consumer: the job stays RUNNING on the queue, nothing leaves loopback.
        daemon={"roles": ["api", "relay"]},
        auth={"tokens": [{"sha256": hash_token(ADMIN_TOKEN), "user": "ops", "role": "admin"}]},
        logging={"level": "warning"},
    )
    daemon = DaemonProcess(tmp_path / "daemon", config)
    (daemon.workdir / "var").mkdir()
    daemon.start()
    try:
        yield daemon
    finally:
        code = daemon.terminate()
        assert code == 0, daemon.all_output()[-3000:]


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    dead_proxy = f"http://127.0.0.1:{free_port()}"
    env = {
        **os.environ,
        "HTTP_PROXY": dead_proxy,
        "HTTPS_PROXY": dead_proxy,
        "ALL_PROXY": dead_proxy,
        "NO_PROXY": "127.0.0.1,localhost",
    }
    return subprocess.run(
        args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False
    )


def _generate(document: bytes, workdir: Path) -> None:
    (workdir / "openapi.json").write_bytes(document)
    (workdir / "generator.yaml").write_text("post_hooks: []\n", encoding="utf-8")
    generate = "generate --path openapi.json --meta none --config generator.yaml"
    done = _run(
        [str(BIN / "openapi-python-client"), *generate.split(), "--output-path", "outboxd_client"],
        workdir,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    assert (workdir / "outboxd_client" / "models" / "job_outbox_item.py").is_file()


def _mypy_errors(workdir: Path, *scripts: str) -> list[str]:
    # An empty config of its own: none of the project's settings apply to the caller.
    (workdir / "mypy.ini").write_text("[mypy]\n", encoding="utf-8")
    options = ["--strict", "--config-file", "mypy.ini", "--cache-dir", str(workdir / ".mypy_cache")]
    done = _run([str(BIN / "mypy"), *options, *scripts], workdir)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 2: mypy itself failed
    return [line for line in done.stdout.splitlines() if ": error: " in line]


def test_a_generated_client_types_every_field(live_daemon: DaemonProcess, tmp_path: Path) -> None:
    served = http_request("GET", f"{live_daemon.base_url}/openapi.json")
    assert served.status == 200, served
    workdir = tmp_path / "caller"
    workdir.mkdir()
    _generate(served.body, workdir)
    for script in ("use_client.py", "misuse.py"):
        shutil.copy(USAGE / script, workdir / script)

    errors = _mypy_errors(workdir, "use_client.py", "misuse.py")
    assert [e for e in errors if not e.startswith("misuse.py:")] == [], errors
    marked = [
        n
        for n, line in enumerate((USAGE / "misuse.py").read_text().splitlines(), 1)
        if "  # wrong: " in line
    ]
    flagged = sorted({int(m[1]) for e in errors if (m := re.match(r"misuse\.py:(\d+):", e))})
    assert flagged == marked, errors

    done = _run([sys.executable, "use_client.py", live_daemon.base_url, ADMIN_TOKEN], workdir)
    assert done.returncode == 0, done.stdout + done.stderr
    seen: dict[str, Any] = json.loads(done.stdout)
    # Accepted and published, not finished: this daemon runs no consumer.
    assert seen["job_status"] == "RUNNING"
    assert seen["finished"] is None
    assert seen["created_utc_offset"] == "0:00:00"
    # The listing's rows came back as the variant their kind names.
    assert seen["kinds"][seen["job_id"]] == "job"
    assert seen["kinds"][seen["task_id"]] == "task"
    assert seen["jobs_waiting"] == 1
    assert seen["queued_jobs"] == 0
    assert seen["oldest_pending_job_s"] is None
