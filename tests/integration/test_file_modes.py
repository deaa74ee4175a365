"""The SQLite database, its -wal and -shm files (and the default key file) are 0600,
whatever the umask: they hold sealed credentials."""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from outboxd.config_file import settings_from_mapping
from outboxd.daemon.startup import load_keys
from outboxd.security import KeyRing
from outboxd.storage.store import open_store
from tests.support.ops import submit_job


@pytest.fixture
def umask_022() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_database_wal_and_shm_are_0600_under_umask_022(
    tmp_path: Path, umask_022: None
) -> None:
    db = tmp_path / "data" / "outboxd.db"
    store = await open_store(f"sqlite:///{db}", tmp_path, 2, 2.0)
    try:
        await store.db.migrate()
        await submit_job(store, KeyRing([os.urandom(32)]), key=uuid.uuid4().hex)
        files = [db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm")]
        for f in files:
            assert f.exists(), f
            assert _mode(f) == 0o600, (f.name, oct(_mode(f)))
    finally:
        await store.close()


async def test_an_existing_world_readable_database_is_tightened(
    tmp_path: Path, umask_022: None
) -> None:
    db = tmp_path / "old.db"
    db.touch(mode=0o644)
    os.chmod(db, 0o644)
    store = await open_store(f"sqlite:///{db}", tmp_path, 2, 2.0)
    try:
        await store.db.migrate()
        assert _mode(db) == 0o600
        assert _mode(db.with_name(db.name + "-wal")) == 0o600
    finally:
        await store.close()


def test_the_default_key_file_is_0600_under_umask_022(tmp_path: Path, umask_022: None) -> None:
    settings = settings_from_mapping(
        {"storage": {"url": "sqlite:///outboxd.db"}}, env={}, base_dir=tmp_path
    )
    load_keys(settings, {})
    assert _mode(tmp_path / "outboxd.db.keys") == 0o600
