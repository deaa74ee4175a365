"""Requests held with `Prefer: wait` against the API in-process (tests/integration's
`make_api` fixture builds it): the client, a job to wait on, a held GET, and the signals
a test waits on instead of sleeping.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp.test_utils import TestClient

from outboxd.services.job_waits import JobWaits
from outboxd.storage.store import SqlStore, open_store
from outboxd.workers.job_changes import POLL_S, JobChangeFeed
from tests.support.db import raw_rows
from tests.support.waits import eventually

LINK = {"portal": "suwon", "username": "20201234", "password": "pw-waits"}


@dataclass
class Client:
    """The in-process API, its held requests and the stop Event its daemon would set."""

    http: TestClient[Any, Any]
    waits: JobWaits
    stop: asyncio.Event

    async def get(self, path: str, **kw: Any) -> Any:
        return await self.http.get(path, **kw)

    async def post(self, path: str, **kw: Any) -> Any:
        return await self.http.post(path, **kw)


Api = Callable[..., Awaitable[Client]]


async def new_job(client: Client) -> tuple[str, str]:
    """A job through the API: its id and its ETag."""
    resp = await client.post(
        "/v1/portal-link-jobs", json=LINK, headers={"Idempotency-Key": uuid.uuid4().hex}
    )
    assert resp.status == 202
    job_id = (await resp.json())["jobId"]
    got = await client.get(f"/v1/jobs/{job_id}")
    return job_id, got.headers["ETag"]


async def held(client: Client, job_id: str, wait: int, etag: str | None = None) -> Any:
    headers = {"Prefer": f"wait={wait}"}
    if etag is not None:
        headers["If-None-Match"] = etag
    return await client.get(f"/v1/jobs/{job_id}", headers=headers)


async def until_held(client: Client, n: int) -> None:
    """`n` requests hold (registered: each may still be reading what it waits on)."""
    await eventually(lambda: client.waits.held >= n, what=f"{n} held requests")


async def listening(db_url: str, n: int = 1, since: float = 0.0) -> None:
    """`n` LISTEN connections (change feeds) are up on the test's Postgres database, each
    opened at epoch `since` or later (so none left over from an earlier test counts)."""

    async def up() -> bool:
        rows = await raw_rows(
            db_url,
            "SELECT COUNT(*) AS n FROM pg_stat_activity WHERE query LIKE 'LISTEN%'"
            " AND datname = current_database() AND backend_start >= to_timestamp(?)",
            since,
        )
        return bool(rows[0]["n"] >= n)

    await eventually(up, 20, what=f"{n} listeners to connect", interval=0.1)


@asynccontextmanager
async def another_store(
    store: SqlStore, db_url: str, tmp_path: Path, poll_s: float = POLL_S
) -> AsyncIterator[SqlStore]:
    """`store`'s change feed running, as its daemon runs it, and a second store on the same
    database: another daemon, whose commits reach `store`'s holds only through the feed
    (a notification on Postgres, the poll on SQLite)."""
    stop = asyncio.Event()
    running = asyncio.create_task(JobChangeFeed(store, store.changes, poll_s).run(stop))
    other = await open_store(db_url, tmp_path, 2, 2.0)
    try:
        yield other
    finally:
        stop.set()
        await running
        await other.close()
