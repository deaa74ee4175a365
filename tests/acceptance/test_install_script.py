"""systemd/install: --dry-run changes nothing; a real run (into scratch directories, offline
from the dev wheelhouse, with a stand-in systemctl) installs venv, config, keys and unit with
the right modes, and a second run upgrades without touching config or keys."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "systemd" / "install"
WHEELHOUSE = Path(sys.prefix) / "wheelhouse"


def install(tmp: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    calls = tmp / "systemctl.calls"
    stub = tmp / "systemctl"
    stub.write_text(f'#!/bin/sh\necho "$*" >> {calls}\n')
    stub.chmod(0o755)
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")},
        "OUTBOXD_PREFIX": str(tmp / "opt"),
        "OUTBOXD_ETC": str(tmp / "etc"),
        "OUTBOXD_UNIT_DIR": str(tmp / "unit"),
        "SYSTEMCTL": str(stub),
        "PYTHON": "/usr/bin/python3.11" if Path("/usr/bin/python3.11").exists() else "python3",
        **env,
    }
    return subprocess.run(
        [str(SCRIPT), *args], capture_output=True, text=True, env=full_env, timeout=300,
        check=False,
    )  # fmt: skip


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_dry_run_changes_nothing(tmp_path: Path) -> None:
    """A fresh host: every step is shown, nothing is made (not even the temporary folder
    a wheel would be built in), and the example config would not be enabled or started."""
    scratch = tmp_path / "tmp"  # where mktemp would make the wheel's folder
    scratch.mkdir()
    done = install(tmp_path, "--dry-run", TMPDIR=str(scratch))
    assert done.returncode == 0, done.stderr
    for step in ("pip wheel", "-m venv", "--require-hashes", "daemon-reload"):
        assert step in done.stdout, step
    assert "still the example" in done.stdout and "token create" in done.stdout
    assert "+ " + str(tmp_path / "systemctl") + " enable" not in done.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["systemctl", "tmp"]
    assert list(scratch.iterdir()) == []


def test_dry_run_with_an_edited_config_would_check_enable_and_start(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    edited = (
        (ROOT / "systemd" / "outboxd.example.toml")
        .read_text()
        .replace("port = 8080", "port = 8081")
    )
    (etc / "config.toml").write_text(edited)
    before = sorted(p.name for p in tmp_path.rglob("*"))
    done = install(tmp_path, "--dry-run", "--wheel", "outboxd-0-py3-none-any.whl")
    assert done.returncode == 0, done.stderr
    assert "still the example" not in done.stdout
    for step in ("check-config", "enable outboxd.service", "restart outboxd.service"):
        assert step in done.stdout, step
    assert sorted(p.name for p in tmp_path.rglob("*")) == sorted([*before, "systemctl"])


@pytest.mark.slow
def test_install_then_upgrade(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("installs root-owned files: needs root")
    dist = tmp_path / "dist"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-build-isolation", "--no-deps",
         "--no-index", "-w", str(dist), str(ROOT)],
        check=True, timeout=300,
    )  # fmt: skip
    (wheel,) = dist.glob("outboxd-*.whl")
    offline = {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(WHEELHOUSE)}
    first = install(tmp_path, "--wheel", str(wheel), **offline)
    assert first.returncode == 0, first.stdout + first.stderr
    etc = tmp_path / "etc"
    assert (etc / "config.toml").read_text() == (ROOT / "systemd/outboxd.example.toml").read_text()
    assert mode(etc / "config.toml") == 0o644
    assert mode(etc / "keys") == 0o600 and mode(etc / "env") == 0o600
    keys = (etc / "keys").read_text()
    assert len(keys.splitlines()) == 1
    assert (tmp_path / "unit" / "outboxd.service").read_text() == (
        ROOT / "systemd/outboxd.service"
    ).read_text()
    venv_outboxd = tmp_path / "opt" / ".venv" / "bin" / "outboxd"
    assert subprocess.run([str(venv_outboxd), "--version"], check=True, capture_output=True)
    # The example is neither enabled nor started: it names a database and a token that
    # do not exist yet; the script says what to edit.
    calls = (tmp_path / "systemctl.calls").read_text().splitlines()
    assert calls == ["daemon-reload"]
    assert "still the example" in first.stdout and "[[auth.tokens]]" in first.stdout

    token = subprocess.run(
        [str(venv_outboxd), "token", "create", "--user", "ops", "--role", "admin"],
        check=True, capture_output=True, text=True,
    ).stdout.splitlines()  # fmt: skip
    edited = (etc / "config.toml").read_text().replace("port = 8080", "port = 8081")
    start = edited.index("\n[[auth.tokens]]\n") + 1
    end = edited.index("\n[[scheduler.jobs]]\n") + 1
    (etc / "config.toml").write_text(edited[:start] + "\n".join(token[1:]) + "\n\n" + edited[end:])
    second = install(tmp_path, "--wheel", str(wheel), **offline)
    assert second.returncode == 0, second.stdout + second.stderr
    assert (etc / "keys").read_text() == keys  # never a new key over an old one
    assert "port = 8081" in (etc / "config.toml").read_text()
    assert "exists, kept" in second.stdout
    calls = (tmp_path / "systemctl.calls").read_text().splitlines()
    assert calls[-2:] == ["enable outboxd.service", "restart outboxd.service"]
