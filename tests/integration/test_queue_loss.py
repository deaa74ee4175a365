"""A queue that lost its messages: only unfinished work SENT before the loss goes out again.

`republish_unfinished(lost_before)` runs once per recreation of the queues. Rows sent
to the recreated queue keep their message; finished jobs and tasks are not sent again.
On both backends.
"""

from __future__ import annotations

import uuid

from outboxd.storage.store import SqlStore
from tests.support.ops import insert_portal_job


async def sent_job(store: SqlStore, at: float) -> tuple[str, str]:
    """A job whose outbox row was SENT at `at` (the job RUNNING): (job id, outbox id)."""
    job_id, outbox_id = await insert_portal_job(store, at - 1)
    row = await store.claim_relay_row(outbox_id, at, 10.0)
    assert row is not None
    [sent] = await store.mark_relay_sent([(row, f"m-{outbox_id}")], at)
    assert sent.status == "SENT" and sent.sent_at == at
    return job_id, outbox_id


async def sent_task(store: SqlStore, at: float) -> tuple[str, str]:
    task_id, outbox_id = str(uuid.uuid4()), str(uuid.uuid4())
    await store.enqueue_task(task_id, outbox_id, "noop", {}, f"d-{task_id}", at - 1)
    row = await store.claim_relay_row(outbox_id, at, 10.0)
    assert row is not None
    await store.mark_relay_sent([(row, f"m-{outbox_id}")], at)
    return task_id, outbox_id


async def test_only_unfinished_rows_sent_before_the_loss_are_published_again(
    store: SqlStore,
) -> None:
    _, before = await sent_job(store, 100.0)
    _, after = await sent_job(store, 200.0)  # sent to the recreated queue
    finished_job, finished_row = await sent_job(store, 100.0)
    run = await store.start_job_run(finished_job, 101.0, 10.0)
    assert run is not None
    assert await store.finish_job(run, "SUCCEEDED", 102.0, result={}) is not None
    _, task_before = await sent_task(store, 100.0)
    done_task, done_task_row = await sent_task(store, 100.0)
    assert await store.finish_task(done_task, "SUCCEEDED", None, 101.0) is not None

    assert await store.republish_unfinished(150.0) == 2

    async def state(outbox_id: str) -> tuple[str, float | None]:
        row = await store.get_relay_row(outbox_id)
        assert row is not None
        return row.status, row.sent_at

    for outbox_id in (before, task_before):
        row = await store.get_relay_row(outbox_id)
        assert row is not None
        assert (row.status, row.next_attempt_at, row.claimed_until) == ("PENDING", 150.0, None)
    assert await state(after) == ("SENT", 200.0)
    assert await state(finished_row) == ("SENT", 100.0)
    assert await state(done_task_row) == ("SENT", 100.0)
    # A second call for the same loss finds nothing more to do.
    assert await store.republish_unfinished(150.0) == 0
