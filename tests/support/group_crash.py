"""A process that submits a group of intakes and dies at a crash point (see test_group_commit).

    python -m tests.support.group_crash <db-url> <workdir> <tag> <n>

Prints the planned job id of each idempotency key (one JSON line) before submitting,
then `answered` once every call returned, which never happens when the process is
armed with OUTBOXD_CRASH_AT=after_group_commit_before_answers.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

from outboxd.storage.ports import NewPortalJob
from outboxd.storage.store import SqlStore, open_store
from tests.support.ops import placeholder_job

USER = "crash-user"


def portal_job(
    tag: str, i: int, *, user: str = USER, key: str | None = None, job_id: str | None = None
) -> NewPortalJob:
    """The i-th job of a tag, as the storage layer takes it (also used by the tests)."""
    return placeholder_job(
        job_id or f"{tag}-job-{i}", f"{tag}-outbox-{i}", key or f"{tag}-key-{i}", user
    )


async def warm_connections(store: SqlStore) -> None:
    """Postgres: a connection with the intake statement prepared for each call written at
    once. Otherwise such a call may still be connecting and preparing when the group that
    started after another of them commits (an intake is one round trip once prepared)."""
    if store.backend != "postgres" or store.group is None:
        return
    bulk = store._intake_bulk([], time.time())  # no rows: prepares the statement, writes nothing
    await asyncio.gather(
        *(store.db.run(bulk, one_statement=True) for _ in range(store.group.max_groups))
    )


async def main(url: str, wd: Path, tag: str, n: int) -> None:
    store = await open_store(url, wd, 5, 5.0)
    await store.db.migrate()
    await warm_connections(store)
    jobs = [portal_job(tag, i) for i in range(n)]
    print(json.dumps({j.idempotency_key: j.job_id for j in jobs}), flush=True)
    now = time.time()
    await asyncio.gather(*(store.create_portal_job(j, now) for j in jobs))
    print("answered", flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
