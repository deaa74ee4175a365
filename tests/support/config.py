"""The one way tests lay settings over a base: section by section."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """`extra` over `base`: nested tables merged key by key, anything else replaced."""
    out = dict(base)
    for k, v in extra.items():
        old = out.get(k)
        out[k] = merge(old, v) if isinstance(v, Mapping) and isinstance(old, Mapping) else v
    return out
