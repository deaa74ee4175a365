"""The consumer's rig for in-process tests (tests/integration's `make_rig` fixture builds
it): the consumer on real SQS (moto), the strict fake portal and the real scraper, with
the queue's receives and deletes and every published body recorded."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from testkit.fakes.portal import (
    SAMPLE_PASSWORD,
    SAMPLE_SNO,
    Course,
    FakePortal,
    Semester,
    Student,
)

from outboxd.config import Settings
from outboxd.metrics import Metrics
from outboxd.queue.sqs import (
    BatchResult,
    OutgoingMessage,
    QueueKind,
    ReceivedMessage,
    SqsQueues,
)
from outboxd.scrapers.suwon import SuwonScraper
from outboxd.security import KeyRing
from outboxd.services.breakers import Breakers
from outboxd.services.tasks import Retention
from outboxd.storage.ports import JobRecord, NewPortalJob
from outboxd.storage.store import SqlStore
from outboxd.workers.breaker_loop import BreakerLoop
from outboxd.workers.consumer import Consumer
from outboxd.workers.relay import Relay
from tests.support.students import it_student
from tests.support.waits import eventually

BROKEN_SNO = "20209999"
BROKEN_PASSWORD = "pw-broken-record"


def broken_student(sno: str = BROKEN_SNO, password: str = BROKEN_PASSWORD) -> Student:
    """A student whose record the info system serves malformed (an unknown semester
    code): PORTAL_BAD_RESPONSE on every attempt, for this student only."""
    bad_semester = Semester("2021", "99", 3, 3, 4.0, 90, "1/2")
    bad_semester.courses.append(Course("X1", "x", 3, "A0", 4.0, "전공선택", "컴퓨터학부"))
    return it_student(sno, password, "박고장", 2, [bad_semester])


FINAL = ("SUCCEEDED", "FAILED", "DEAD")


class BodyRecordingPublisher:
    """SqsQueues' send_batch, keeping every body as it was sent (to grep for secrets)."""

    def __init__(self, inner: SqsQueues) -> None:
        self.inner = inner
        self.bodies: list[str] = []

    async def send_batch(self, kind: QueueKind, messages: Sequence[OutgoingMessage]) -> BatchResult:
        self.bodies.extend(m.body for m in messages)
        return await self.inner.send_batch(kind, messages)


class RecordingReceiver:
    """SqsQueues for the consumer, recording every job message received and deleted."""

    def __init__(self, inner: SqsQueues) -> None:
        self.inner = inner
        self.received: list[ReceivedMessage] = []
        self.deleted: list[str] = []
        self.visibility_changes: list[tuple[str, int]] = []  # (receipt handle, seconds)

    async def receive(self, kind: QueueKind, *args: Any, **kwargs: Any) -> list[ReceivedMessage]:
        got = await self.inner.receive(kind, *args, **kwargs)
        if kind == "jobs":
            self.received.extend(got)
        return got

    async def delete(self, kind: QueueKind, receipt_handle: str, dlq: bool = False) -> None:
        await self.inner.delete(kind, receipt_handle, dlq)
        self.deleted.append(receipt_handle)

    async def change_visibility(
        self, kind: QueueKind, receipt_handle: str, timeout_s: int, dlq: bool = False
    ) -> None:
        await self.inner.change_visibility(kind, receipt_handle, timeout_s, dlq)
        if kind == "jobs" and not dlq:
            self.visibility_changes.append((receipt_handle, timeout_s))

    async def delete_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], dlq: bool = False
    ) -> dict[str, str]:
        failed = await self.inner.delete_batch(kind, receipt_handles, dlq)
        self.deleted.extend(h for h in receipt_handles if h not in failed)
        return failed

    async def change_visibility_batch(
        self, kind: QueueKind, receipt_handles: Sequence[str], timeout_s: int, dlq: bool = False
    ) -> dict[str, str]:
        failed = await self.inner.change_visibility_batch(kind, receipt_handles, timeout_s, dlq)
        if kind == "jobs" and not dlq:
            self.visibility_changes += [(h, timeout_s) for h in receipt_handles if h not in failed]
        return failed

    async def receive_dlq(
        self, kind: QueueKind, max_messages: int, visibility_timeout_s: int
    ) -> list[ReceivedMessage]:
        return await self.inner.receive_dlq(kind, max_messages, visibility_timeout_s)

    def receives_of(self, job_id: str) -> list[ReceivedMessage]:
        return [m for m in self.received if json.loads(m.body).get("jobId") == job_id]


@dataclass
class Rig:
    settings: Settings
    store: SqlStore
    keys: KeyRing
    queues: SqsQueues
    portal: FakePortal
    receiver: RecordingReceiver
    publisher: BodyRecordingPublisher
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    scrapers: list[SuwonScraper] = field(default_factory=list)
    metrics: Metrics = field(default_factory=Metrics)
    breakers: Breakers | None = None

    def with_breakers(self) -> Breakers:
        """The rig's consumers wait out the portal's outages from now on
        (services/breakers.py), with the breaker loop and a relay loop running, as in the
        daemon: held jobs go out again once the portal is back."""
        self.breakers = Breakers(self.settings, self.store, self.metrics)
        hold_s = self.settings.breakers.portal.probe_s + self.settings.sqs.visibility_timeout_s
        loop = BreakerLoop(self.breakers, self.metrics, hold_s)
        self.tasks.append(asyncio.create_task(loop.run(self.stop)))
        self.start_relay()
        return self.breakers

    def start_relay(self) -> None:
        """The relay's loop, as in the daemon: rows due later (a parked or held job's) go
        out when due."""
        relay = Relay(self.store, self.publisher, self.settings.relay, Metrics())
        self.tasks.append(asyncio.create_task(relay.run(self.stop)))

    def consumer(
        self,
        store: SqlStore | None = None,
        clock: Callable[[], float] = time.time,
        storage_probe: Callable[[], Awaitable[None]] | None = None,
    ) -> Consumer:
        """A consumer on the rig's queues, not running (`start_consumer` runs one); with
        `storage_probe` (the daemon passes its store's ping) it looks whether the database
        is back before it receives again after an outage."""
        scraper = SuwonScraper(self.settings.scrapers.suwon)
        self.scrapers.append(scraper)
        return Consumer(
            store or self.store,
            self.receiver,
            scraper,
            self.keys,
            self.settings.consumer,
            self.settings.sqs,
            self.metrics,
            Retention.of(self.settings),
            clock=clock,
            portal_settings=self.settings.scrapers.suwon,
            storage_probe=storage_probe,
            breakers=self.breakers,
        )

    def start_consumer(
        self,
        store: SqlStore | None = None,
        storage_probe: Callable[[], Awaitable[None]] | None = None,
    ) -> Consumer:
        consumer = self.consumer(store, storage_probe=storage_probe)
        self.tasks.append(asyncio.create_task(consumer.run(self.stop)))
        return consumer

    async def stop_consumers(self) -> None:
        """Stop every consumer started so far (new ones may be started after)."""
        self.stop.set()
        for t in self.tasks:
            await asyncio.wait_for(t, 15)
        self.tasks.clear()
        self.stop = asyncio.Event()

    async def create(self, username: str, password: str, user: str = "alice") -> tuple[str, str]:
        """A job and its outbox row, committed as the API does: (job id, outbox id)."""
        job_id, outbox_id = str(uuid.uuid4()), str(uuid.uuid4())
        canonical = {"portal": "suwon", "username": username, "password": password}
        sealed = self.keys.seal_json(
            {"username": username, "password": password}, associated_data=job_id
        )
        await self.store.create_portal_job(
            NewPortalJob(
                job_id=job_id,
                outbox_id=outbox_id,
                user_id=user,
                idempotency_key=f"key-{job_id}",
                fingerprint=self.keys.fingerprint(canonical),
                portal="suwon",
                key_id=sealed.key_id,
                sealed=sealed.ciphertext,
            ),
            now=time.time(),
        )
        return job_id, outbox_id

    async def submit(self, username: str, password: str, user: str = "alice") -> str:
        """Create and publish a job through the relay's request path; the job id."""
        job_id, outbox_id = await self.create(username, password, user)
        relay = Relay(self.store, self.publisher, self.settings.relay, Metrics())
        assert await relay.publish_now(outbox_id)
        return job_id

    async def run_sample_job(self, timeout_s: float = 25) -> tuple[str, JobRecord]:
        """The sample student's job submitted, then waited for until it ends: id and row."""
        job_id = await self.submit(SAMPLE_SNO, SAMPLE_PASSWORD)
        return job_id, await self.wait_status(job_id, *FINAL, timeout_s=timeout_s)

    async def job(self, job_id: str) -> JobRecord:
        job = await self.store.get_job(job_id)
        assert job is not None
        return job

    async def wait_status(self, job_id: str, *statuses: str, timeout_s: float = 25) -> JobRecord:
        async def reached() -> JobRecord | None:
            job = await self.job(job_id)
            return job if job.status in statuses else None

        return await eventually(reached, timeout_s, what=f"job {job_id} {' or '.join(statuses)}")

    async def wait_queue_empty(self, dlq: int = 0) -> None:
        async def empty() -> bool:
            d = await self.queues.depth("jobs")
            return (d.visible, d.in_flight, d.dlq_visible) == (0, 0, dlq)

        await eventually(empty, 15, what=f"the jobs queue to be empty with {dlq} in the DLQ")

    async def close(self) -> None:
        self.stop.set()
        for t in self.tasks:
            # A consumer still running after 15 s is cancelled; its CancelledError must not
            # escape the fixture's teardown (that left later tests of the worker on this
            # test's tmp_path and servers).
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(t, 15)
        for s in self.scrapers:
            await s.close()


RigFactory = Callable[..., Awaitable[Rig]]
