"""The path an operator takes (docs/operations.md#deploying-on-a-vm), end to end and offline:

build the wheel; install it into a fresh venv from the runtime lock only; check that none of
the test kit came along; check-config the shipped systemd/outboxd.example.toml; then run
`outboxd serve` from that venv the way systemd/outboxd.service does (a non-root user, the
config in a read-only directory, the keys in a credentials directory named by
OUTBOXD_SECURITY__KEYS_FILE, NOTIFY_SOCKET, JOURNAL_STREAM) against Postgres and an SQS
server named by its explicit endpoint; take a portal job to SUCCEEDED; SIGTERM exits 0.

Nothing is fetched: `./dev` keeps the runtime wheels in .venv/wheelhouse, and the wheel is
built with the dev venv's hatchling (no build isolation).
"""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import listening_url
from testkit.fakes.portal import SAMPLE_PASSWORD, SAMPLE_SNO
from testkit.moto import MotoServer

from outboxd import __version__
from outboxd.security import generate_key, generate_token, hash_token
from tests.acceptance.conftest import PortalThread, http_request
from tests.support import postgres as pg
from tests.support.waits import eventually_sync

pytestmark = [pytest.mark.slow, pytest.mark.postgres]

ROOT = Path(__file__).resolve().parents[2]
WHEELHOUSE = Path(sys.prefix) / "wheelhouse"
# The test kit that moto[server] used to drag into a production install.
TEST_KIT = ("moto", "flask", "sympy", "networkx", "cfn-lint", "docker", "aws-xray-sdk")
SERVICE_USER = "nobody"
LINE = re.compile(r"^<([0-7])>(\{.*\})$")


def sh(*args: str | Path, timeout: float = 300, **kw: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, timeout=timeout, check=False, **kw
    )
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    return done


def system_python() -> str:
    """The Debian python3.11 an operator has: a venv on it is readable by any user."""
    for candidate in ("/usr/bin/python3.11", shutil.which("python3.11")):
        if candidate and Path(candidate).exists():
            return candidate
    pytest.fail("python3.11 not found (Debian: apt-get install python3.11 python3.11-venv)")


@pytest.fixture
def workdir() -> Iterator[Path]:
    """World-traversable (pytest's tmp_path is 0700 root): the service user reads from here."""
    path = Path(tempfile.mkdtemp(prefix="outboxd-prod-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


class Notify:
    """systemd's end of NOTIFY_SOCKET."""

    def __init__(self, path: Path, uid: int) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        os.chown(path, uid, -1)
        self.sock.settimeout(0.2)
        self.lines: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.lines.extend(self.sock.recv(4096).decode().split("\n"))
            except TimeoutError:
                continue
            except OSError:
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.sock.close()


def test_wheel_to_a_unit_like_service_offline(
    workdir: Path, moto_server: MotoServer, pg_database: str
) -> None:
    if os.geteuid() != 0:
        pytest.skip("runs the daemon as another user: needs root (CI and the dev VM are root)")
    assert WHEELHOUSE.is_dir(), f"{WHEELHOUSE} missing: run ./dev once (it downloads it)"
    user = pwd.getpwnam(SERVICE_USER)

    # 1. Build the wheel, offline.
    dist = workdir / "dist"
    sh(
        sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "--no-index",
        "-w", dist, ROOT,
    )  # fmt: skip
    (wheel,) = dist.glob("outboxd-*.whl")

    # 2. A fresh venv with the runtime lock only, then the wheel without dependencies.
    venv = workdir / "opt" / ".venv"
    sh(system_python(), "-m", "venv", venv)
    pip = (venv / "bin" / "python", "-m", "pip", "--disable-pip-version-check")
    sh(
        *pip, "install", "--no-index", "--find-links", WHEELHOUSE, "--require-hashes",
        "-r", ROOT / "requirements.txt",
    )  # fmt: skip
    sh(*pip, "install", "--no-index", "--no-deps", wheel)
    outboxd = venv / "bin" / "outboxd"

    # 3. None of the test kit came along.
    frozen = sh(*pip, "freeze").stdout
    names = {re.split(r"[=@ ]", line)[0].lower().replace("_", "-") for line in frozen.split()}
    assert "outboxd" in names and "aiobotocore" in names, frozen
    assert not names & set(TEST_KIT), names & set(TEST_KIT)
    # The release number from src/outboxd/__init__.py, in the wheel's name and from its CLI.
    assert wheel.name.startswith(f"outboxd-{__version__}-"), wheel.name
    assert sh(outboxd, "--version").stdout.strip() == f"outboxd {__version__}"

    # The files the unit hands over: config read-only, keys in a credentials directory.
    etc = workdir / "etc"
    etc.mkdir()
    shutil.copy(ROOT / "systemd" / "outboxd.example.toml", etc / "config.toml")
    (etc / "config.toml").chmod(0o444)
    etc.chmod(0o555)
    creds = workdir / "credentials"
    creds.mkdir(mode=0o500)
    (creds / "keys").write_text(generate_key() + "\n")
    (creds / "keys").chmod(0o400)
    for p in (creds, creds / "keys"):
        os.chown(p, user.pw_uid, user.pw_gid)
    state = workdir / "state"  # the StateDirectory: the service user's own, 0700
    state.mkdir(mode=0o700)
    os.chown(state, user.pw_uid, user.pw_gid)

    # Test values through OUTBOXD_<SECTION>__<KEY>, as an EnvironmentFile= drop-in would.
    name, dsn = pg.create_database()
    portal = PortalThread()
    notify = Notify(workdir / "notify.sock", user.pw_uid)
    token = generate_token()
    tag = os.urandom(5).hex()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": "/nonexistent",
        "PYTHONUNBUFFERED": "1",
        "PYTHONDONTWRITEBYTECODE": "1",
        "CREDENTIALS_DIRECTORY": str(creds),
        "OUTBOXD_SECURITY__KEYS_FILE": str(creds / "keys"),
        "OUTBOXD_STORAGE__URL": dsn,
        "AWS_CONFIG_FILE": "/nonexistent/aws-config",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent/aws-credentials",
        # The example's placeholder token replaced, as an operator must before it starts.
        "OUTBOXD_AUTH__TOKENS": f'[{{sha256 = "{hash_token(token)}", user = "ops"}}]',
    }
    try:
        # 4. check-config on the example: AWS (no endpoint) resolves, nothing leaks.
        as_service = ("setpriv", f"--reuid={user.pw_uid}", f"--regid={user.pw_gid}",
                      "--clear-groups", "--")  # fmt: skip
        checked = sh(*as_service, outboxd, "check-config", "--json", "--config",
                     etc / "config.toml", env=env, cwd=state)  # fmt: skip
        resolved = json.loads(checked.stdout)
        assert resolved["sqs"]["endpoint_url"] is None
        assert resolved["sqs"]["region"] == "eu-west-1"
        assert resolved["storage"]["url"] == dsn  # trust auth: no password to redact
        # Embedded SQS needs the extra this install does not have: one line naming it.
        embedded = subprocess.run(
            [*as_service, str(outboxd), "check-config", "--config", str(etc / "config.toml")],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            env={**env, "OUTBOXD_SQS__ENDPOINT_URL": "embedded"},
        )
        assert embedded.returncode == 2, embedded
        (line,) = embedded.stderr.strip().splitlines()
        assert "outboxd[embedded]" in line and "pip install" in line, line

        # 5. serve, as the unit runs it, against Postgres, the SQS server and the portal.
        env |= {
            "NOTIFY_SOCKET": str(notify.path),
            "JOURNAL_STREAM": "8:1234",
            "OUTBOXD_SERVER__HOST": "127.0.0.1",
            "OUTBOXD_SERVER__PORT": "0",
            "OUTBOXD_SQS__ENDPOINT_URL": moto_server.endpoint_url,
            "OUTBOXD_SQS__JOBS_QUEUE": f"p{tag}-jobs",
            "OUTBOXD_SQS__TASKS_QUEUE": f"p{tag}-tasks.fifo",
            "OUTBOXD_SQS__WAIT_TIME_S": "1",
            "OUTBOXD_SCRAPERS__SUWON__PORTAL_BASE_URL": portal.urls["portal_base_url"],
            "OUTBOXD_SCRAPERS__SUWON__INFO_BASE_URL": portal.urls["info_base_url"],
            "OUTBOXD_SCRAPERS__SUWON__MIN_INTERVAL_S": "0",
        }
        sh(*as_service, outboxd, "check-config", "--config", etc / "config.toml", env=env)
        out, err = workdir / "stdout.log", workdir / "stderr.log"
        with out.open("wb") as o, err.open("wb") as e:
            proc = subprocess.Popen(
                [*as_service, str(outboxd), "serve", "--config", str(etc / "config.toml")],
                stdout=o, stderr=e, stdin=subprocess.DEVNULL, env=env, cwd=state,
            )  # fmt: skip
        try:
            eventually_sync(lambda: "READY=1" in notify.lines or proc.poll(), 90, what="READY=1")
            assert proc.poll() is None, err.read_text()[-3000:] + out.read_text()[-3000:]
            base = listening_url(out.read_text())
            assert base is not None and base.startswith("http://127.0.0.1:"), out.read_text()

            # 6. A portal job to SUCCEEDED.
            auth = {"Authorization": f"Bearer {token}"}
            resp = http_request(
                "POST",
                f"{base}/v1/portal-link-jobs",
                {"portal": "suwon", "username": SAMPLE_SNO, "password": SAMPLE_PASSWORD},
                headers={"Idempotency-Key": "prod-path-1", **auth},
            )
            assert resp.status == 202, resp.text
            job_id = resp.json()["jobId"]

            def finished() -> str | None:
                job = http_request("GET", f"{base}/v1/jobs/{job_id}", headers=auth).json()
                return None if job["status"] in ("QUEUED", "RUNNING") else str(job["status"])

            assert eventually_sync(finished, 90, what="the job to finish") == "SUCCEEDED"

            # 7. SIGTERM: STOPPING=1, exit 0.
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(60) == 0, out.read_text()[-3000:]
            eventually_sync(lambda: "STOPPING=1" in notify.lines, 10, what="STOPPING=1")
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        assert notify.lines.count("READY=1") == 1

        # Journald: every line `<N>{json}`, the run's start lines present, no secret.
        text = out.read_text()
        events = []
        for line in text.splitlines():
            m2 = LINE.match(line)
            assert m2, line
            events.append(json.loads(m2.group(2)))
        names_seen = [e["event"] for e in events]
        for expected in ("migrations_applied", "sqs_endpoint", "daemon_ready", "daemon_stopped"):
            assert expected in names_seen, names_seen
        endpoint = next(e for e in events if e["event"] == "sqs_endpoint")
        assert endpoint["endpoint"] == moto_server.endpoint_url.split("//", 1)[1]
        assert endpoint["queue_urls"]["jobs"].endswith(f"/p{tag}-jobs")
        assert SAMPLE_PASSWORD not in text and token not in text
    finally:
        notify.close()
        portal.close()
        pg.drop_database(name)
