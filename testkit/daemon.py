"""The daemon as a subprocess, the way systemd and an operator run it, and the loopback fakes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from testkit.process import terminate


def listening_url(stdout: str) -> str | None:
    """The address the daemon's API listens on, from its `api_listening` log line (written
    whatever logging.level says; JSON, `<N>`-prefixed under journald); the latest one."""
    found = None
    for line in stdout.splitlines():
        line = re.sub(r"^<\d>", "", line.strip())
        if '"api_listening"' not in line:
            continue
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("event") == "api_listening" and isinstance(event.get("url"), str):
            found = event["url"]
    return found


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int | float):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list | tuple):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, Mapping):
        return "{ " + ", ".join(f"{k} = {_value(x)}" for k, x in v.items()) + " }"
    raise TypeError(type(v))


def dump_toml(config: Mapping[str, Any]) -> str:
    """Enough TOML for our config: tables, sub-tables and arrays of tables."""
    lines: list[str] = []

    def table(prefix: str, data: Mapping[str, Any]) -> None:
        scalars = {
            k: v
            for k, v in data.items()
            if not isinstance(v, Mapping)
            and not (isinstance(v, list) and v and isinstance(v[0], Mapping))
        }
        if prefix:
            lines.append(f"[{prefix}]")
        for k, v in scalars.items():
            lines.append(f"{k} = {_value(v)}")
        for k, v in data.items():
            if k in scalars:
                continue
            name = f"{prefix}.{k}" if prefix else k
            if isinstance(v, Mapping):
                table(name, v)
            else:
                for item in v:
                    lines.append(f"[[{name}]]")
                    for ik, iv in item.items():
                        lines.append(f"{ik} = {_value(iv)}")

    table("", config)
    return "\n".join(lines) + "\n"


class DaemonProcess:
    def __init__(
        self,
        workdir: Path,
        config: Mapping[str, Any],
        env: Mapping[str, str] | None = None,
        name: str = "daemon",
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_path = workdir / f"{name}.toml"
        self.config_path.write_text(dump_toml(config))
        self.stdout_path = workdir / f"{name}.stdout.log"
        self.stderr_path = workdir / f"{name}.stderr.log"
        self.extra_env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.base_url: str | None = None
        self.starts = 0
        self._offset = 0

    def start(self, timeout_s: float = 40.0, extra_env: Mapping[str, str] | None = None) -> str:
        """Start the daemon and wait until its API listens: the base URL."""
        self.spawn(extra_env)
        return self.wait_listening(timeout_s)

    def spawn(self, extra_env: Mapping[str, str] | None = None) -> None:
        """Start the daemon and return at once (it may still be waiting for its database)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("OUTBOXD_")}
        env.update(self.extra_env)
        env.update(extra_env or {})
        self.starts += 1
        with self.stdout_path.open("ab") as out, self.stderr_path.open("ab") as err:
            err.write(f"\n--- start {self.starts}\n".encode())
            err.flush()
            self._offset = self.stdout_path.stat().st_size
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "outboxd", "serve", "--config", str(self.config_path)],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.workdir,
            )

    def wait_listening(self, timeout_s: float = 40.0) -> str:
        """Wait until the daemon started last logs the address its API listens on."""
        assert self.proc is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = self.stdout_path.read_bytes()[self._offset :].decode("utf-8", "replace")
            url = listening_url(text)
            if url is not None:
                self.base_url = url
                return url
            if self.proc.poll() is not None:
                err_text = self.stderr_path.read_text("utf-8", "replace")
                raise RuntimeError(
                    f"daemon exited with {self.proc.returncode} while starting:\n"
                    f"{err_text[-3000:]}\n{text[-3000:]}"
                )
            time.sleep(0.05)
        raise RuntimeError("daemon did not start listening in time")

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_exit(self, timeout_s: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout_s)

    def terminate(self, timeout_s: float = 40.0) -> int:
        """SIGTERM and wait: the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout_s)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def logs(self) -> str:
        return self.stdout_path.read_text("utf-8", "replace") if self.stdout_path.exists() else ""

    def events(self) -> list[dict[str, Any]]:
        out = []
        for line in self.logs().splitlines():
            # Under journald (JOURNAL_STREAM set) a line starts with its `<N>` priority.
            line = re.sub(r"^<\d>", "", line.strip())
            if line.startswith("{"):
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue
        return out

    def all_output(self) -> str:
        err = self.stderr_path.read_text("utf-8", "replace") if self.stderr_path.exists() else ""
        return self.logs() + "\n" + err


class FakeProcess:
    """`python -m <module> --port-file F ...` as a subprocess on loopback: the fakes, and the
    benchmarks' servers. It writes its addresses to F as JSON once it listens (`info`)."""

    def __init__(
        self,
        workdir: Path,
        module: str,
        *args: str,
        name: str = "",
        timeout_s: float = 20.0,
        tree: Path | None = None,
        python: str | None = None,
    ) -> None:
        """`tree`: another checkout to run the module from (its own code first on the path),
        e.g. an earlier commit measured beside this one; `python`: another interpreter (a
        virtualenv of its own, e.g. the benchmark's peers), this one's without it."""
        name = name or module.rsplit(".", 1)[-1]
        self.port_file = workdir / f"{name}.port.json"
        self.port_file.unlink(missing_ok=True)
        self.log_path = workdir / f"{name}.log"
        root = tree or Path(__file__).resolve().parents[1]
        env = None
        if tree is not None:
            env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}"}
        with self.log_path.open("ab") as sink:
            self.proc = subprocess.Popen(
                [python or sys.executable, "-m", module, "--port-file", str(self.port_file), *args],
                stdout=sink,
                stderr=sink,
                stdin=subprocess.DEVNULL,
                cwd=root,
                env=env,
            )
        self.pid = self.proc.pid
        deadline = time.monotonic() + timeout_s
        while not self.port_file.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text("utf-8", "replace")[-2000:]
                raise RuntimeError(f"{module} did not start; {self.log_path} ends:\n{tail}")
            time.sleep(0.05)
        self.info: dict[str, Any] = json.loads(self.port_file.read_text())

    def stop(self) -> None:
        terminate(self.proc)


# The fake Suwon portal (testkit/fakes/portal.py) and the student it knows: the end-to-end
# benchmark starts it as a process, as the acceptance tests do.
PORTAL_MODULE = "testkit.fakes.portal"
SAMPLE_SNO = "20201234"
SAMPLE_PASSWORD = "correct-horse"
