"""Building responses: JSON bodies encoded by msgspec, and problem+json from an ApiError."""

from __future__ import annotations

from collections.abc import Mapping

from aiohttp import web

from outboxd.http import models
from outboxd.http.deps import REQUEST_ID
from outboxd.http.problems import ApiError


def json_response(
    body: object, status: int = 200, headers: Mapping[str, str] | None = None
) -> web.Response:
    """A JSON response encoded by msgspec (a Struct, or plain dicts and lists)."""
    return web.Response(
        body=models.encode(body), status=status, content_type="application/json", headers=headers
    )


def problem(request: web.Request, err: ApiError) -> web.Response:
    """The problem+json answer for `err`, carrying the request's id."""
    body = models.Problem(
        type=models.PROBLEM_TYPE + err.kind.name,
        title=err.kind.title,
        status=err.status,
        detail=err.detail,
        code=err.kind.code,
        request_id=request.get(REQUEST_ID, ""),
        errors=None
        if err.errors is None
        else [models.FieldError(e["field"], e["message"]) for e in err.errors],
    )
    return web.Response(
        body=models.encode(body),
        status=err.status,
        content_type="application/problem+json",
        headers=err.headers,
    )
