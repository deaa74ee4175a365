"""Requests held with `Prefer: wait` against the API in-process (tests/integration's
`make_api` fixture builds it): the client, a job to wait on, a held GET, and the signals
a test waits on instead of sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from aiohttp.test_utils import TestClient

from outboxd.services.job_waits import JobWaits
from outboxd.storage.ports import Listening
from outboxd.storage.store import SqlStore, open_store
from outboxd.workers.job_changes import POLL_S, JobChangeFeed
from tests.support.db import raw_rows
from tests.support.tcp_proxy import TcpProxy, via_proxy
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


class ListensThrough:
    """What a change feed reads (JobChangeStore): the polls through `store`, the LISTEN
    through `listener`, a store on the same database behind a TCP proxy, so a test cuts the
    listening connection alone (the database itself stays up for everything else)."""

    def __init__(self, store: SqlStore, listener: SqlStore) -> None:
        self.store = store
        self.listener = listener

    async def job_event_marks(self, job_ids: Sequence[str]) -> dict[str, int]:
        return await self.store.job_event_marks(job_ids)

    async def newest_job_event(self) -> int | None:
        return await self.store.newest_job_event()

    def listen_job_changes(
        self, on_change: Callable[[str], None]
    ) -> contextlib.AbstractAsyncContextManager[Listening] | None:
        return self.listener.listen_job_changes(on_change)


@dataclass
class CuttableFeed:
    """`store`'s change feed running with its LISTEN through `proxy`: `proxy.stop()` cuts
    it (and every reconnect is refused until `proxy.start()`); `reads` is what it polls."""

    proxy: TcpProxy
    reads: ListensThrough


@asynccontextmanager
async def feed_listening_through_a_proxy(
    store: SqlStore,
    db_url: str,
    tmp_path: Path,
    poll_s: float = POLL_S,
    connect_timeout_s: float = 2.0,
) -> AsyncIterator[CuttableFeed]:
    """Postgres only: `store`'s change feed (as its daemon runs it), listening through a
    TCP proxy the test can stop or freeze; a (re)connect through a frozen proxy waits out
    `connect_timeout_s`."""
    upstream = urlsplit(db_url)
    proxy = TcpProxy(upstream.hostname or "127.0.0.1", upstream.port or 5432)
    url = via_proxy(db_url, await proxy.start())
    listener = await open_store(url, tmp_path, 1, connect_timeout_s)
    reads = ListensThrough(store, listener)
    stop = asyncio.Event()
    running = asyncio.create_task(JobChangeFeed(reads, store.changes, poll_s).run(stop))
    try:
        yield CuttableFeed(proxy, reads)
    finally:
        stop.set()
        await running
        proxy.thaw()
        await proxy.start()
        await listener.close()
        await proxy.stop()


@asynccontextmanager
async def another_store_on(db_url: str, tmp_path: Path) -> AsyncIterator[SqlStore]:
    """A second store on the database (another daemon's), with no change feed of its own."""
    other = await open_store(db_url, tmp_path, 2, 2.0)
    try:
        yield other
    finally:
        await other.close()
