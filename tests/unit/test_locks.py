"""The install is lean and locked: the daemon imports only declared runtime dependencies
(moto is not one), and the three lock files cover pyproject.toml, every pin with hashes.
A failure here after a merge usually means: run `./dev lock`."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
LOCKS = {
    "runtime": ROOT / "requirements.txt",
    "embedded": ROOT / "requirements-embedded.txt",
    "dev": ROOT / "requirements-dev.txt",
}


def norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def req_name(spec: str) -> str:
    m = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec.strip())
    assert m, spec
    return norm(m.group(0))


def pins(lock: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", line)
        if m:
            out[norm(m.group(1))] = m.group(2)
    return out


def third_party_imports() -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "src" / "outboxd").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name.split(".")[0] for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.split(".")[0])
    return {n for n in names if n not in sys.stdlib_module_names and n != "outboxd"}


# Optional extras the daemon uses when installed: only these modules import them, and only
# inside functions, so the daemon runs (without what they add) when they are not.
OPTIONAL_IMPORTS = {"opentelemetry": ("otel", "tracing.py")}


def test_the_daemon_imports_only_declared_runtime_dependencies() -> None:
    declared = {req_name(d) for d in PYPROJECT["project"]["dependencies"]}
    provided = packages_distributions()
    for module in sorted(third_party_imports() - set(OPTIONAL_IMPORTS)):
        dists = {norm(d) for d in provided.get(module, [])}
        assert dists & declared, f"src imports {module} ({dists}), not a declared dependency"
    assert "moto" not in third_party_imports()
    assert not any(req_name(d) == "moto" for d in PYPROJECT["project"]["dependencies"])
    assert any(
        req_name(d) == "moto" for d in PYPROJECT["project"]["optional-dependencies"]["embedded"]
    )


def test_optional_extras_are_imported_only_where_guarded() -> None:
    """`opentelemetry` (the otel extra) only in tracing.py, never at module level there."""
    extras = PYPROJECT["project"]["optional-dependencies"]
    for module, (extra, home) in OPTIONAL_IMPORTS.items():
        assert any(req_name(d).startswith(module) for d in extras[extra]), extra
        for path in (ROOT / "src" / "outboxd").rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            top = {id(n) for n in tree.body}
            for node in ast.walk(tree):
                names = (
                    [a.name for a in node.names]
                    if isinstance(node, ast.Import)
                    else [node.module or ""]
                    if isinstance(node, ast.ImportFrom)
                    else []
                )
                if not any(n.split(".")[0] == module for n in names):
                    continue
                assert path.name == home, f"{path}: imports {module}"
                assert id(node) not in top, f"{path}: imports {module} at module level"


@pytest.mark.parametrize("kind", sorted(LOCKS))
def test_every_lock_pins_with_hashes_and_says_how_to_regenerate(kind: str) -> None:
    text = LOCKS[kind].read_text()
    assert "./dev lock" in "\n".join(text.splitlines()[:5]), "header must name ./dev lock"
    entries = re.findall(r"^(\S+==\S+)(.*(?:\n\s+.*)*)", text, flags=re.MULTILINE)
    assert entries
    for pin, rest in entries:
        assert "--hash=sha256:" in rest, f"{LOCKS[kind].name}: {pin} has no hash"


def test_the_locks_cover_pyproject_and_agree() -> None:
    runtime, embedded, dev = (pins(LOCKS[k]) for k in ("runtime", "embedded", "dev"))
    extras = PYPROJECT["project"]["optional-dependencies"]
    for dep in PYPROJECT["project"]["dependencies"]:
        assert req_name(dep) in runtime, f"{dep} missing from requirements.txt: ./dev lock"
    for dep in extras["embedded"]:
        assert req_name(dep) in embedded, f"{dep} missing from requirements-embedded.txt"
    for dep in extras["dev"]:
        assert req_name(dep) in dev, f"{dep} missing from requirements-dev.txt"
    # Each lock contains the one before it, at the same versions.
    assert runtime.items() <= embedded.items()
    assert embedded.items() <= dev.items()
    # The runtime lock carries none of the test kit.
    for kit in ("moto", "flask", "sympy", "networkx", "cfn-lint", "docker", "aws-xray-sdk"):
        assert kit not in runtime, kit
