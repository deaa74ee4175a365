"""The SQS consumer: runs portal jobs and tasks, at least once, with idempotent effects.

Rules it keeps, whatever SQS does:
- the message is deleted only after the job's outcome committed;
- a message whose job is already terminal is deleted without running anything;
- one job runs in one place at a time (a lease on the job row, renewed by the
  heartbeat together with the message's visibility);
- a retryable failure leaves the message for redelivery after a backoff; at the
  last allowed receive the job becomes DEAD and SQS moves the message to the DLQ;
- a job whose cancel was requested is not started; one running stops before its next
  portal request (a request in flight may finish) and ends CANCELLED.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import structlog

from outboxd.config import ConsumerSettings, SqsSettings, SuwonScraperSettings
from outboxd.crashpoints import crash_point
from outboxd.errors import InvalidState, SecurityError, StorageError
from outboxd.metrics import Metrics
from outboxd.queue.deletes import CoalescedDeletes, ConsumerQueues, JobDeletesCoalesced
from outboxd.queue.messages import IdField
from outboxd.queue.messages import id_field as _message_id_field  # the one message codec
from outboxd.queue.sqs import QueueError, QueueKind, ReceivedMessage
from outboxd.scrapers.suwon_answers import PortalError
from outboxd.security import KeyRing, Sealed
from outboxd.services.breakers import PROBE, Breakers, Waiting
from outboxd.services.parking import parked_for_another_message
from outboxd.services.portal_logins import LOGIN_LOCKED_ERROR, LoginGuard
from outboxd.services.retries import dead_job_error, job_verdict
from outboxd.services.tasks import Retention, TaskControllerStore
from outboxd.storage.breaker_ports import BreakerStore
from outboxd.storage.login_ports import LoginFailure, LoginLockStore
from outboxd.storage.ports import JobRecord
from outboxd.tracing import NO_TRACING, Tracing, parse_traceparent
from outboxd.workers.dependency_waits import Admission, DependencyWaits
from outboxd.workers.dlq_sweep import DlqQueues, DlqStore, DlqSweep, DlqSweeper, sweep_every
from outboxd.workers.handler_slots import HandlerSlots, until_stopped
from outboxd.workers.login_gate import LoginGate, LoginRun
from outboxd.workers.loops import LoopFailures, backoff, outage_of, sleep_or_stop
from outboxd.workers.prefetch import Prefetch, hand_out, spawner
from outboxd.workers.progress import JobCancelled, ProgressWriter
from outboxd.workers.run_start import start_when_marked
from outboxd.workers.task_runs import TaskRuns

log = structlog.get_logger(__name__)

ProgressCallback = Callable[[str, int, int], Awaitable[None]]
CheckHook = Callable[[], Awaitable[None]]


class PortalClient(Protocol):
    async def fetch_record(
        self,
        username: str,
        password: str,
        progress: ProgressCallback,
        check: CheckHook | None = None,
    ) -> dict[str, Any]: ...


class Receiver(ConsumerQueues, DlqQueues, Protocol):
    pass


class ConsumerStore(DlqStore, LoginLockStore, BreakerStore, TaskControllerStore, Protocol):
    pass


class Consumer:
    def __init__(
        self,
        store: ConsumerStore,
        queues: Receiver,
        portal: PortalClient,
        keys: KeyRing,
        consumer_settings: ConsumerSettings,
        sqs_settings: SqsSettings,
        metrics: Metrics,
        retention: Retention,
        clock: Callable[[], float] = time.time,
        portal_settings: SuwonScraperSettings | None = None,
        storage_probe: Callable[[], Awaitable[None]] | None = None,
        tracing: Tracing = NO_TRACING,
        breakers: Breakers | None = None,
    ) -> None:
        self._store = store
        self._tracing = tracing
        # A job message's delete leaves with others, its handler done (queue/deletes.py).
        self._deletes = CoalescedDeletes.of_jobs(queues, sqs_settings.visibility_timeout_s)
        queues = self._queues = JobDeletesCoalesced(queues, self._deletes)
        self._prefetch = Prefetch(consumer_settings.max_concurrency)  # workers/prefetch.py
        # Every answered receive sets outboxd_consumer_last_receive_timestamp_seconds.
        self._last_receive = metrics.consumer_last_receive
        self._portal = portal
        self._keys = keys
        self._cs = consumer_settings
        self._sqs = sqs_settings
        self._metrics = metrics
        self._clock = clock
        # Separate slot pools: a long poll holds its slots while it waits, so a
        # shared pool would let an idle jobs queue starve the tasks queue. Tasks
        # are maintenance work on a FIFO queue: one at a time is enough.
        self._slots: dict[QueueKind, HandlerSlots] = {
            "jobs": HandlerSlots(consumer_settings.max_concurrency),
            "tasks": HandlerSlots(1),
        }
        self._tasks = TaskRuns(
            store,
            queues,
            clock,
            retention,
            sqs_settings.max_receive_count,
            self._retry_later,
        )
        # The visibility a heartbeat renews to, and the job lease it keeps:
        # never 0, so a heartbeat always has something to extend.
        self._visibility_s = max(1, sqs_settings.visibility_timeout_s)
        # The portal login lock (workers/login_gate.py): a throttled try is held a lease long.
        guard = LoginGuard(
            store, keys, portal_settings or SuwonScraperSettings(), self._visibility_s, clock
        )
        self._gate = LoginGate(guard, store, queues, clock)
        # The portal's breaker (workers/dependency_waits.py): while the portal is away, its
        # jobs wait without spending attempts or receives.
        self._deps = DependencyWaits(
            breakers.portal if breakers is not None else None, store, queues, clock
        )
        self._sqs_off = breakers.sqs.chosen_off if breakers is not None else None
        # Handlers and heartbeats that could not reach the database or SQS: logged as one
        # outage, and while the database is down no message is received (each receive
        # would bring a message one delivery closer to the DLQ for nothing).
        self._failures = LoopFailures("consumer", "handler_infrastructure_error")
        self._storage_probe = storage_probe
        self._probing = asyncio.Lock()

    # ------------------------------------------------------------------ loops

    async def run(self, stop: asyncio.Event) -> None:
        log.info("consumer_started", max_concurrency=self._cs.max_concurrency)
        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(self._receive_loop("jobs", stop, tg))
                tg.create_task(self._receive_loop("tasks", stop, tg))
                tg.create_task(sweep_every(stop, self._cs.dlq_sweep_s, self.sweep_dlq_once))
        finally:
            await self._deletes.close()  # the deletes still waiting leave now
        log.info("consumer_stopped")

    async def _receive_loop(
        self, kind: QueueKind, stop: asyncio.Event, tg: asyncio.TaskGroup
    ) -> None:
        # No jitter: one receive loop per queue and daemon; a few daemons polling SQS again
        # at the same moment is no load worth spreading.
        receive = LoopFailures(f"consumer_{kind}", "receive_failed", base_s=1.0, cap_s=30.0)
        while not stop.is_set():
            if self._failures.outages["storage"].down:
                await self._wait_for_storage(stop)
                continue
            if self._sqs_off is not None and self._sqs_off():  # SQS paused by an operator
                await sleep_or_stop(stop, 0.5)
                continue
            # The free handler slots, and (jobs) the few messages more that this consumer's
            # pace starts within a second (workers/prefetch.py).
            slots = self._slots[kind]
            free = await slots.reserve()
            ask = self._prefetch.ask(free) if kind == "jobs" else free
            try:
                messages = await until_stopped(
                    self._queues.receive(kind, ask, self._sqs.wait_time_s), stop
                )
            except QueueError as exc:
                await slots.release(free)
                await receive.pause(stop, exc, queue=kind)
                continue
            receive.ok()
            if messages is None:  # stopping: nothing was taken
                await slots.release(free)
                break
            self._last_receive.labels(kind).set_to_current_time()  # empty answers too
            await slots.release(free - len(messages))
            start = spawner(tg, functools.partial(self._handle, kind))
            for msg in messages[:free]:
                start(msg)
            if messages[free:]:  # received ahead: each waits for a slot
                await hand_out(
                    self._queues, kind, messages[free:], slots, stop, start, self._visibility_s
                )

    async def _wait_for_storage(self, stop: asyncio.Event) -> None:
        """While the database is down: wait the backoff, then see whether it answers (one
        receive loop looks, the other waits for its verdict)."""
        async with self._probing:
            failures = self._failures
            if not failures.outages["storage"].down or stop.is_set():
                return
            await sleep_or_stop(
                stop, backoff(failures.streak, failures.base_s, failures.cap_s, jitter=False)
            )
            if stop.is_set():
                return
            if self._storage_probe is None:
                failures.ok()  # nothing to look with: the next message will tell
                return
            try:
                await self._storage_probe()
            except StorageError as exc:
                failures.failed(exc)
                return
            failures.ok()

    async def _handle(self, kind: QueueKind, msg: ReceivedMessage) -> None:
        started = time.perf_counter()
        outcome = "error"
        try:
            if kind == "jobs":
                outcome = await self._handle_job(msg)
            else:
                outcome = await self._handle_task(msg)
            self._failures.ok()
        except (QueueError, StorageError) as exc:
            # Nothing is lost: the message comes back after its visibility timeout.
            self._failures.failed(exc, queue=kind, message_id=msg.message_id)
        except Exception as exc:
            log.exception("handler_crashed", queue=kind, message_id=msg.message_id, error=exc)
        finally:
            took_s = time.perf_counter() - started
            if kind == "jobs":  # before the slot frees: the receive it lets go asks by it
                self._prefetch.observe(took_s)
            await asyncio.shield(self._slots[kind].release(1))
            self._metrics.handler_duration.labels(kind, outcome).observe(took_s)

    # ------------------------------------------------------------------ jobs

    async def _handle_job(self, msg: ReceivedMessage) -> str:
        job_id = await self._id_or_retry_later("jobs", msg, "jobId")
        if job_id is None:
            return "malformed"
        # The job's trace goes on here: the message attribute, else (a message sent before
        # attributes were) the job's own, else a trace of this run's own.
        parent = parse_traceparent(msg.attributes.get("traceparent"))
        if parent is None:
            known = await self._store.get_job(job_id)
            parent = known.traceparent if known is not None else None
        attributes = {"outboxd.job_id": job_id, "messaging.message.id": msg.message_id}
        with self._tracing.span("outboxd.consumer.job", parent, "consumer", attributes):
            return await self._run_job(job_id, msg)

    async def _run_job(self, job_id: str, msg: ReceivedMessage) -> str:
        bind = {"job_id": job_id, "message_id": msg.message_id}
        now = self._clock()
        # The lease first: it starts only a QUEUED or RUNNING job whose lease is free (and
        # whose cancel was not requested), so the usual delivery costs one statement; the
        # job is read only when it did not start, to tell a finished job from one held
        # elsewhere.
        # A parked job starts only from the message of the row that parked it (its outbox id).
        outbox_id = _message_id_field(msg.body, "outboxId")
        running, held = await start_when_marked(
            self._store, self._queues, msg, job_id, outbox_id, self._visibility_s, self._clock
        )
        if running is None:
            if held is None or held.terminal:
                status = held.status if held else None
                log.info("message_for_finished_job", status=status, **bind)
                await self._queues.delete("jobs", msg.receipt_handle)
                return "skipped"
            if parked_for_another_message(held, outbox_id):
                # Parked since this message was sent (services/parking.py): the park's own
                # outbox row delivers the job when due; this copy goes unrun.
                log.info("message_for_parked_job", **bind)
                await self._queues.delete("jobs", msg.receipt_handle)
                return "skipped"
            if held.cancel_requested and (held.lease_until or 0) < self._clock():
                # Cancelled while nobody held it (its holder died, or it waited for a
                # retry): it ends here, unrun.
                with contextlib.suppress(InvalidState):  # it finished meanwhile
                    await self._store.cancel_job(job_id, self._clock(), "consumer")
                log.info("job_cancelled", before_run=True, **bind)
                await self._queues.delete("jobs", msg.receipt_handle)
                return "cancelled"
            # Someone else holds the job's lease (a duplicate delivery, or a holder
            # that died and whose lease has not run out): look again when that lease
            # expires, not sooner. Each bounce is a receive, and bouncing on the
            # backoff (0 s allowed) would walk a healthy job's message into the DLQ.
            lease_until = held.lease_until
            wait_s = max(1, math.ceil((lease_until or now) - self._clock()))
            log.info("job_busy_elsewhere", retry_in_s=wait_s, **bind)
            await self._queues.change_visibility("jobs", msg.receipt_handle, min(wait_s, 43_000))
            return "busy"
        admitted = await self._deps.admit(running)
        if isinstance(admitted, Waiting):
            return await self._deps.hold(running, msg.receipt_handle, admitted, bind)
        if admitted != PROBE:
            running = await self._deps.resumed(running)
        log.info("job_started", attempt=running.attempts, receive_count=msg.receive_count, **bind)
        try:
            creds = self._keys.open_json(
                Sealed(running.key_id or "", running.sealed or b""), associated_data=running.id
            )
        except SecurityError as exc:
            await self._finish_failed(running, msg, ("CREDENTIALS_UNREADABLE", str(exc)), bind)
            return "failed"
        # Before the login (workers/login_gate.py): a locked-out user's job fails, a
        # throttled username's waits; the portal sees neither.
        verdict = await self._gate.check(running, str(creds.get("username", "")))
        if verdict is not None and verdict.action == "locked":
            await self._finish_failed(
                running, msg, LOGIN_LOCKED_ERROR, bind, locked_until=verdict.until
            )
            return "failed"
        if verdict is not None and verdict.action == "wait":
            return await self._gate.park(running, msg.receipt_handle, verdict, bind)
        login = LoginRun(verdict)
        try:
            return await self._run_portal(running, msg, creds, login, bind, admitted)
        finally:
            await self._gate.give_back(login, running)

    async def _run_portal(
        self,
        running: JobRecord,
        msg: ReceivedMessage,
        creds: Mapping[str, Any],
        login: LoginRun,
        bind: Mapping[str, Any],
        admitted: Admission = None,
    ) -> str:
        job_id = running.id
        state = _RunState(running)
        # At most one progress write per interval; held steps go with the next write
        # (workers/progress.py).
        progress = ProgressWriter(
            self._store, lambda: state.job, self._clock, self._cs.progress_interval_s
        )

        async def check() -> None:
            """Before each portal request: has the job's cancel been requested?"""
            try:
                current = await self._store.get_job(job_id)
            except StorageError:
                return  # the database is out of reach: the run goes on
            if current is not None and (current.cancel_requested or current.status == "CANCELLED"):
                raise JobCancelled()

        heartbeat = asyncio.create_task(self._heartbeat("jobs", msg, state))
        try:
            crash_point("during_handler")
            result = await self._portal.fetch_record(
                str(creds.get("username", "")), str(creds.get("password", "")), progress.step, check
            )
        except JobCancelled:
            await _end(heartbeat, state, progress)
            return await self._cancelled(state.job, msg, bind)
        except PortalError as exc:
            await _end(heartbeat, state, progress)
            if exc.outage:
                waits = await self._deps.outage(exc.message, state.job, admitted)
                if waits is not None:  # the portal is away: the job waits, spending nothing
                    return await self._deps.hold(state.job, msg.receipt_handle, waits, bind)
            else:
                await self._deps.through()
            login_failure = None
            if exc.code == "PORTAL_AUTH_FAILED":
                login_failure = login.failure(self._gate, running)
            return await self._after_failure(
                state.job, msg, (exc.code, exc.message), exc.retryable, bind, login_failure
            )
        except asyncio.CancelledError:
            await _end(heartbeat, state, progress)
            # Shutdown past its deadline: give the job back at once.
            await asyncio.shield(self._release_job(state.job, msg))
            raise
        except Exception as exc:
            await _end(heartbeat, state, progress)
            log.exception("handler_error", error=exc, **bind)
            return await self._after_failure(
                state.job, msg, ("HANDLER_ERROR", f"{type(exc).__name__}"), True, bind
            )
        await _end(heartbeat, state)
        held = await progress.settle()  # written with the outcome, in its statement
        await self._deps.through()
        if admitted == PROBE:
            state.job = await self._deps.resumed(state.job)
        crash_point("after_handler_before_commit")
        # A successful login forgets the username's counts, in the outcome's transaction.
        finished = await asyncio.shield(
            self._store.finish_job(
                state.job,
                "SUCCEEDED",
                self._clock(),
                result=result,
                login_success=login.success(),
                progress=held,
            )
        )
        if finished is None:
            log.warning("job_outcome_lost_race", **bind)
            return "raced"
        crash_point("after_handler_before_delete")
        log.info("job_succeeded", attempts=finished.attempts, **bind)
        await self._queues.delete("jobs", msg.receipt_handle)
        return "succeeded"

    async def _finish_failed(
        self,
        job: JobRecord,
        msg: ReceivedMessage,
        error: tuple[str, str],
        bind: Mapping[str, Any],
        login_failure: LoginFailure | None = None,
        locked_until: float | None = None,
    ) -> None:
        finished = await asyncio.shield(
            self._store.finish_job(
                job,
                "FAILED",
                self._clock(),
                error=error,
                login_failure=login_failure,
                locked_until=locked_until,
            )
        )
        log.warning("job_failed", error_code=error[0], error=error[1], **bind)
        if finished is not None:
            await self._queues.delete("jobs", msg.receipt_handle)

    async def _cancelled(
        self, job: JobRecord, msg: ReceivedMessage, bind: Mapping[str, Any]
    ) -> str:
        """The run stopped for a cancel: CANCELLED, then the message deleted (also when the
        API cancelled the job itself meanwhile); left alone when another run holds it."""
        done = await asyncio.shield(self._store.finish_cancelled(job, self._clock()))
        if done is None:
            current = await self._store.get_job(job.id)
            if current is None or not current.terminal:
                log.warning("job_outcome_lost_race", **bind)
                return "raced"
        log.info("job_cancelled", before_run=False, **bind)
        await self._queues.delete("jobs", msg.receipt_handle)
        return "cancelled"

    async def _cancel_requested(self, job: JobRecord) -> bool:
        with contextlib.suppress(StorageError):
            current = await self._store.get_job(job.id)
            return current is not None and current.cancel_requested
        return False

    async def _after_failure(
        self,
        job: JobRecord,
        msg: ReceivedMessage,
        error: tuple[str, str],
        retryable: bool,
        bind: Mapping[str, Any],
        login_failure: LoginFailure | None = None,
    ) -> str:
        """Carry out what services/retries.py decides for a failed run. A run whose cancel
        was requested meanwhile ends CANCELLED rather than retried or DEAD; a final failure
        (a rejected login, which the login lock must count) stays FAILED."""
        verdict = job_verdict(retryable, msg.receive_count, self._sqs.max_receive_count)
        if verdict != "failed" and await self._cancel_requested(job):
            return await self._cancelled(job, msg, bind)
        if verdict == "failed":
            # A rejected login counts toward the lock in the transaction of the outcome.
            await self._finish_failed(job, msg, error, bind, login_failure)
            return "failed"
        if verdict == "dead":
            dead = await asyncio.shield(
                self._store.mark_job_dead(job.id, dead_job_error(*error), self._clock())
            )
            if dead is not None:
                self._metrics.dead.labels("jobs").inc()
            log.error(
                "job_dead",
                error_code=error[0],
                error=error[1],
                receive_count=msg.receive_count,
                **bind,
            )
            # Visible again at once: the next receive moves it to the DLQ.
            await self._queues.change_visibility("jobs", msg.receipt_handle, 0)
            return "dead"
        delay = self._retry_delay(msg)
        await asyncio.shield(self._store.job_retry_later(job, error, self._clock(), delay))
        await self._queues.change_visibility("jobs", msg.receipt_handle, delay)
        log.warning(
            "job_retry_scheduled",
            error_code=error[0],
            error=error[1],
            receive_count=msg.receive_count,
            delay_s=delay,
            **bind,
        )
        return "retry"

    async def _id_or_retry_later(
        self, kind: QueueKind, msg: ReceivedMessage, field: IdField
    ) -> str | None:
        """The message's row id; None for a malformed message, which is never deleted: it
        ends in the DLQ for a human, as SQS intends."""
        row_id = _message_id_field(msg.body, field)
        if row_id is None:
            log.error("message_malformed", queue=kind, message_id=msg.message_id)
            await self._retry_later(kind, msg)
        return row_id

    def _retry_delay(self, msg: ReceivedMessage) -> int:
        # No jitter: the slot pool and the portal's own pacing already queue a burst of
        # retries, and an exact delay keeps receive count x delay (the road to the DLQ)
        # predictable. 43,000 s stays under SQS's 12-hour visibility ceiling.
        return int(backoff(msg.receive_count, self._cs.backoff_base_s, 43_000, jitter=False))

    async def _retry_later(self, kind: QueueKind, msg: ReceivedMessage) -> int:
        delay = self._retry_delay(msg)
        await self._queues.change_visibility(kind, msg.receipt_handle, delay)
        return delay

    async def _release_job(self, job: JobRecord, msg: ReceivedMessage) -> None:
        with contextlib.suppress(StorageError):
            await self._store.release_job_lease(job, self._clock())
        with contextlib.suppress(QueueError):
            await self._queues.change_visibility("jobs", msg.receipt_handle, 0)
        log.info("job_released", job_id=job.id, message_id=msg.message_id)

    async def _heartbeat(self, kind: QueueKind, msg: ReceivedMessage, state: _RunState) -> None:
        while state.beating:
            await asyncio.sleep(self._cs.heartbeat_s)
            if not state.beating:
                break
            try:
                await self._queues.change_visibility(kind, msg.receipt_handle, self._visibility_s)
                await self._store.extend_job_lease(state.job, self._clock() + self._visibility_s)
            except (QueueError, StorageError) as exc:
                if outage_of(exc) is None:
                    log.warning("heartbeat_failed", message_id=msg.message_id, error=exc)
                else:
                    self._failures.failed(exc, message_id=msg.message_id)

    # ------------------------------------------------------------------ tasks

    async def _handle_task(self, msg: ReceivedMessage) -> str:
        task_id = await self._id_or_retry_later("tasks", msg, "taskId")
        if task_id is None:
            return "malformed"
        return await self._tasks.run(task_id, msg)  # workers/task_runs.py

    async def sweep_dlq_once(self) -> DlqSweep:
        """One pass over both DLQs (workers/dlq_sweep.py)."""
        return await DlqSweeper(self._queues, self._store, self._metrics, self._clock).sweep()


@dataclass
class _RunState:
    job: JobRecord
    # Cleared when the handler ends the heartbeat: a cancellation swallowed on the way
    # (wait_for on Python 3.11 can) must not keep it beating, and the handler waiting.
    beating: bool = True


async def _end(
    heartbeat: asyncio.Task[Any], state: _RunState, progress: ProgressWriter | None = None
) -> None:
    """Stop a job's heartbeat: cancelled now, and in any case gone by its next beat. With
    `progress` (a run that does not end in `finish_job(progress=...)`): the steps it still
    holds are written first, so the timeline keeps them."""
    state.beating = False
    heartbeat.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await heartbeat
    if progress is not None:
        await asyncio.shield(progress.flush())
