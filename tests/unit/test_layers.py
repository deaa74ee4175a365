"""Imports run downward (docs/architecture.md#layers-and-import-direction), lazy ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "outboxd"

# Lower number, lower layer: a module may import its own layer and the ones below.
LAYERS = {
    "config": 0,
    "cron": 0,
    "errors": 0,
    "security": 0,
    "ids": 0,
    "observability": 0,
    "crashpoints": 0,
    "storage": 1,
    "queue": 1,
    "scrapers": 1,
    "services": 2,
    # The HTTP surface and the workers stand side by side and never import each other.
    "http": 3,
    "workers": 3,
    "daemon": 4,
    "cli": 5,
    "__main__": 6,
}
SIDE_BY_SIDE = ("http", "workers")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[0]]


def _imports(path: Path) -> set[str]:
    """Every `outboxd.*` module `path` imports, at the top or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found.update(n.removeprefix("outboxd.") for n in names if n.startswith("outboxd."))
    return found


MODULES = sorted(p for p in PACKAGE.rglob("*.py") if p.name != "__init__.py" or p.parent != PACKAGE)


def test_every_module_has_a_layer() -> None:
    """A new top-level module or package must be placed in the picture before it is used."""
    unknown = {_module_name(p).split(".")[0] for p in MODULES} - set(LAYERS)
    assert unknown == set()


@pytest.mark.parametrize("path", MODULES, ids=_module_name)
def test_imports_point_down(path: Path) -> None:
    """No module imports a module of a higher layer."""
    me = _module_name(path)
    upward = sorted(m for m in _imports(path) if _layer(m) > _layer(me))
    assert upward == [], f"{me} imports {upward}"


@pytest.mark.parametrize("path", MODULES, ids=_module_name)
def test_the_http_side_and_the_workers_do_not_import_each_other(path: Path) -> None:
    """http/ and workers/ share a layer: what one needs of the other goes through the
    wiring (daemon/) and a Protocol, never an import."""
    me = _module_name(path).split(".")[0]
    if me not in SIDE_BY_SIDE:
        return
    other = next(side for side in SIDE_BY_SIDE if side != me)
    crossing = sorted(m for m in _imports(path) if m.split(".")[0] == other)
    assert crossing == [], f"{_module_name(path)} imports {crossing}"


def test_core_sees_storage_through_ports_only() -> None:
    """Services and the HTTP side use storage/ports.py, never the store or the drivers."""
    offenders = {
        _module_name(p): sorted(m for m in _imports(p) if m in {"storage.store", "storage.db"})
        for p in MODULES
        if _module_name(p).startswith(("services.", "http."))
    }
    assert {k: v for k, v in offenders.items() if v} == {}
