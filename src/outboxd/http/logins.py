"""The portal login lock's admin routes: who caused which lock, and the unlock (the
actions themselves, and their log line with the acting user, are in
services/portal_logins.py, shared with `outboxd portal unlock`)."""

from __future__ import annotations

from typing import cast

from aiohttp import web

from outboxd.http import checks, inputs, login_models
from outboxd.http.deps import AUDIT_TARGET, deps_of, principal_of
from outboxd.http.problems import field_error
from outboxd.http.render import iso
from outboxd.http.responses import json_response
from outboxd.services.portal_logins import UsernameLock

_UNLOCK_FIELDS = checks.wire_names(login_models.PortalLoginUnlockRequest)
_check_unlock = checks.check_text_fields(login_models.PortalLoginUnlockRequest, ("username",))


def login_model(lock: UsernameLock) -> login_models.PortalLogin:
    return login_models.PortalLogin(
        subject=lock.subject,
        failures=lock.failures,
        users=[
            login_models.PortalLoginUser(u.user_id, u.failures, iso(u.locked_until))
            for u in lock.users
        ],
        throttled=lock.throttled,
        next_try_at=iso(lock.next_try_at),
        locked_until=iso(lock.locked_until),
    )


async def list_portal_logins(request: web.Request) -> web.Response:
    inputs.only_query(request, {"locked", "limit"})
    deps = deps_of(request)
    text = inputs.query_text(request, "locked", 8)
    if text not in (None, "true", "false"):
        raise field_error("locked", "must be true or false")
    locked = None if text is None else text == "true"
    found = await deps.logins.usernames(locked, inputs.query_limit(request))
    return json_response(login_models.PortalLoginPage([login_model(u) for u in found]))


async def unlock_portal_login(request: web.Request) -> web.Response:
    deps = deps_of(request)
    body = await inputs.read_json_object(request, deps.settings.server.max_body_bytes)
    inputs.check_fields(body, _UNLOCK_FIELDS)
    username = cast(str, _check_unlock(body)["username"])
    # The audit log names the username by its keyed hash, never as written.
    request[AUDIT_TARGET] = deps.logins.subject(username)
    subject, cleared = await deps.logins.unlock(username, actor=principal_of(request).user)
    return json_response(login_models.PortalLoginUnlocked(subject, cleared))
