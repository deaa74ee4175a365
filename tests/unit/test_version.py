"""One release number (src/outboxd/__init__.py `__version__`), said the same everywhere:
`outboxd --version`, `outboxd_build_info{version}`, the wheel's metadata (pyproject.toml
takes it from there), and CHANGELOG.md's newest release, which names the previous release
the upgrade test runs (tests/support/previous_release.py)."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

import outboxd
from outboxd.cli import _parser, version
from outboxd.metrics import Metrics, package_version
from tests.support.previous_release import PREVIOUS_VERSION

ROOT = Path(__file__).resolve().parents[2]
RELEASE_HEADING = re.compile(r"^## (\d+\.\d+\.\d+)\b", re.MULTILINE)


def test_one_release_number_for_the_cli_and_the_metrics() -> None:
    assert re.fullmatch(r"\d+\.\d+\.\d+", outboxd.__version__)
    assert version() == package_version() == outboxd.__version__
    text = generate_latest(Metrics(schema=12).registry).decode()
    (labels,) = [
        s.labels
        for f in text_string_to_metric_families(text)
        for s in f.samples
        if s.name == "outboxd_build_info"
    ]
    assert labels == {"version": outboxd.__version__, "schema": "12"}
    action = next(a for a in _parser()._actions if "--version" in a.option_strings)
    assert action.version == f"outboxd {outboxd.__version__}"  # type: ignore[attr-defined]


def test_the_wheel_takes_its_version_from_the_package() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"]
    assert project["project"]["dynamic"] == ["version"]
    assert project["tool"]["hatch"]["version"]["path"] == "src/outboxd/__init__.py"


def test_the_changelog_names_this_release_first_and_the_previous_one() -> None:
    releases = RELEASE_HEADING.findall((ROOT / "CHANGELOG.md").read_text(encoding="utf-8"))
    assert releases[0] == outboxd.__version__, releases
    assert PREVIOUS_VERSION in releases[1:], releases
    assert len(set(releases)) == len(releases), releases
