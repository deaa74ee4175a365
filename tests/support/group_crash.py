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
from outboxd.storage.store import open_store


def planned(tag: str, n: int) -> list[NewPortalJob]:
    return [
        NewPortalJob(
            job_id=f"{tag}-job-{i}",
            outbox_id=f"{tag}-outbox-{i}",
            user_id="crash-user",
            idempotency_key=f"{tag}-key-{i}",
            fingerprint="fp",
            portal="suwon",
            key_id="k1",
            sealed=b"sealed",
        )
        for i in range(n)
    ]


async def main(url: str, wd: Path, tag: str, n: int) -> None:
    store = await open_store(url, wd, 5, 5.0)
    await store.db.migrate()
    jobs = planned(tag, n)
    print(json.dumps({j.idempotency_key: j.job_id for j in jobs}), flush=True)
    now = time.time()
    await asyncio.gather(*(store.create_portal_job(j, now) for j in jobs))
    print("answered", flush=True)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], Path(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
