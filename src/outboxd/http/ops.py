"""Operations routes: liveness, readiness, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from outboxd.http import models
from outboxd.http.deps import OPENAPI_JSON, ApiDeps, deps_of
from outboxd.http.responses import json_response


async def healthz(_request: web.Request) -> web.Response:
    return json_response(models.Health("ok"))


async def readyz(request: web.Request) -> web.Response:
    checks = await deps_of(request).readiness.check()
    ok = all(v == "ok" for v in checks.values())
    return json_response(
        {"status": "ok" if ok else "unavailable", "checks": checks}, status=200 if ok else 503
    )


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
    for table, counts in stats["tables"].items():
        for status, n in counts.items():
            m.rows.labels(table, status).set(n)
    m.oldest_pending_age.clear()
    for table, age in stats["oldestPendingAgeSeconds"].items():
        m.oldest_pending_age.labels(table).set(age or 0.0)
    m.pace_last_slot.clear()
    m.pace_next_slot.clear()
    m.pace_paused_until.clear()
    m.pace_sessions.clear()
    for name, pace in stats["pace"].items():
        m.pace_last_slot.labels(name).set(pace["lastSlotAt"] or 0.0)
        m.pace_next_slot.labels(name).set(pace["nextSlotAt"] or 0.0)
        m.pace_paused_until.labels(name).set(pace["pausedUntil"] or 0.0)
        m.pace_sessions.labels(name).set(pace["sessions"])
    queues = stats.get("queues")
    if isinstance(queues, dict) and "error" not in queues:
        for qname, depth in queues.items():
            for state, n in depth.items():
                m.queue_depth.labels(qname, state).set(n)


async def openapi(request: web.Request) -> web.Response:
    # Encoded once per app: the document never changes while the process runs.
    return web.Response(body=request.app[OPENAPI_JSON], content_type="application/json")
