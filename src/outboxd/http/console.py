"""The operator console: static pages at /ui/, read once and served from memory.

The pages are plain HTML, CSS and hand-written JavaScript shipped in the package
(`http/ui/`); no build step, nothing from another origin. They read and act
through the API only (the admin routes, and a job's own routes, which an admin may
call on any job), with the operator's bearer token, so the console adds no second
back end and no cookie (hence no CSRF). They wait on held requests (`Prefer: wait`)
rather than poll. Every response under /ui/ carries
a Content-Security-Policy that allows scripts, styles and requests from the
daemon's own origin only, and no inline script or style. The routes are entries of
the route table (http/routes.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import cache
from importlib import resources

from aiohttp import web

CONSOLE_PREFIX = "/ui/"
ASSETS = {
    "/ui/assets/app.js": ("app.js", "text/javascript"),
    "/ui/assets/app.css": ("app.css", "text/css"),
}
# Where a person's browser lands: the console (the root and /ui have no page of their own).
REDIRECTS = {"/": "/ui/", "/ui": "/ui/"}
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; font-src 'self'; object-src 'none'; base-uri 'none'; "
    "form-action 'self'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cache-Control": "no-cache",
}
# What the document promises on every console file.
HEADER_NAMES = ("Content-Security-Policy", "X-Content-Type-Options", "Referrer-Policy")

Handler = Callable[[web.Request], Awaitable[web.Response]]


@cache
def _read(name: str) -> bytes:
    return resources.files("outboxd.http").joinpath("ui", name).read_bytes()


def _static(name: str, content_type: str) -> Handler:
    async def handler(_request: web.Request) -> web.Response:
        resp = web.Response(body=_read(name), headers=SECURITY_HEADERS)
        resp.content_type = content_type
        resp.charset = "utf-8"
        return resp

    return handler


# Every page is the same document; its script picks the view from the path.
page = _static("index.html", "text/html")


def asset(path: str) -> Handler:
    name, content_type = ASSETS[path]
    return _static(name, content_type)


def redirect(path: str) -> Handler:
    """302 to where REDIRECTS sends `path` (not permanent: a browser asks again next time)."""
    target = REDIRECTS[path]

    async def handler(_request: web.Request) -> web.Response:
        # Returned, not raised: the edge then adds X-Request-Id as to every answer.
        return web.Response(status=302, headers={"Location": target})

    return handler


async def no_icon(_request: web.Request) -> web.Response:
    """/favicon.ico, which browsers ask every origin for: nothing (the console's icon is in
    its page), and no 404 in the log or the browser's console."""
    return web.Response(status=204)


def is_console_path(path: str) -> bool:
    """A path whose every answer (pages, assets, errors) carries SECURITY_HEADERS."""
    return path.startswith(CONSOLE_PREFIX) or path == CONSOLE_PREFIX[:-1]
