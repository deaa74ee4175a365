"""The dependencies' admin routes: each outside system's state, and an operator's pause
(with a reason, and an end or none) and resume. The actions, their log lines with the
acting user and the release of held work are services/breakers.py's, shared with
`outboxd pause` and `outboxd resume`."""

from __future__ import annotations

import time
from typing import Any, cast

from aiohttp import web

from outboxd.http import checks, dependency_models, inputs
from outboxd.http.deps import AUDIT_REASON, deps_of, principal_of
from outboxd.http.problems import NOT_FOUND, ApiError, field_error
from outboxd.http.render import iso
from outboxd.http.responses import json_response
from outboxd.metrics import DEPENDENCIES
from outboxd.services.breakers import Breakers, DependencyView

_PAUSE_FIELDS = checks.wire_names(dependency_models.PauseRequest)
_check_pause = checks.check_text_fields(dependency_models.PauseRequest, ("reason",))
# The longest pause with an end: a year (a longer one is a pause until resumed).
MAX_PAUSE_S = 31_536_000.0


def dependency_model(v: DependencyView) -> dependency_models.Dependency:
    return dependency_models.Dependency(
        name=cast(Any, v.name),
        state=v.state,
        since=iso(v.since),
        until=iso(v.until),
        reason=v.reason,
        paused_by=v.paused_by,
        failures_in_a_row=v.failures_in_a_row,
        last_error=v.last_error,
        last_probe_at=iso(v.last_probe_at),
        waiting=v.waiting,
    )


def _breakers(request: web.Request) -> Breakers:
    breakers = deps_of(request).breakers
    assert breakers is not None  # build_api_deps always sets it
    return breakers


def _name(request: web.Request) -> str:
    name = request.match_info["name"]
    if name not in DEPENDENCIES:
        raise ApiError(NOT_FOUND, f"no such dependency (known: {', '.join(DEPENDENCIES)})")
    return name


async def list_dependencies(request: web.Request) -> web.Response:
    inputs.only_query(request, set())
    views = await _breakers(request).views()
    return json_response(dependency_models.DependencyList([dependency_model(v) for v in views]))


def pause_end(body: dict[str, Any], now: float) -> float | None:
    """The end a pause body asks for: `forS` seconds from now, `until`, or None (until
    resumed); at most one of them."""
    for_s, until = body.get("forS"), body.get("until")
    if for_s is not None and until is not None:
        raise field_error("until", "give at most one of forS and until")
    if for_s is not None:
        if isinstance(for_s, bool) or not isinstance(for_s, int | float):
            raise field_error("forS", "must be a number of seconds")
        if not 0 < for_s <= MAX_PAUSE_S:
            raise field_error("forS", f"must be more than 0 and at most {MAX_PAUSE_S:.0f}")
        return now + float(for_s)
    if until is not None:
        if not isinstance(until, str):
            raise field_error("until", "must be an RFC 3339 date-time")
        # An end already past pauses nothing (the pause is lifted at once).
        return inputs.parse_time("until", until)
    return None


async def pause_dependency(request: web.Request) -> web.Response:
    name = _name(request)
    deps = deps_of(request)
    body = await inputs.read_json_object(request, deps.settings.server.max_body_bytes)
    inputs.check_fields(body, _PAUSE_FIELDS)
    reason = cast(str, _check_pause(body)["reason"])
    request[AUDIT_REASON] = reason
    until = pause_end(body, time.time())
    view = await _breakers(request).pause(name, reason, until, principal_of(request).user)
    return json_response(dependency_model(view))


async def resume_dependency(request: web.Request) -> web.Response:
    name = _name(request)
    view = await _breakers(request).resume(name, principal_of(request).user)
    return json_response(dependency_model(view))
