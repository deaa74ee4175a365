"""The shipped systemd unit: the directives
docs/contract.md#process-and-logs promises, and systemd's own verdict."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from outboxd.config import DaemonSettings

UNIT = Path(__file__).resolve().parents[2] / "systemd" / "outboxd.service"
SYSTEMD_ANALYZE = shutil.which("systemd-analyze")
needs_systemd_analyze = pytest.mark.skipif(
    SYSTEMD_ANALYZE is None, reason="systemd-analyze not on PATH (no systemd on this host)"
)


def _parse() -> configparser.ConfigParser:
    # interpolation=None: systemd's %d specifiers are not configparser's; optionxform=str:
    # systemd keys are case-sensitive.
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string(UNIT.read_text(encoding="utf-8"))
    return parser


def _all_values(section: str, key: str) -> list[str]:
    """Every value of a key that systemd lets repeat (configparser keeps only the last)."""
    values: list[str] = []
    current = ""
    for raw in UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            current = line[1:-1]
        elif current == section and line.startswith(f"{key}="):
            values.append(line.partition("=")[2])
    return values


REQUIRED_SERVICE = {
    "Type": "notify",
    "NotifyAccess": "main",
    "WatchdogSec": "30",
    "ExecStart": "/opt/outboxd/.venv/bin/outboxd serve --config /etc/outboxd/config.toml",
    "DynamicUser": "yes",
    "StateDirectory": "outboxd",
    "LoadCredential": "keys:/etc/outboxd/keys",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "NoNewPrivileges": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_UNIX AF_INET AF_INET6",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "MemoryDenyWriteExecute": "yes",
    "SystemCallFilter": "@system-service",
    "SystemCallArchitectures": "native",
    "CapabilityBoundingSet": "",
    "UMask": "0077",
    "Restart": "on-failure",
    "RestartSec": "5",
    "RestartPreventExitStatus": "2",
    "TimeoutStartSec": "90",
    "KillSignal": "SIGTERM",
    "TimeoutStopSec": "45",
    "LimitNOFILE": "65536",
}


@pytest.mark.parametrize(("key", "expected"), sorted(REQUIRED_SERVICE.items()))
def test_service_directive(key: str, expected: str) -> None:
    """Each hardening and lifecycle directive docs/contract.md#process-and-logs relies on
    is set to its intended value."""
    assert _parse()["Service"].get(key) == expected


def test_keys_file_comes_from_the_credential() -> None:
    """The daemon is pointed at the LoadCredential copy of the keys via the env override."""
    assert "OUTBOXD_SECURITY__KEYS_FILE=%d/keys" in _all_values("Service", "Environment")


def test_stop_timeout_exceeds_default_shutdown_timeout() -> None:
    """systemd waits longer than the daemon's own drain, so SIGKILL never cuts a drain short."""
    stop_s = float(_parse()["Service"]["TimeoutStopSec"])
    assert stop_s > DaemonSettings().shutdown_timeout_s


def test_systemd_never_gives_up_restarting() -> None:
    """No start limit: a daemon that keeps exiting 1 (its database refusing it, say) is
    restarted every RestartSec, not left failed after a burst of tries."""
    assert _parse()["Unit"]["StartLimitIntervalSec"] == "0"


def test_install_section() -> None:
    """`systemctl enable` hooks the service into the normal boot target."""
    assert _parse()["Install"]["WantedBy"] == "multi-user.target"


def _runnable_copy(tmp_path: Path) -> Path:
    # verify checks that ExecStart's binary exists; the real one lives in /opt/outboxd.
    text = UNIT.read_text(encoding="utf-8").replace(
        "/opt/outboxd/.venv/bin/outboxd", sys.executable
    )
    copy = tmp_path / "outboxd.service"
    copy.write_text(text, encoding="utf-8")
    return copy


@needs_systemd_analyze
def test_systemd_analyze_verify(tmp_path: Path) -> None:
    """`systemd-analyze verify` accepts the unit with no warning about any of its lines."""
    assert SYSTEMD_ANALYZE is not None
    copy = _runnable_copy(tmp_path)
    proc = subprocess.run(
        [SYSTEMD_ANALYZE, "verify", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    # Unknown or misspelt keys are only warnings (exit 0), so look for our file in stderr;
    # lines about other units installed on the host are not ours to judge.
    ours = [line for line in proc.stderr.splitlines() if copy.name in line]
    assert proc.returncode == 0, proc.stderr
    assert ours == []


@needs_systemd_analyze
def test_systemd_analyze_security_exposure(tmp_path: Path) -> None:
    """systemd's own exposure score stays at or below 2.5 ("OK"), so hardening cannot erode."""
    assert SYSTEMD_ANALYZE is not None
    copy = _runnable_copy(tmp_path)
    proc = subprocess.run(
        # --threshold is in tenths of the printed score.
        [SYSTEMD_ANALYZE, "security", "--offline=yes", "--threshold=25", "--no-pager", str(copy)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if "--offline" in proc.stderr and "unrecognized" in proc.stderr:
        pytest.skip("this systemd-analyze predates `security --offline` (systemd < 250)")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr
