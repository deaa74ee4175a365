"""Conditional and held reads: entity tags, `If-None-Match`, `Prefer: wait`.

A job (`GET /v1/jobs/{id}`, http/jobs.py) and the views of many jobs (the admin listing and
the stats, http/admin.py) answer the same way: an ETag on every answer, 304 while the
client's tag is current, and with `Prefer: wait=N` a request held (services/job_waits.py)
until the body changes or N seconds pass.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable

from aiohttp import web

from outboxd.http import inputs
from outboxd.http.deps import deps_of, principal_of

# A body and its entity tag (the tag's opaque part).
Encoded = tuple[bytes, str]


def digest(body: bytes) -> str:
    """An entity tag for exactly these bytes."""
    return hashlib.blake2b(body, digest_size=12).hexdigest()


def matches(tags: list[str] | None, etag: str) -> bool:
    return tags is not None and ("*" in tags or etag in tags)


def tagged(
    body: bytes,
    etag: str,
    status: int = 200,
    applied: int | None = None,
    weak: bool = False,
    refused: bool = False,
) -> web.Response:
    """The answer with its ETag (and Preference-Applied when a wait was applied).

    `refused`: a wait was asked for and not applied (api.max_waiters or the user's share
    held already, or stopping). The connection is closed after the answer, so a client
    asking for more waits than it may cannot keep the refused ones' connections open and
    fill server.max_connections that way (docs/decisions/0030-per-user-bounds.md)."""
    headers = {"ETag": f'{"W/" if weak else ""}"{etag}"'}
    if applied is not None:
        headers["Preference-Applied"] = f"wait={applied}"
    if status == 304:
        resp = web.Response(status=304, headers=headers)
    else:
        resp = web.Response(
            body=body, status=status, content_type="application/json", headers=headers
        )
    if refused:
        resp.force_close()
    return resp


async def held_view(
    request: web.Request, key: str, read: Callable[[], Awaitable[Encoded]], weak: bool = False
) -> web.Response:
    """A view of many jobs: 304 when If-None-Match names its current tag; with `Prefer:
    wait=N` and If-None-Match, held until a job's change alters the view (200, the new tag)
    or N seconds pass (304). `key` names everything `read` depends on (holds of one key
    share their reads)."""
    deps = deps_of(request)
    tags = inputs.if_none_match(request)
    wait_s = inputs.prefer_wait(request, deps.settings.api.max_wait_s)
    if wait_s is None or tags is None or deps.waits is None:
        body, etag = await read()
        return tagged(body, etag, 304 if matches(tags, etag) else 200, weak=weak)
    # The hold is taken before the read: a change committed after the read still wakes it.
    async with deps.waits.hold_view(key, principal_of(request).user, read) as hold:
        body, etag = await read()
        if hold is None:  # api.max_waiters (or the user's share) held, or stopping: no wait
            return tagged(body, etag, 304 if matches(tags, etag) else 200, weak=weak, refused=True)
        if not matches(tags, etag):  # stale: the client has not seen this body
            return tagged(body, etag, applied=wait_s, weak=weak)
        ending, (new_body, new_etag) = await hold.until(lambda v: v[1] != etag, wait_s)
    if new_etag == etag and ending != "stopped":
        return tagged(new_body, new_etag, 304, applied=wait_s, weak=weak)
    return tagged(new_body, new_etag, applied=wait_s, weak=weak)
