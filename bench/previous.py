"""Another commit's code measured beside this tree's, each running its own code: a scratch
worktree of the commit (removed afterwards), and a measurement run in a subprocess with a
tree's `src` and the tree itself first on the path (its `outboxd`, its `bench`).

`PREVIOUS` is the previous release, the one issue #46's goals are measured against; `bench.intake
--baseline REV` and `bench.pgcost --previous REV` take another commit.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import PY, ROOT

PREVIOUS = "5f8e556"


def short(rev: str) -> str:
    """The commit's short hash (CalledProcessError for one this repository lacks)."""
    out = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", f"{rev}^{{commit}}"],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.strip()


@contextlib.contextmanager
def tree_of(rev: str | None, wd: Path) -> Iterator[Path | None]:
    """A detached scratch worktree of `rev` under `wd` (removed afterwards); None for None."""
    if rev is None:
        yield None
        return
    path = wd / f"tree-{short(rev)}"
    git = ["git", "-C", str(ROOT)]
    subprocess.run([*git, "worktree", "add", "--detach", "-q", str(path), rev], check=True)
    try:
        yield path
    finally:
        subprocess.run([*git, "worktree", "remove", "--force", str(path)], check=False)


@contextlib.contextmanager
def spawn_in(tree: Path, code: str, args: Sequence[str] = ()) -> Iterator[subprocess.Popen[str]]:
    """Python `code` run in `tree` with its own code first on the path, talking over its
    stdin and stdout (lines of text; stderr is the caller's); killed on the way out if it
    has not ended by then."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}"}
    child = subprocess.Popen(
        [PY, "-c", code, *args],
        cwd=tree,
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        yield child
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()


def answer(child: subprocess.Popen[str], marker: str) -> Any:
    """The JSON document on the next line of `child`'s stdout that starts with `marker`
    (log lines before it are skipped); RuntimeError when it ends first."""
    assert child.stdout is not None
    for line in child.stdout:
        if line.startswith(marker):
            return json.loads(line[len(marker) :])
    raise RuntimeError(f"the child ended (exit {child.wait()}) before answering")
