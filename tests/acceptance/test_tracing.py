"""Trace context with `outboxd serve` subprocesses on both backends:

- a `traceparent` on POST /v1/portal-link-jobs is kept with the job and sent with its SQS
  message as a message attribute; an invalid one is ignored and a trace of the daemon's
  own started;
- the log lines about the job (API, relay, consumer) carry its trace_id, and a line that names
  a request (its request_id) is about that request's job alone: work a request starts for many,
  such as a dispatch batch, logs as none of them;
- with OTEL_EXPORTER_OTLP_ENDPOINT set, the API, relay and consumer spans reach an OTLP/HTTP
  receiver (an aiohttp server on 127.0.0.1 here, decoding the protobuf), in the caller's trace.
"""

from __future__ import annotations

import asyncio
import gzip
import secrets
import zlib
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from aiohttp import web
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from testkit.daemon import DaemonProcess
from testkit.moto import MotoServer

from tests.acceptance.conftest import (
    ConfigFactory,
    DaemonFactory,
    db_rows,
    http_request,
)
from tests.acceptance.jobs import wait_terminal
from tests.support.api import keyed
from tests.support.loop_thread import LoopThread
from tests.support.sqs import queues_named

pytestmark = pytest.mark.slow

LINK = {"portal": "suwon", "username": "20201234", "password": "correct-horse"}


def new_traceparent() -> tuple[str, str, str]:
    trace_id, span_id = secrets.token_hex(16), secrets.token_hex(8)
    return f"00-{trace_id}-{span_id}-01", trace_id, span_id


def post(base: str, key: str, traceparent: str | None) -> str:
    headers = keyed(key, "traceparent", traceparent)
    resp = http_request("POST", f"{base}/v1/portal-link-jobs", LINK, headers=headers)
    assert resp.status == 202, resp.text
    job_id: str = resp.json()["jobId"]
    return job_id


def one_traced_job(daemon: DaemonProcess, base: str, key: str) -> tuple[str, str, str]:
    """A job posted with a trace of the caller's, run to SUCCEEDED, then the daemon stopped
    (which flushes what it buffered): the job id, the trace id, the caller's span id."""
    tp, trace_id, span_id = new_traceparent()
    job_id = post(base, key, tp)
    assert wait_terminal(base, job_id)["status"] == "SUCCEEDED"
    assert daemon.terminate() == 0
    return job_id, trace_id, span_id


async def receive_one(endpoint_url: str, queue_names: dict[str, str]) -> tuple[str, dict[str, str]]:
    async with queues_named(endpoint_url, queue_names) as queues:
        for _ in range(10):
            got = await queues.receive("jobs", 1, 1)
            if got:
                return got[0].body, dict(got[0].attributes)
    raise AssertionError("no message on the jobs queue")


def test_the_trace_goes_with_the_job_to_sqs_and_an_invalid_one_is_replaced(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    moto_server: MotoServer,
    queue_names: dict[str, str],
    db_url: str,
) -> None:
    # No consumer: the message stays on the queue, to be read here.
    daemon = spawn_daemon(pipeline_config(daemon={"roles": ["api", "relay"]}))
    base = daemon.start()
    tp, trace_id, span_id = new_traceparent()
    job_id = post(base, "tr-1", tp)
    body, attributes = asyncio.run(receive_one(moto_server.endpoint_url, queue_names))
    assert job_id in body
    carried = attributes["traceparent"]
    # The caller's trace, continued by the API's own span (a new span id).
    assert carried.split("-")[1] == trace_id and carried.split("-")[2] != span_id
    stored = db_rows(db_url, "SELECT traceparent FROM jobs WHERE id = ?", job_id)
    assert stored == [{"traceparent": carried}]
    lines = [e for e in daemon.events() if e.get("job_id") == job_id]
    assert {"job_accepted", "outbox_sent"} <= {e["event"] for e in lines}
    assert {e.get("trace_id") for e in lines} == {trace_id}, lines

    # Invalid: ignored (no 400), and the job gets a trace of the daemon's own.
    for i, bad in enumerate(
        (
            "garbage",
            f"00-{'0' * 32}-{span_id}-01",  # all-zero trace id
            f"ff-{trace_id}-{span_id}-01",  # version ff
            tp.upper(),  # upper-case hex
            tp + "-extra",  # version 00 has four fields
        )
    ):
        other = post(base, f"tr-bad-{i}", bad)
        [row] = db_rows(db_url, "SELECT traceparent FROM jobs WHERE id = ?", other)
        assert row["traceparent"] and row["traceparent"].split("-")[1] != trace_id, bad
    no_header = post(base, "tr-none", None)
    [row] = db_rows(db_url, "SELECT traceparent FROM jobs WHERE id = ?", no_header)
    assert len(row["traceparent"]) == 55
    assert daemon.terminate() == 0


def test_a_line_that_names_a_request_is_about_that_requests_job_alone(
    pipeline_config: ConfigFactory, spawn_daemon: DaemonFactory
) -> None:
    # Requests arriving together share SendMessageBatch calls. The batch's `outbox_sent` line
    # lists every job in it: it must not carry the request_id of whichever request started it.
    daemon = spawn_daemon(pipeline_config(daemon={"roles": ["api", "relay"]}))
    base = daemon.start()

    def one(i: int) -> tuple[str, str]:
        request_id = f"batch-req-{i:03d}"
        headers = {**keyed(f"batch-{i}", "X-Request-Id", request_id)}
        resp = http_request("POST", f"{base}/v1/portal-link-jobs", LINK, headers=headers)
        assert resp.status == 202, resp.text
        return request_id, str(resp.json()["jobId"])

    with ThreadPoolExecutor(16) as pool:
        job_of = dict(pool.map(one, range(48)))
    assert daemon.terminate() == 0
    events = daemon.events()
    shared = [e for e in events if e.get("event") == "outbox_sent" and e.get("count", 1) > 1]
    assert shared, "no two requests shared a batch: this test saw nothing to check"
    named_requests = 0
    for e in events:
        request_id = e.get("request_id")
        if request_id in job_of:
            named_requests += 1
            jobs = {e.get("job_id"), *e.get("job_ids", [])} - {None}
            assert jobs <= {job_of[request_id]}, e
    # Each request's own lines (job_accepted, http_request) still name it.
    assert named_requests >= 2 * len(job_of)


class OtlpReceiver:
    """OTLP/HTTP on 127.0.0.1: POST /v1/traces, protobuf ExportTraceServiceRequest."""

    def __init__(self) -> None:
        self.spans: list[dict[str, Any]] = []
        self.requests = 0
        self._runner: web.AppRunner | None = None
        self.port = 0

    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/v1/traces", self._traces)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        server = site._server
        assert server is not None
        self.port = server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()

    async def _traces(self, request: web.Request) -> web.Response:
        raw = await request.read()
        encoding = request.headers.get("Content-Encoding", "")
        if encoding == "gzip":
            raw = gzip.decompress(raw)
        elif encoding == "deflate":
            raw = zlib.decompress(raw)
        message = trace_service_pb2.ExportTraceServiceRequest()
        message.ParseFromString(raw)
        self.requests += 1
        for resource_spans in message.resource_spans:
            service = {a.key: a.value.string_value for a in resource_spans.resource.attributes}.get(
                "service.name"
            )
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        {
                            "name": span.name,
                            "trace_id": span.trace_id.hex(),
                            "span_id": span.span_id.hex(),
                            "parent_span_id": span.parent_span_id.hex(),
                            "service": service,
                            "attributes": {a.key: a.value for a in span.attributes},
                        }
                    )
        reply = trace_service_pb2.ExportTraceServiceResponse()
        return web.Response(body=reply.SerializeToString(), content_type="application/x-protobuf")


@pytest.fixture
def otlp() -> Iterator[tuple[OtlpReceiver, LoopThread]]:
    lt = LoopThread()
    receiver = OtlpReceiver()
    lt.run(receiver.start())
    try:
        yield receiver, lt
    finally:
        lt.run(receiver.stop())
        lt.close()


OtlpDaemon = tuple[DaemonProcess, OtlpReceiver, LoopThread]


@pytest.fixture
def otlp_daemon(
    pipeline_config: ConfigFactory,
    spawn_daemon: DaemonFactory,
    otlp: tuple[OtlpReceiver, LoopThread],
) -> OtlpDaemon:
    """A pipeline daemon, not started yet, beside an OTLP receiver and its loop."""
    return (spawn_daemon(pipeline_config()), *otlp)


def test_spans_of_the_api_relay_and_consumer_reach_the_otlp_receiver(
    otlp_daemon: OtlpDaemon,
) -> None:
    daemon, receiver, lt = otlp_daemon
    base = daemon.start(
        extra_env={
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{receiver.port}",
            "OTEL_BSP_SCHEDULE_DELAY": "200",
            "OTEL_SERVICE_NAME": "outboxd-test",
        }
    )
    job_id, trace_id, span_id = one_traced_job(daemon, base, "otel-1")
    spans = lt.call(lambda: list(receiver.spans))
    ours = [s for s in spans if s["trace_id"] == trace_id]
    names = {s["name"] for s in ours}
    assert {"POST /v1/portal-link-jobs", "outboxd.relay.publish", "outboxd.consumer.job"} <= names
    assert {s["service"] for s in ours} == {"outboxd-test"}
    [api] = [s for s in ours if s["name"] == "POST /v1/portal-link-jobs"]
    assert api["parent_span_id"] == span_id  # a child of the caller's span
    # The relay's and the consumer's spans hang off the API's (the job's trace context).
    for s in ours:
        if s["name"] in ("outboxd.relay.publish", "outboxd.consumer.job"):
            assert s["parent_span_id"] == api["span_id"], s
    consumer = next(s for s in ours if s["name"] == "outboxd.consumer.job")
    assert consumer["attributes"]["outboxd.job_id"].string_value == job_id
    # The worker's log lines about the job carry the same trace id.
    lines = [e for e in daemon.events() if e.get("job_id") == job_id]
    assert {"job_started", "job_succeeded"} <= {e["event"] for e in lines}
    assert {e.get("trace_id") for e in lines} == {trace_id}


def test_without_an_endpoint_no_span_is_sent(otlp_daemon: OtlpDaemon) -> None:
    daemon, receiver, lt = otlp_daemon
    base = daemon.start()
    job_id, trace_id, _ = one_traced_job(daemon, base, "otel-off")
    assert lt.call(lambda: receiver.requests) == 0
    lines = [e for e in daemon.events() if e.get("job_id") == job_id]
    assert {e.get("trace_id") for e in lines} == {trace_id}
