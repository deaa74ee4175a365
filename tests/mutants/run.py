"""The mutation catalog's runner: `./dev mutants [NAME...]`.

Each `tests/mutants/*.toml` is one mutant of one guard:

    file   = "src/outboxd/..."        the file to change (relative to the project root)
    search = '''...'''                 exact text, must occur exactly once in `file`
    replace = '''...'''                what it becomes
    tests  = ["tests/...::name", ...]  the tests that must notice (pytest node ids)
    why    = "..."                     the guard, and what breaking it would let happen

For each mutant: copy the tree (src, tests, testkit and the project files, not .venv) to a scratch
directory, apply the replacement there, run only the named tests there (with `-x`, the
scratch `src` first on PYTHONPATH, checked before running), and print

    KILLED <name> by <first failing test>      the tests noticed
    SURVIVED <name>                             they all passed on the mutant
    NOT-APPLIED <name>: <reason>                the search text is not in the source exactly once
    ERROR <name>: <reason>                      the tests could not run (collection error, timeout)

then `N killed, M survived` (plus the count of the other two when not zero). The exit
status is 0 only when every mutant was killed. Scratch copies are removed at the end,
on Ctrl-C and on SIGTERM too.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
# What a scratch copy holds: enough to import the package and run the tests.
COPY_DIRS = ("src", "tests", "testkit")
COPY_FILES = ("pyproject.toml", "config.toml")
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", ".pytest_cache", ".mypy_cache")
# Per mutant: pytest's own per-test timeout (pyproject) stops a hung test first.
MUTANT_TIMEOUT_S = 900.0
FIELDS = {"file", "search", "replace", "tests", "why"}


@dataclass(frozen=True)
class Mutant:
    name: str
    file: str
    search: str
    replace: str
    tests: tuple[str, ...]
    why: str


def load(directory: Path = HERE) -> list[Mutant]:
    """Every catalog entry, sorted by name; ValueError for a malformed one."""
    out = []
    for path in sorted(directory.glob("*.toml")):
        with path.open("rb") as f:
            data = tomllib.load(f)
        if set(data) != FIELDS:
            raise ValueError(f"{path.name}: fields must be exactly {sorted(FIELDS)}")
        tests = data["tests"]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(f"{path.name}: tests must be a non-empty list of node ids")
        if not all(isinstance(data[k], str) for k in ("file", "search", "replace", "why")):
            raise ValueError(f"{path.name}: file, search, replace and why must be strings")
        if data["search"] == data["replace"] or not data["search"]:
            raise ValueError(f"{path.name}: search must be non-empty and differ from replace")
        out.append(
            Mutant(
                name=path.stem,
                file=data["file"],
                search=data["search"],
                replace=data["replace"],
                tests=tuple(tests),
                why=data["why"],
            )
        )
    return out


def applies(m: Mutant, root: Path = ROOT) -> str | None:
    """None when the mutant applies to the source under `root`, else why not."""
    path = root / m.file
    if not path.is_file():
        return f"{m.file} does not exist"
    n = path.read_text(encoding="utf-8").count(m.search)
    return None if n == 1 else f"search text found {n} times in {m.file} (must be exactly once)"


@dataclass(frozen=True)
class Outcome:
    verdict: str  # KILLED, SURVIVED, NOT-APPLIED, ERROR
    detail: str
    seconds: float
    reason: str = ""  # a KILLED mutant's first failure, as pytest summarised it


class Runner:
    def __init__(self, python: str, keep_going: bool) -> None:
        self.python = python
        self.keep_going = keep_going
        self.scratch = Path(tempfile.mkdtemp(prefix="outboxd-mutants-"))
        self._procs: set[subprocess.Popen[str]] = set()
        self._lock = threading.Lock()
        self.stopping = False

    def cleanup(self) -> None:
        self.stopping = True
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            _kill_group(p)
        shutil.rmtree(self.scratch, ignore_errors=True)

    def run(self, m: Mutant) -> Outcome:
        started = time.monotonic()
        reason = applies(m)
        if reason is not None:
            return Outcome("NOT-APPLIED", reason, 0.0)
        tree = Path(tempfile.mkdtemp(prefix=f"{m.name}-", dir=self.scratch))
        try:
            for d in COPY_DIRS:
                shutil.copytree(ROOT / d, tree / d, ignore=IGNORE)
            for f in COPY_FILES:
                if (ROOT / f).exists():
                    shutil.copy2(ROOT / f, tree / f)
            target = tree / m.file
            target.write_text(
                target.read_text(encoding="utf-8").replace(m.search, m.replace, 1),
                encoding="utf-8",
            )
            env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
            env["PYTHONPATH"] = os.pathsep.join(
                [str(tree / "src"), str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
            )
            env["PYTHONDONTWRITEBYTECODE"] = "1"
            env["COLUMNS"] = "400"  # pytest fits the summary's failure message to the width
            problem = self._check_import(tree, env)
            if problem is not None:
                return Outcome("ERROR", problem, time.monotonic() - started)
            return self._pytest(m, tree, env, started)
        finally:
            shutil.rmtree(tree, ignore_errors=True)

    def _check_import(self, tree: Path, env: dict[str, str]) -> str | None:
        """The scratch copy's src must be what gets imported, not the editable install's."""
        out = subprocess.run(
            [self.python, "-c", "import outboxd, sys; sys.stdout.write(outboxd.__file__)"],
            cwd=tree,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        imported = Path(out.stdout.strip() or "?").resolve()
        if out.returncode != 0 or not imported.is_relative_to(tree.resolve()):
            return f"the scratch copy's src is not what gets imported (got {imported})"
        return None

    def _pytest(self, m: Mutant, tree: Path, env: dict[str, str], started: float) -> Outcome:
        cmd = [
            self.python,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-rf",
            "--tb=line",
            "--no-header",
            *([] if self.keep_going else ["-x"]),
            *m.tests,
        ]
        if self.stopping:
            return Outcome("ERROR", "interrupted", 0.0)
        proc = subprocess.Popen(
            cmd,
            cwd=tree,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        with self._lock:
            self._procs.add(proc)
        try:
            output, _ = proc.communicate(timeout=MUTANT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            proc.communicate()
            return Outcome("ERROR", f"timed out after {MUTANT_TIMEOUT_S:.0f}s", MUTANT_TIMEOUT_S)
        finally:
            with self._lock:
                self._procs.discard(proc)
        took = time.monotonic() - started
        failed = re.findall(r"^FAILED (\S+)(?: - (.*))?$", output, re.MULTILINE)
        if proc.returncode == 1 and failed:
            test, reason = failed[0]
            return Outcome("KILLED", test, took, reason[:160])
        if proc.returncode == 0:
            return Outcome("SURVIVED", _summary(output), took)
        tail = " | ".join(output.strip().splitlines()[-3:])
        return Outcome("ERROR", f"pytest exit {proc.returncode}: {tail}", took)


def _summary(output: str) -> str:
    lines = [ln for ln in output.strip().splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def _kill_group(proc: subprocess.Popen[str], grace_s: float = 10.0) -> None:
    """Stop pytest and everything it started (one process group): SIGINT first, so its
    fixtures tear down (moto, daemons, the session's Postgres database), then SIGKILL."""
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGKILL, 5.0)):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
    # Whatever pytest left behind in its group (a stuck daemon) goes too.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)


def select(mutants: Sequence[Mutant], names: Sequence[str]) -> list[Mutant]:
    if not names:
        return list(mutants)
    known = {m.name: m for m in mutants}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"mutants: no such entry: {', '.join(unknown)} (see --list)")
    return [known[n] for n in names]


def _line(m: Mutant, o: Outcome) -> str:
    if o.verdict == "KILLED":
        why = f": {o.reason}" if o.reason else ""
        return f"KILLED {m.name} by {o.detail} ({o.seconds:.0f}s){why}"
    if o.verdict == "SURVIVED":
        return f"SURVIVED {m.name} ({o.detail})"
    return f"{o.verdict} {m.name}: {o.detail}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="./dev mutants", description=__doc__.split("\n")[0])
    parser.add_argument("names", nargs="*", help="entries to run (default: the whole catalog)")
    parser.add_argument("-j", "--jobs", type=int, default=2, help="mutants at a time (1 or 2)")
    parser.add_argument("--list", action="store_true", help="list the entries and exit")
    parser.add_argument(
        "--keep-going", action="store_true", help="run every named test (no -x): slower"
    )
    args = parser.parse_args(argv)
    mutants = select(load(), args.names)
    if args.list:
        for m in mutants:
            print(f"{m.name}: {m.file}: {m.why}")
        return 0
    jobs = max(1, min(2, args.jobs))  # a two-core machine: never more than two at a time
    runner = Runner(sys.executable, args.keep_going)

    def on_term(_sig: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, on_term)
    counts = {"KILLED": 0, "SURVIVED": 0, "NOT-APPLIED": 0, "ERROR": 0}
    started = time.monotonic()
    pool = ThreadPoolExecutor(max_workers=jobs)
    try:
        for m, outcome in zip(mutants, _ordered(pool, runner, mutants), strict=True):
            counts[outcome.verdict] += 1
            print(_line(m, outcome), flush=True)
    except KeyboardInterrupt:
        print("mutants: interrupted, cleaning up", file=sys.stderr, flush=True)
        runner.cleanup()
        return 130
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        runner.cleanup()
        signal.signal(signal.SIGTERM, previous)
    print(f"mutants: {len(mutants)} run in {time.monotonic() - started:.0f}s", flush=True)
    extra = [f"{counts[k]} {k.lower()}" for k in ("NOT-APPLIED", "ERROR") if counts[k]]
    print(", ".join([f"{counts['KILLED']} killed, {counts['SURVIVED']} survived", *extra]))
    return 0 if counts["KILLED"] == len(mutants) else 1


def _ordered(
    pool: ThreadPoolExecutor, runner: Runner, mutants: Sequence[Mutant]
) -> Iterator[Outcome]:
    """Outcomes in catalog order, each printed as soon as it and those before it are done."""
    futures = [pool.submit(runner.run, m) for m in mutants]
    try:
        for f in futures:
            yield f.result()
    finally:
        for f in futures:
            f.cancel()


if __name__ == "__main__":
    raise SystemExit(main())
