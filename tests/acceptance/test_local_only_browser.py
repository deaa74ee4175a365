"""Auth-off mode (no [[auth.tokens]]) against a real browser: Debian's chromium driven by
Playwright, the daemon's real listener (tests/support/live_api.py), both backends.

- A page of another loopback origin (127.0.0.2, another port) tries a cross-site
  `<form method=post enctype=text/plain>` and a no-cors `fetch` POST, which need no CORS
  answer, against the redrive route (it has no body, so no content type stops it): both
  reach the daemon, are refused `403 C03`, and both DEAD jobs stay DEAD.
- DNS rebinding: a name the browser resolves to 127.0.0.1 (`--host-resolver-rules`) gets
  `421` for every page and API call, so the page reads nothing.
- From the daemon's own origin the same POST works (what the console sends).
"""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from playwright.sync_api import Browser, sync_playwright

from outboxd.storage.ports import NewPortalJob
from tests.support.browser import CHROMIUM, CHROMIUM_ARGS, require_chromium
from tests.support.live_api import LiveApi
from tests.support.waits import eventually_sync

pytestmark = pytest.mark.slow

REBIND_NAME = "rebind.test"


@pytest.fixture
def live(make_live_api: Callable[..., LiveApi]) -> LiveApi:
    return make_live_api()  # no tokens: auth-off mode


@pytest.fixture
def browser() -> Iterator[Browser]:
    """Requested last (after the Postgres fixtures, which run their own event loops)."""
    require_chromium()
    with sync_playwright() as pw:
        b = pw.chromium.launch(
            executable_path=str(CHROMIUM),
            args=[*CHROMIUM_ARGS, f"--host-resolver-rules=MAP {REBIND_NAME} 127.0.0.1"],
        )
        try:
            yield b
        finally:
            b.close()


class _Page(http.server.BaseHTTPRequestHandler):
    html = b""

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(self.html)))
        self.end_headers()
        self.wfile.write(self.html)

    def log_message(self, *_args: Any) -> None:
        pass


def _serve(html: str) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The attacker's page on another loopback address."""
    handler = type("Page", (_Page,), {"html": html.encode()})
    server = http.server.ThreadingHTTPServer(("127.0.0.2", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.2:{server.server_address[1]}/"


def _dead_job(live: LiveApi, n: int) -> str:
    job_id = f"00000000-0000-7000-8000-{n:012d}"

    async def make() -> None:
        await live.store.create_portal_job(
            NewPortalJob(job_id, f"10000000-0000-7000-8000-{n:012d}", "local", f"k{n}",
                         "fp", "suwon", "kid", b"sealed"),
            now=time.time(),
        )  # fmt: skip
        assert await live.store.mark_job_dead(job_id, ("RETRIES_EXHAUSTED", "x"), time.time())

    live.lt.run(make())
    return job_id


def _status(live: LiveApi, job_id: str) -> str:
    job = live.lt.run(live.store.get_job(job_id))
    assert job is not None
    return job.status


def _answered(live: LiveApi, route: str, count: int, timeout_s: float = 30) -> list[int]:
    """The statuses the daemon logged for `route` (waiting for `count` of them)."""

    def statuses() -> list[int]:
        return [
            e["status"]
            for e in live.events()
            if e.get("event") == "http_request" and e.get("route") == route
        ]

    with contextlib.suppress(AssertionError):  # the caller asserts on what there is
        eventually_sync(lambda: len(statuses()) >= count, timeout_s)
    return statuses()


REDRIVE = "/v1/admin/jobs/{job_id}/redrive"


def test_a_page_of_another_origin_cannot_redrive_a_job(live: LiveApi, browser: Browser) -> None:
    form_job, fetch_job = _dead_job(live, 1), _dead_job(live, 2)
    daemon = f"http://127.0.0.1:{live.port}"
    server, page_url = _serve(
        f"""<!doctype html><title>elsewhere</title>
<form id="f" method="post" enctype="text/plain" target="sink"
      action="{daemon}/v1/admin/jobs/{form_job}/redrive"><input name='{{"a":"' value='"}}'></form>
<iframe name="sink"></iframe>
<script>
  window.fetched = fetch("{daemon}/v1/admin/jobs/{fetch_job}/redrive",
                         {{method: "POST", mode: "no-cors", body: "x"}})
    .then(r => r.type, e => "error: " + e);
  document.getElementById("f").submit();
</script>"""
    )
    try:
        context = browser.new_context()
        page = context.new_page()
        page.goto(page_url)
        assert page.evaluate("window.fetched") == "opaque"  # sent, and unreadable
        # Both requests reached the daemon, and both were refused.
        assert _answered(live, REDRIVE, 2) == [403, 403]
        context.close()
    finally:
        server.shutdown()
    assert (_status(live, form_job), _status(live, fetch_job)) == ("DEAD", "DEAD")

    # The daemon's own origin (the console's page) is served, and its POST works.
    context = browser.new_context()
    page = context.new_page()
    assert page.goto(daemon + "/ui/").status == 200  # type: ignore[union-attr]
    status = page.evaluate(
        f"fetch('/v1/admin/jobs/{fetch_job}/redrive', {{method: 'POST'}}).then(r => r.status)"
    )
    assert status == 202
    assert _status(live, fetch_job) == "QUEUED"
    context.close()


def test_a_rebound_name_reads_nothing(live: LiveApi, browser: Browser) -> None:
    job_id = _dead_job(live, 3)
    context = browser.new_context()
    page = context.new_page()
    for path in ("/ui/", "/v1/admin/jobs", f"/v1/jobs/{job_id}", "/v1/admin/stats"):
        resp = page.goto(f"http://{REBIND_NAME}:{live.port}{path}")
        assert resp is not None and resp.status == 421, path
        assert job_id not in page.content()
    # A script on that page, same-origin as far as the browser knows, gets 421 too.
    got = page.evaluate(
        f"fetch('/v1/admin/jobs/{job_id}/redrive', {{method: 'POST'}})"
        ".then(async r => [r.status, await r.text()])"
    )
    assert got[0] == 421 and '"code":"C03"' in got[1]
    assert _status(live, job_id) == "DEAD"
    context.close()
