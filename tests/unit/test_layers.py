"""Imports run downward (docs/architecture.md#layers-and-import-direction), lazy ones included."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "src" / "outboxd"

# Lower number, lower layer: a module may import its own layer and the ones below.
LAYERS = {
    "config": 0,
    "config_file": 0,
    "cron": 0,
    "errors": 0,
    "security": 0,
    "ids": 0,
    "observability": 0,
    "metrics": 0,
    "crashpoints": 0,
    "tracing": 0,
    "storage": 1,
    "queue": 1,
    "scrapers": 1,
    "services": 2,
    # The HTTP surface and the workers stand side by side and never import each other.
    "http": 3,
    "workers": 3,
    "daemon": 4,
    "cli": 5,
    "cli_portal": 5,
    "cli_deps": 5,
    "cli_audit": 5,
    "cli_commands": 5,
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


def _within(module: str, packages: set[str]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


DRIVERS = {"storage.sqlite", "storage.postgres"}


def test_core_sees_storage_through_ports_only() -> None:
    """Services and the HTTP side use storage/ports.py, never the store or the drivers."""
    hidden = {"storage.store", "storage.db", *DRIVERS}
    offenders = {
        _module_name(p): sorted(m for m in _imports(p) if _within(m, hidden))
        for p in MODULES
        if _module_name(p).startswith(("services.", "http."))
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_nothing_above_storage_imports_a_driver() -> None:
    """The wiring opens a store (`storage.store.open_store`); which driver a URL gets is
    decided inside storage, so no module above it names one."""
    offenders = {
        _module_name(p): sorted(m for m in _imports(p) if _within(m, DRIVERS))
        for p in MODULES
        if _layer(_module_name(p)) > LAYERS["storage"]
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def _library_imports(path: Path) -> set[str]:
    """The top-level names of every module `path` imports (any library)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
    return found


def test_each_database_library_is_imported_by_its_driver_only() -> None:
    importers = {
        lib: sorted(_module_name(p) for p in MODULES if lib in _library_imports(p))
        for lib in ("sqlite3", "asyncpg")
    }
    assert importers == {"sqlite3": ["storage.sqlite"], "asyncpg": ["storage.postgres"]}


def _edges() -> dict[str, set[str]]:
    """Module -> the package's modules it imports (a name imported from a package counts as
    the module of that name when there is one), at the top or inside a function; a
    package's own __init__ is not an edge of the modules inside it."""
    names = {_module_name(p): p for p in MODULES}
    edges: dict[str, set[str]] = {}
    for me, path in names.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                base = node.module.removeprefix("outboxd.")
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                found.update(alias.name.removeprefix("outboxd.") for alias in node.names)
        edges[me] = {m for m in found if m in names and m != me and not me.startswith(m + ".")}
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for n in sorted(edges[m]):
            if state.get(n) == 1:
                return [*path[path.index(n) :], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        path.pop()
        state[m] = 2
        return None

    for m in sorted(edges):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def test_the_cycle_check_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_itself_in_a_circle() -> None:
    """Beside the layers: two modules of one layer (config and its checks once) may not
    import each other, directly or around a circle, lazy imports included."""
    assert _cycle(_edges()) is None
