"""The previous release, built from this repository's history, for the rolling-upgrade test
(tests/acceptance/test_rolling_upgrade.py).

`PREVIOUS_RELEASE` is the commit of the release before the one this tree is (CHANGELOG.md):
the upgrade test runs that code beside this one on one database. It moves at each release:
when X.Y is released, it becomes the commit tagged as the release before X.Y
(docs/upgrades.md#the-previous-release-pin).

The release is built as an operator gets it, a wheel of that commit, and installed with its
metadata into a folder of its own; a process with that folder first on PYTHONPATH imports
the old package (and reads the old version), with this venv's dependencies, which the two
releases share. Without git or without the commit (a shallow clone, an export) the build
fails, never skips: an upgrade that is not tested must not pass unnoticed.
"""

from __future__ import annotations

import importlib.metadata
import io
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

PREVIOUS_RELEASE = "5f8e5567b45ca03d1bb238e8580a13a5f47c2828"
PREVIOUS_VERSION = "0.1.0"
# Its newest migration (Postgres; SQLite has no 0004 nor 0008 and stops at 0007): the
# migrations after it are this release's, bound by the rule of docs/upgrades.md
# (tests/unit/test_migration_rule.py). The upgrade test checks it against the built release.
PREVIOUS_SCHEMA = 8
ROOT = Path(__file__).resolve().parents[2]
# What building the wheel reads from the tree (hatchling wants the readme pyproject names).
_BUILD_INPUTS = ("pyproject.toml", "README.md", "src")


def _git(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(ROOT), *args], capture_output=True, timeout=60, check=False
    )


def previous_release_tree(dest: Path) -> Path:
    """The files of PREVIOUS_RELEASE that a build reads, extracted under `dest`."""
    if shutil.which("git") is None:
        pytest.fail("the upgrade test needs git, to build the previous release from history")
    found = _git("cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}")
    if found.returncode != 0:
        shallow = _git("rev-parse", "--is-shallow-repository").stdout.decode().strip()
        pytest.fail(
            f"the previous release's commit {PREVIOUS_RELEASE} is not in {ROOT}'s history"
            + (" (a shallow clone: run `git fetch --unshallow`)" if shallow == "true" else "")
            + f": {found.stderr.decode(errors='replace').strip()}"
        )
    archive = _git("archive", "--format=tar", PREVIOUS_RELEASE, *_BUILD_INPUTS)
    if archive.returncode != 0:
        pytest.fail(f"git archive {PREVIOUS_RELEASE}: {archive.stderr.decode(errors='replace')}")
    tree = dest / "tree"
    tree.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(tree, filter="data")
    return tree


def install_previous_release(dest: Path) -> Path:
    """PREVIOUS_RELEASE built as a wheel and installed, package and metadata, into a folder
    under `dest`: the PYTHONPATH that runs it. Offline: this venv's hatchling builds it."""
    tree = previous_release_tree(dest)
    site = dest / "site"
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    done = subprocess.run(
        [*pip, "--no-index", "--no-deps", "--no-build-isolation", "--target", str(site), str(tree)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"building the previous release failed:\n{done.stdout}\n{done.stderr}")
    (dist,) = importlib.metadata.distributions(name="outboxd", path=[str(site)])
    if dist.version != PREVIOUS_VERSION:
        pytest.fail(f"{PREVIOUS_RELEASE} builds version {dist.version}, not {PREVIOUS_VERSION}")
    return site


def known_schema(site: Path) -> int:
    """The newest Postgres migration the release installed in `site` carries."""
    folder = site / "outboxd" / "storage" / "migrations" / "postgres"
    return max(int(p.name.split("_", 1)[0]) for p in folder.glob("*.sql"))
