"""Databases at a schema other than this code's, written raw (tests/support/db.py), as
another release leaves them: an older one (this code's migrations applied up to a
version, by the scripts themselves), a newer one (a migration this code does not carry),
and a newer one that contracted the schema past this code (its row in `schema_floor`)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import asyncpg

from outboxd.storage.db import backend_of, known_schema_version, load_migrations, sqlite_path
from tests.support.db import raw_db
from tests.support.previous_release import PREVIOUS_SCHEMA


def previous_schema(db_url: str) -> int:
    """The newest migration of the previous release on `db_url`'s backend."""
    return max(v for v, _, _ in load_migrations(backend_of(db_url)) if v <= PREVIOUS_SCHEMA)


async def migrate_up_to(db_url: str, version: int) -> list[str]:
    """This code's migrations up to `version` applied, recorded as the runner records them;
    the names of the ones left pending."""
    backend = backend_of(db_url)
    migrations = load_migrations(backend)
    if backend == "sqlite":
        path = sqlite_path(db_url, Path.cwd())
        path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT "
                "NULL, applied_at REAL NOT NULL)"
            )
            for v, name, script in migrations:
                if v <= version:
                    conn.executescript(script)
                    conn.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", (v, name))
        finally:
            conn.close()
    else:
        pg = await asyncpg.connect(db_url, timeout=5)
        try:
            await pg.execute(
                "CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT "
                "NULL, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())"
            )
            for v, name, script in migrations:
                if v <= version:
                    await pg.execute(script)
                    await pg.execute("INSERT INTO schema_migrations VALUES ($1, $2)", v, name)
        finally:
            await pg.close()
    return [name for v, name, _ in migrations if v > version]


async def newer_migration(db_url: str, version: int) -> None:
    """What a newer release's additive migration leaves: its row in schema_migrations."""
    name = f"{version:04d}_from_a_newer_release.sql"
    async with raw_db(db_url) as db:
        if backend_of(db_url) == "sqlite":
            await db.execute("INSERT INTO schema_migrations VALUES (?, ?, 0)", version, name)
        else:
            await db.execute("INSERT INTO schema_migrations VALUES (?, ?)", version, name)


async def contracted_past_this_code(db_url: str) -> int:
    """What a newer release's contract migration leaves (storage/schema.py): it needs code
    that knows one migration more than this code does. Its number."""
    known = known_schema_version(backend_of(db_url))
    await newer_migration(db_url, known + 2)
    async with raw_db(db_url) as db:
        await db.execute(
            "CREATE TABLE IF NOT EXISTS schema_floor (version INTEGER PRIMARY KEY, "
            "min_code_schema INTEGER NOT NULL)"
        )
        await db.execute("INSERT INTO schema_floor VALUES (?, ?)", known + 2, known + 1)
    return known + 2
