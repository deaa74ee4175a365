"""No module in src/ over 600 lines (issue #47): a module that grows past it is split by
meaning (docs/architecture.md lists what each one owns), not left to grow."""

from __future__ import annotations

from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "outboxd"
MAX_LINES = 600
MODULES = sorted(PACKAGE.rglob("*.py"))


def test_the_package_has_modules() -> None:
    assert len(MODULES) > 50


@pytest.mark.parametrize("path", MODULES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_module_is_at_most_600_lines(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    assert lines <= MAX_LINES, (
        f"src/outboxd/{path.relative_to(PACKAGE)} has {lines} lines, over {MAX_LINES}: "
        "split it by meaning (docs/architecture.md#where-each-behaviour-lives)"
    )
