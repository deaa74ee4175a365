"""Operations routes: liveness, readiness, Prometheus metrics and the OpenAPI document."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from outboxd.http import models
from outboxd.http.deps import OPENAPI_JSON, deps_of
from outboxd.http.render import readiness_model
from outboxd.http.responses import json_response


async def healthz(_request: web.Request) -> web.Response:
    return json_response(models.Health("ok"))


async def readyz(request: web.Request) -> web.Response:
    readiness = readiness_model(await deps_of(request).readiness.check())
    return json_response(readiness, status=200 if readiness.status == "ok" else 503)


async def metrics(request: web.Request) -> web.Response:
    """Always 200: the database and SQS gauges are refreshed within a short timeout (shared
    by concurrent scrapes, at most every metrics.refresh_s) or shown stale (services/gauges.py)."""
    deps = deps_of(request)
    await deps.gauges.refresh()
    body = generate_latest(deps.metrics.registry)
    resp = web.Response(body=body)
    resp.content_type = CONTENT_TYPE_LATEST.split(";")[0]
    resp.charset = "utf-8"
    return resp


async def openapi(request: web.Request) -> web.Response:
    # Encoded once per app: the document never changes while the process runs.
    return web.Response(body=request.app[OPENAPI_JSON], content_type="application/json")
