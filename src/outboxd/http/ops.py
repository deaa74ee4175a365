"""Operations routes: liveness, readiness, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from outboxd.http import models
from outboxd.http.deps import OPENAPI_JSON, ApiDeps, deps_of
from outboxd.http.render import pace_model, readiness_model
from outboxd.http.responses import json_response


async def healthz(_request: web.Request) -> web.Response:
    return json_response(models.Health("ok"))


async def readyz(request: web.Request) -> web.Response:
    readiness = readiness_model(await deps_of(request).readiness.check())
    return json_response(readiness, status=200 if readiness.status == "ok" else 503)


async def metrics(request: web.Request) -> web.Response:
    deps = deps_of(request)
    await refresh_gauges(deps)
    body = generate_latest(deps.metrics.registry)
    resp = web.Response(body=body)
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


async def refresh_gauges(deps: ApiDeps) -> None:
    """Row and queue gauges are read at scrape time, so they equal the database's counts."""
    m = deps.metrics
    for check, verdict in (await deps.readiness.check()).items():
        m.ready.labels(check).set(1 if verdict == "ok" else 0)
    stats = await deps.admin.stats()
    m.rows.clear()
    for table, counts in stats.tables.items():
        for status, n in counts.items():
            m.rows.labels(table, status).set(n)
    m.oldest_pending_age.clear()
    for table, age in stats.oldest_pending_age_s.items():
        m.oldest_pending_age.labels(table).set(age or 0.0)
    m.pace_last_slot.clear()
    m.pace_next_slot.clear()
    m.pace_paused_until.clear()
    m.pace_sessions.clear()
    for p in stats.pace:
        pace = pace_model(p)
        m.pace_last_slot.labels(p.name).set(pace.last_slot_at or 0.0)
        m.pace_next_slot.labels(p.name).set(pace.next_slot_at or 0.0)
        m.pace_paused_until.labels(p.name).set(pace.paused_until or 0.0)
        m.pace_sessions.labels(p.name).set(pace.sessions)
    for qname, depth in (stats.queues or {}).items():
        m.queue_depth.labels(qname, "visible").set(depth.visible)
        m.queue_depth.labels(qname, "inFlight").set(depth.in_flight)
        m.queue_depth.labels(qname, "dlq").set(depth.dlq_visible)


async def openapi(request: web.Request) -> web.Response:
    # Encoded once per app: the document never changes while the process runs.
    return web.Response(body=request.app[OPENAPI_JSON], content_type="application/json")
