"""Count the database round trips an operation makes (bench-only instrumentation).

Postgres: every statement asyncpg sends (`Connection._execute`, and `execute` without
arguments, which BEGIN, COMMIT and the pool's reset query use). SQLite: every hop to
aiosqlite's thread (`Connection._execute`), which is what an aiosqlite call costs.
Nothing in src/ is changed: the driver classes are wrapped for the duration of a
`with counting() as c:` block.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any


class Counter:
    def __init__(self) -> None:
        self.pg = 0
        self.sqlite = 0

    @property
    def total(self) -> int:
        return self.pg + self.sqlite


@contextlib.contextmanager
def counting() -> Iterator[Counter]:
    import aiosqlite.core
    import asyncpg.connection

    c = Counter()
    pg_cls = asyncpg.connection.Connection
    sq_cls = aiosqlite.core.Connection
    orig_pg_exec, orig_pg_execute, orig_sq = pg_cls._execute, pg_cls.execute, sq_cls._execute

    @functools.wraps(orig_pg_exec)
    async def pg_exec(self: Any, *args: Any, **kwargs: Any) -> Any:
        c.pg += 1
        return await orig_pg_exec(self, *args, **kwargs)

    @functools.wraps(orig_pg_execute)
    async def pg_execute(self: Any, query: str, *args: Any, **kwargs: Any) -> Any:
        if not args:  # with arguments it goes through _execute, counted there
            c.pg += 1
        return await orig_pg_execute(self, query, *args, **kwargs)

    @functools.wraps(orig_sq)
    async def sq_exec(self: Any, *args: Any, **kwargs: Any) -> Any:
        c.sqlite += 1
        return await orig_sq(self, *args, **kwargs)

    pg_cls._execute, pg_cls.execute, sq_cls._execute = pg_exec, pg_execute, sq_exec  # type: ignore[method-assign]
    try:
        yield c
    finally:
        pg_cls._execute, pg_cls.execute, sq_cls._execute = orig_pg_exec, orig_pg_execute, orig_sq  # type: ignore[method-assign]
