"""Count the database round trips an operation makes (bench-only instrumentation).

Postgres: every statement asyncpg sends (`Connection._execute`, and `execute` without
arguments, which BEGIN, COMMIT and the pool's reset query use). SQLite: every hop to the
database's thread: outboxd's own one-thread executor (`_SqliteThread.call`, one per
transaction since 2fc7c99) and aiosqlite's (`Connection._execute`, one per call; the bare
baseline still uses it). Nothing in src/ is changed: the classes are wrapped for the
duration of a `with counting() as c:` block.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
from collections.abc import Callable, Iterator
from typing import Any


class Counter:
    def __init__(self) -> None:
        self.pg = 0
        self.sqlite = 0

    @property
    def total(self) -> int:
        return self.pg + self.sqlite


def _targets() -> list[tuple[Any, str, str]]:
    """(class, method, which counter) for every driver present."""
    out: list[tuple[Any, str, str]] = []
    with contextlib.suppress(ImportError):
        pg = importlib.import_module("asyncpg.connection").Connection
        out += [(pg, "_execute", "pg"), (pg, "execute", "pg-noargs")]
    with contextlib.suppress(ImportError):
        out.append((importlib.import_module("aiosqlite.core").Connection, "_execute", "sqlite"))
    db = importlib.import_module("outboxd.storage.db")
    thread = getattr(db, "_SqliteThread", None)
    if thread is not None and hasattr(thread, "call"):
        out.append((thread, "call", "sqlite"))
    return out


def _module_targets() -> list[tuple[Any, str]]:
    """Module-level functions that are one hop each (the bare one-hop SQLite loop)."""
    measure = importlib.import_module("bench.measure")
    return [(measure, "one_hop")]


@contextlib.contextmanager
def counting() -> Iterator[Counter]:
    c = Counter()
    saved: list[tuple[Any, str, Callable[..., Any]]] = []

    def wrap(orig: Callable[..., Any], kind: str) -> Callable[..., Any]:
        @functools.wraps(orig)
        async def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
            if kind == "pg":
                c.pg += 1
            elif kind == "pg-noargs":
                if len(args) <= 1:  # with arguments it goes through _execute, counted there
                    c.pg += 1
            else:
                c.sqlite += 1
            return await orig(self, *args, **kwargs)

        return wrapper

    for cls, name, kind in _targets():
        orig = getattr(cls, name)
        saved.append((cls, name, orig))
        setattr(cls, name, wrap(orig, kind))
    for module, name in _module_targets():
        orig = getattr(module, name)

        def make(fn: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(fn)
            async def counted(*args: Any, **kwargs: Any) -> Any:
                c.sqlite += 1
                return await fn(*args, **kwargs)

            return counted

        saved.append((module, name, orig))
        setattr(module, name, make(orig))
    try:
        yield c
    finally:
        for cls, name, orig in saved:
            setattr(cls, name, orig)
