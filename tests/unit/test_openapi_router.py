"""The OpenAPI document and the aiohttp router describe the same (method, path) pairs."""

from __future__ import annotations

from pathlib import Path

from outboxd.config_file import settings_from_mapping
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.http.openapi import openapi_document
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.storage.changes import JobChanges

_METHODS = {"get", "put", "post", "delete", "options", "head", "patch", "trace"}


class _NoStore:
    """create_app never touches the store while building routes."""

    changes = JobChanges()  # what held requests watch (never signalled here)


def _router_pairs(tmp_path: Path) -> set[tuple[str, str]]:
    settings = settings_from_mapping(
        {"storage": {"url": f"sqlite:///{tmp_path / 'x.db'}"}}, env={}, base_dir=tmp_path
    )
    deps = build_api_deps(
        settings,
        _NoStore(),  # type: ignore[arg-type]
        KeyRing([b"k" * 32]),
        Metrics(),
        queues=None,
        dispatcher=None,
    )
    app = create_app(deps)
    pairs = set()
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter")
        assert isinstance(path, str), info
        pairs.add((route.method.lower(), path))
    return pairs


def _document_pairs() -> set[tuple[str, str]]:
    doc = openapi_document()
    return {
        (method, path)
        for path, item in doc["paths"].items()
        for method in item
        if method in _METHODS
    }


def test_every_route_is_documented_and_every_operation_routed(tmp_path: Path) -> None:
    routed = _router_pairs(tmp_path)
    documented = _document_pairs()
    assert routed - documented == set(), "routes missing from the OpenAPI document"
    assert documented - routed == set(), "documented operations with no route"


def test_no_implicit_head_routes(tmp_path: Path) -> None:
    """aiohttp adds HEAD for every GET unless told not to; the document names none."""
    assert not any(m == "head" for m, _ in _router_pairs(tmp_path))


def test_path_parameters_match_the_route_placeholders() -> None:
    doc = openapi_document()
    for path, item in doc["paths"].items():
        placeholders = {seg[1:-1] for seg in path.split("/") if seg.startswith("{")}
        for method, op in item.items():
            if method not in _METHODS:
                continue
            params = list(item.get("parameters", [])) + list(op.get("parameters", []))
            resolved = []
            for p in params:
                if "$ref" in p:
                    name = p["$ref"].rsplit("/", 1)[-1]
                    p = doc["components"]["parameters"][name]
                resolved.append(p)
            in_path = {p["name"] for p in resolved if p.get("in") == "path"}
            assert in_path == placeholders, (method, path, in_path)
