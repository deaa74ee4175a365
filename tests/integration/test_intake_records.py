"""What intake answers is what it committed.

The intake statements return nothing (no RETURNING): the store builds the job and outbox
records from what it wrote (`records.inserted_job`, `records.inserted_relay_row`). These tests
read the rows back and compare, on both backends, alone and in a group, so a column added
with a default, or a default changed, cannot leave the two apart unnoticed."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid

import pytest

from outboxd.storage.ports import JobIntake, NewPortalJob
from outboxd.storage.store import SqlStore

TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def new_job(claimed_until: float | None = None, traceparent: str | None = None) -> NewPortalJob:
    job_id = str(uuid.uuid4())
    return NewPortalJob(
        job_id=job_id,
        outbox_id=str(uuid.uuid4()),
        user_id="alice",
        idempotency_key=f"key-{job_id}",
        fingerprint="fp",
        portal="suwon",
        key_id="k1",
        sealed=b"\x00sealed\xff",
        claimed_until=claimed_until,
        traceparent=traceparent,
    )


async def assert_as_committed(store: SqlStore, intake: JobIntake) -> None:
    assert intake.created and intake.outbox is not None
    assert intake.job == await store.get_job(intake.job.id)
    assert intake.outbox == await store.get_relay_row(intake.outbox.id)


@pytest.mark.parametrize(
    ("claimed_until", "traceparent"),
    [(None, None), (1_000_030.5, TRACEPARENT)],
    ids=["unclaimed", "claimed-with-trace"],
)
async def test_an_intake_alone_answers_the_rows_it_committed(
    store: SqlStore, claimed_until: float | None, traceparent: str | None
) -> None:
    alone = SqlStore(store.db, group_commit=False)  # the transaction body, no group or bulk
    intake = await alone.create_portal_job(new_job(claimed_until, traceparent), 1_000_000.25)
    await assert_as_committed(store, intake)
    assert intake.outbox is not None
    assert intake.outbox.attempt_count == (0 if claimed_until is None else 1)


async def test_intakes_in_a_group_answer_the_rows_they_committed(store: SqlStore) -> None:
    news = [new_job(1_000_030.0 if i % 2 else None, TRACEPARENT) for i in range(24)]
    intakes = await asyncio.gather(
        *(store.create_portal_job(n, 1_000_000.0 + i / 8) for i, n in enumerate(news))
    )
    for intake in intakes:
        await assert_as_committed(store, intake)


async def test_a_replayed_key_answers_the_first_rows(store: SqlStore) -> None:
    first = new_job(traceparent=TRACEPARENT)
    created = await store.create_portal_job(first, 1_000_000.0)
    again = dataclasses.replace(first, job_id="other", outbox_id="other-row")
    replay = await store.create_portal_job(again, 1_000_005.0)
    assert not replay.created
    assert (replay.job, replay.outbox) == (created.job, created.outbox)
