"""`trim_middleware_chain`: once the app is set up, aiohttp's `_fix_request_current_app` is
dropped from a chain with no sub-applications (docs/decisions/0038-held-waits-cost-little.md),
and `request.app` is still the app; with a sub-application the chain is left as it is."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from outboxd.http.app import trim_middleware_chain


@web.middleware
async def tagging(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    response = await handler(request)
    response.headers["X-Through"] = "tagging"
    return response


def an_app() -> web.Application:
    app = web.Application(middlewares=[tagging])

    async def which(request: web.Request) -> web.Response:
        return web.Response(text=str(request.app is app))

    app.router.add_get("/", which)
    return app


async def test_the_current_app_fix_is_dropped_and_the_app_still_answers() -> None:
    app = an_app()
    async with TestClient(TestServer(app)) as client:
        assert len(app._middlewares_handlers or ()) == 2
        trim_middleware_chain(app)
        assert [m for m, _ in app._middlewares_handlers or ()] == [tagging]
        resp = await client.get("/")
        assert resp.status == 200 and await resp.text() == "True"
        assert resp.headers["X-Through"] == "tagging"


async def test_a_chain_with_a_sub_application_is_left_as_it_is() -> None:
    app = an_app()
    app.add_subapp("/sub", web.Application())
    async with TestClient(TestServer(app)):
        before = app._middlewares_handlers
        trim_middleware_chain(app)
        assert app._middlewares_handlers == before
