"""Growth in sight: the tables' size on disk, their dead rows and the oldest open
transaction, as `store.growth()` reads them and /metrics shows them.

Both backends; the rows are written and the transaction held through a connection of the
test's own (tests/support/db.py), never through the code under test. Postgres' statistics
reach pg_stat_user_tables asynchronously: the writer asks for a flush and the test polls.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest
import pytest_asyncio
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from outboxd.daemon.components import build_api_deps
from outboxd.daemon.readiness import DependencyReadiness
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.security import KeyRing
from outboxd.services.admin import AdminService
from outboxd.services.gauges import StatsGauges
from outboxd.storage.growth_ports import ALL_TABLES, FREE_PAGES, OUTBOXD_TABLES, Growth
from outboxd.storage.store import SqlStore
from outboxd.storage.store import growth as growth_module
from tests.conftest import SettingsFactory, postgres_only, sqlite_only
from tests.support.db import raw_db
from tests.support.waits import eventually

Client = TestClient[Any, Any]

# Rows enough to fill several pages of either database (SQLite's are 4 KiB, Postgres' 8).
MANY = 2000
# n rows of website_registrations (a table no refresh of the gauges reads, so no scan of the
# gauges prunes the dead rows the tests count), in one statement on either database.
INSERT_ROWS = (
    "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?)"
    " INSERT INTO website_registrations (user_id, registered_at, website_id)"
    " SELECT 'growth', i, 'w' || i FROM n"
)


@pytest_asyncio.fixture
async def client(
    make_settings: SettingsFactory, store: SqlStore, keys: KeyRing
) -> AsyncIterator[Client]:
    """The API in process, its gauges refreshed at every scrape."""
    settings = make_settings(metrics={"refresh_s": 0})
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    http: Client = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await http.start_server()
    yield http
    await http.close()


async def scrape(client: Client) -> dict[str, dict[tuple[tuple[str, str], ...], float]]:
    """name -> labels -> value of one /metrics answer."""
    resp = await client.get("/metrics")
    assert resp.status == 200
    out: dict[str, dict[tuple[tuple[str, str], ...], float]] = {}
    for family in text_string_to_metric_families(await resp.text()):
        for s in family.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = float(s.value)
    return out


def by_table(
    samples: dict[str, dict[tuple[tuple[str, str], ...], float]], name: str
) -> dict[str, float]:
    return {dict(labels)["table"]: v for labels, v in samples.get(name, {}).items()}


async def test_the_tables_reported_are_the_tables_migrated(
    backend: str, db_url: str, store: SqlStore
) -> None:
    """Every table the migrations make has its size reported: on Postgres exactly
    OUTBOXD_TABLES (a migration that adds a table adds it there), on SQLite every table of
    the file, its catalog and free pages too, adding up to the file's size."""
    growth = await store.growth()
    async with raw_db(db_url) as db:
        if backend == "postgres":
            rows = await db.rows(
                "SELECT tablename FROM pg_tables WHERE schemaname = current_schema()"
            )
            assert {r["tablename"] for r in rows} == set(OUTBOXD_TABLES)
            assert set(growth.table_bytes) == set(OUTBOXD_TABLES)
        else:
            rows = await db.rows("SELECT name FROM sqlite_master WHERE type = 'table'")
            assert set(OUTBOXD_TABLES) <= {r["name"] for r in rows} <= set(growth.table_bytes)
            file_bytes = await db.scalar(
                "SELECT page_count * page_size FROM pragma_page_count(), pragma_page_size()"
            )
            assert sum(growth.table_bytes.values()) == file_bytes
    assert all(n > 0 for t, n in growth.table_bytes.items() if t != FREE_PAGES), growth
    if backend == "sqlite":
        # auto_vacuum's pointer-map pages belong to no table: counted apart.
        assert growth.table_bytes["*other"] >= 4096


async def test_table_bytes_grow_with_rows(
    backend: str, db_url: str, store: SqlStore, client: Client
) -> None:
    before = await store.growth()
    shown = by_table(await scrape(client), "outboxd_table_bytes")
    assert shown == {t: float(n) for t, n in before.table_bytes.items()}

    async with raw_db(db_url) as db:
        await db.execute(INSERT_ROWS, MANY)
        assert await db.count("website_registrations") == MANY
    after = await store.growth()
    table = "website_registrations"
    # 2,000 rows of some 40 bytes each, with the primary key's index: over 64 KiB more.
    assert after.table_bytes[table] >= before.table_bytes[table] + 64 * 1024, (before, after)
    assert by_table(await scrape(client), "outboxd_table_bytes")[table] == after.table_bytes[table]
    if backend == "sqlite":
        # The file grew by what the table took: the other tables stayed as they were.
        grown = {t for t in after.table_bytes if after.table_bytes[t] != before.table_bytes.get(t)}
        assert grown <= {table, FREE_PAGES, "*other"}, (before, after)


@sqlite_only
async def test_sqlite_free_pages_and_the_whole_file(
    db_url: str, store: SqlStore, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleted rows leave free pages, which VACUUM gives back; a file over the split limit
    is reported whole, its pages the same in all."""
    async with raw_db(db_url) as db:
        await db.execute(INSERT_ROWS, MANY)
        await db.execute("DELETE FROM website_registrations")
    split = await store.growth()
    assert split.table_bytes[FREE_PAGES] >= 64 * 1024, split
    assert split.dead_rows == {} and split.live_rows == {}
    assert split.oldest_transaction_age_s is None

    monkeypatch.setattr(growth_module, "SPLIT_MAX_BYTES", 0)
    whole = await store.growth()
    assert set(whole.table_bytes) == {ALL_TABLES, FREE_PAGES}
    assert whole.table_bytes[FREE_PAGES] == split.table_bytes[FREE_PAGES]
    assert sum(whole.table_bytes.values()) == sum(split.table_bytes.values())
    # The series of the tables go with the split, not left at their last values.
    samples = await scrape(client)
    assert by_table(samples, "outboxd_table_bytes") == {
        t: float(n) for t, n in whole.table_bytes.items()
    }
    assert "outboxd_table_dead_rows" not in samples
    assert samples["outboxd_oldest_transaction_age_seconds"] == {(): 0.0}

    async with raw_db(db_url) as db:
        await db.execute("VACUUM")
    assert (await store.growth()).table_bytes[FREE_PAGES] == 0
    # outbox.prune gives the free pages back itself (incremental vacuum, decision 0035).
    async with raw_db(db_url) as db:
        await db.execute(INSERT_ROWS, MANY)
        await db.execute("DELETE FROM website_registrations")
    assert (await store.growth()).table_bytes[FREE_PAGES] >= 64 * 1024
    assert await store.give_back_space() > 0
    assert (await store.growth()).table_bytes[FREE_PAGES] == 0


@postgres_only
async def test_dead_rows_rise_after_updates_and_deletes(
    db_url: str, store: SqlStore, client: Client
) -> None:
    """40 rows written, 20 updated and 20 deleted: 40 dead rows, 20 live. Few enough that
    autovacuum (50 dead rows and up) leaves them alone while the test looks."""
    async with raw_db(db_url) as db:
        await db.execute(INSERT_ROWS, 40)
        assert (
            await db.execute(
                "UPDATE website_registrations SET website_id = website_id || '+'"
                " WHERE registered_at <= 20"
            )
            == 20
        )
        assert await db.execute("DELETE FROM website_registrations WHERE registered_at > 20") == 20
        # This session's counts reach the statistics when it is next idle, not up to a second
        # later (Postgres 15 and up; before, the poll below waits for the collector).
        if await db.scalar("SELECT to_regproc('pg_stat_force_next_flush') IS NOT NULL"):
            await db.execute("SELECT pg_stat_force_next_flush()")

    table = "website_registrations"

    async def counted() -> Growth | None:
        g = await store.growth()
        return g if g.dead_rows.get(table, 0) >= 40 else None

    growth = await eventually(counted, what="the dead rows to be counted")
    assert growth.live_rows[table] == 20
    samples = await scrape(client)
    assert by_table(samples, "outboxd_table_dead_rows")[table] >= 40
    assert by_table(samples, "outboxd_table_live_rows")[table] == 20
    assert set(by_table(samples, "outboxd_table_dead_rows")) == set(OUTBOXD_TABLES)


@postgres_only
@pytest.mark.real_clock  # the transaction must really be held open for a while
async def test_a_transaction_held_open_shows_its_age(db_url: str, client: Client) -> None:
    """A REPEATABLE READ transaction that read once and then sits idle in it holds back
    vacuum: /metrics shows its age, at least as long as it has been held, and 0 again
    (well under a second: outboxd's own short reads) once it ends."""

    async def age() -> float:
        return (await scrape(client))["outboxd_oldest_transaction_age_seconds"][()]

    assert await age() < 1.0
    conn = await asyncpg.connect(db_url, timeout=5)
    try:
        tx = conn.transaction(isolation="repeatable_read")
        await tx.start()
        opened = time.monotonic()  # BEGIN has run: the transaction is at least this old
        await conn.fetchval("SELECT COUNT(*) FROM jobs")

        async def held_a_second() -> float | None:
            held = time.monotonic() - opened
            shown = await age()
            # Whatever the scrape shows, it is never less than the hold so far.
            assert shown >= held, (shown, held)
            return shown if held >= 1.0 else None

        await eventually(held_a_second, what="a hold of a second on /metrics", interval=0.1)
        await tx.rollback()
    finally:
        await conn.close()

    async def back() -> bool:
        return await age() < 1.0

    await eventually(back, what="the age to fall back once the transaction ended")


async def test_one_read_of_growth_however_many_scrapers(backend: str, store: SqlStore) -> None:
    """32 refreshes at once read the growth once, as they read the counts once."""
    calls: list[float] = []

    class Counting:
        async def growth(self) -> Growth:
            calls.append(time.monotonic())
            return await store.growth()

    metrics = Metrics()
    gauges = StatsGauges(
        metrics,
        AdminService(store),
        DependencyReadiness(store, None),
        refresh_s=60,
        growth=Counting(),
    )
    await asyncio.gather(*(gauges.refresh() for _ in range(32)))
    await gauges.refresh()
    assert len(calls) == 1
    text = generate_latest(metrics.registry).decode()
    assert 'outboxd_table_bytes{table="jobs"}' in text
