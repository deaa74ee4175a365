"""A fake OpenAI-compatible chat-completions server: a real aiohttp server on 127.0.0.1.

It serves `POST /v1/chat/completions`, so the classifier's base_url is `FakeAI.base_url`
(`http://127.0.0.1:PORT/v1`). The domain is read from the user message, which by the
classifier's contract holds `Domain: <domain>` on its own line; the answer is
`categories_by_domain.get(domain, default_category)`.

Switches (plain attributes and methods, change them at any time):
`rate_limit_next_n`, `fail_next_n`, `always_fail`, `delay_s`, `malformed`
(`malformed_body` is what is sent), `answer_override`.
Records: `calls`, `requests` (the JSON bodies), `in_flight_max`, `in_flight_by_domain_max`.

A wrong key gets 401 with a body that echoes the key it received, as real providers
partly do, so tests can prove the classifier keeps keys out of its error messages.

Standalone, for acceptance tests that run the daemon as a subprocess:

    python -m testkit.fakes.ai --port-file PATH [--api-key K] [--delay-s X]
        [--record-file PATH] [--default-category C] [--category DOMAIN=CATEGORY ...]
        [--rate-limit-call N=RETRY_AFTER_S ...]

writes `{"base_url": ...}` to PATH (atomically) once listening and serves until
SIGTERM/SIGINT. With `--record-file` every call appends one JSON line
`{"start", "end", "domain", "status"}` with wall-clock times (time.time()), so calls
from several processes can be compared. `--rate-limit-call 3=2` answers the third
authorised call with 429 and `Retry-After: 2` (`rate_limit_calls` in-process).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import email.utils
import json
import os
import re
import time
import uuid
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

from testkit.fakes.common import FakeServer, serve_until_signalled

_DOMAIN_LINE = re.compile(r"^\s*Domain:\s*(\S+)\s*$", re.MULTILINE)
DEFAULT_MALFORMED_BODY = b'{"object": "list", "data": []}'


@dataclass(frozen=True)
class Call:
    started_at_monotonic: float
    finished_at_monotonic: float
    domain: str
    status: int


class FakeAI(FakeServer):
    def __init__(
        self,
        api_key: str = "test-key",
        default_category: str = "technology",
        *,
        record_file: str | os.PathLike[str] | None = None,
    ) -> None:
        self.api_key = api_key
        self.default_category = default_category
        self.record_file = None if record_file is None else Path(record_file)
        self.categories_by_domain: dict[str, str] = {}
        self.base_url = ""
        self.port = 0
        # switches
        self.always_fail = False
        self.delay_s = 0.0
        self.malformed = False
        self.malformed_body = DEFAULT_MALFORMED_BODY
        self.answer_override: str | None = None
        self._rate_limit_left = 0
        self._retry_after_s: float | None = None
        self._retry_after_http_date = False
        self._fail_left = 0
        self._fail_status = 500
        # call number (1-based, counting authorised calls) -> Retry-After of its 429
        self.rate_limit_calls: dict[int, float] = {}
        self._authorised = 0
        # records
        self.calls: list[Call] = []
        self.requests: list[dict[str, Any]] = []
        self.in_flight_max = 0
        self.in_flight_by_domain_max: dict[str, int] = {}
        self._in_flight = 0
        self._in_flight_by_domain: defaultdict[str, int] = defaultdict(int)
        self._runner: web.AppRunner | None = None
        # Set by stop() so slow answers end at once instead of holding up shutdown.
        self._stopping = asyncio.Event()

    def rate_limit_next_n(
        self, n: int, retry_after_s: float | None, *, http_date: bool = False
    ) -> None:
        """The next n calls answer 429, Retry-After in seconds, as an HTTP-date, or absent."""
        self._rate_limit_left = n
        self._retry_after_s = retry_after_s
        self._retry_after_http_date = http_date

    def fail_next_n(self, n: int, status: int = 500) -> None:
        self._fail_left = n
        self._fail_status = status

    async def start(self) -> None:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._handle)
        self._stopping = asyncio.Event()
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        self.port = int(self._runner.addresses[0][1])
        self.base_url = f"http://127.0.0.1:{self.port}/v1"

    async def stop(self) -> None:
        self._stopping.set()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    def where(self) -> dict[str, str]:
        return {"base_url": self.base_url}

    def _decide(self) -> web.Response | None:
        """The switched-on misbehaviour for this call, or None for a normal answer."""
        if self._rate_limit_left > 0:
            self._rate_limit_left -= 1
            headers: dict[str, str] = {}
            if self._retry_after_s is not None:
                if self._retry_after_http_date:
                    when = time.time() + self._retry_after_s
                    headers["Retry-After"] = email.utils.formatdate(when, usegmt=True)
                else:
                    headers["Retry-After"] = f"{self._retry_after_s:g}"
            return _error(429, "Rate limit reached", "rate_limit_exceeded", headers)
        if self._fail_left > 0:
            self._fail_left -= 1
            return _error(self._fail_status, "The server had an error", "server_error")
        if self.always_fail:
            return _error(500, "The server had an error", "server_error")
        if self.malformed:
            return web.Response(
                status=200, body=self.malformed_body, content_type="application/json"
            )
        return None

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        started = time.monotonic()
        wall_start = time.time()
        status = 0
        domain = ""
        try:
            try:
                body: Any = await request.json()
            except ValueError:
                status = 400
                return _error(400, "We could not parse the JSON body", "invalid_json")
            if isinstance(body, dict):
                self.requests.append(body)
            domain = _domain_of(body)
            self._enter(domain)
            try:
                if self.delay_s > 0:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stopping.wait(), self.delay_s)
                response = self._answer(request, body, domain)
            finally:
                self._leave(domain)
            status = response.status
            return response
        finally:
            self.calls.append(Call(started, time.monotonic(), domain, status))
            if self.record_file is not None:
                line = {"start": wall_start, "end": time.time(), "domain": domain, "status": status}
                # One short O_APPEND write per call keeps lines whole across processes.
                with self.record_file.open("a", encoding="utf-8") as fh:
                    fh.write(json.dumps(line) + "\n")

    def _answer(self, request: web.Request, body: Any, domain: str) -> web.Response:
        auth = request.headers.get("Authorization", "")
        if auth != f"Bearer {self.api_key}":
            given = auth.removeprefix("Bearer ")
            return _error(401, f"Incorrect API key provided: {given}", "invalid_api_key")
        self._authorised += 1
        if self._authorised in self.rate_limit_calls:
            retry_after = {"Retry-After": f"{self.rate_limit_calls[self._authorised]:g}"}
            return _error(429, "Rate limit reached", "rate_limit_exceeded", retry_after)
        decided = self._decide()
        if decided is not None:
            return decided
        content = self.answer_override
        if content is None:
            content = self.categories_by_domain.get(domain, self.default_category)
        model = body.get("model", "fake") if isinstance(body, dict) else "fake"
        return web.json_response(
            {
                "id": f"chatcmpl-{uuid.uuid4().hex}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": content},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 50, "completion_tokens": 1, "total_tokens": 51},
            }
        )

    def _enter(self, domain: str) -> None:
        self._in_flight += 1
        self.in_flight_max = max(self.in_flight_max, self._in_flight)
        self._in_flight_by_domain[domain] += 1
        self.in_flight_by_domain_max[domain] = max(
            self.in_flight_by_domain_max.get(domain, 0), self._in_flight_by_domain[domain]
        )

    def _leave(self, domain: str) -> None:
        self._in_flight -= 1
        self._in_flight_by_domain[domain] -= 1


def _error(
    status: int, message: str, code: str, headers: dict[str, str] | None = None
) -> web.Response:
    return web.json_response(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}},
        status=status,
        headers=headers,
    )


def _domain_of(body: Any) -> str:
    """The `Domain: <domain>` line of the last user message, or "" when there is none."""
    if not isinstance(body, dict):
        return ""
    messages = body.get("messages")
    if not isinstance(messages, list):
        return ""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            content = message.get("content")
            if isinstance(content, str) and (match := _DOMAIN_LINE.search(content)):
                return match.group(1).lower()
    return ""


async def _serve(args: argparse.Namespace) -> None:
    ai = FakeAI(
        api_key=args.api_key,
        default_category=args.default_category,
        record_file=args.record_file,
    )
    ai.delay_s = args.delay_s
    ai.port = args.port
    for item in args.rate_limit_call:
        number, _, seconds = item.partition("=")
        ai.rate_limit_calls[int(number)] = float(seconds)
    for item in args.category:
        domain, _, category = item.partition("=")
        ai.categories_by_domain[domain.lower()] = category
    await serve_until_signalled(ai, Path(args.port_file))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m testkit.fakes.ai", description=__doc__)
    parser.add_argument("--port-file", required=True)
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="test-key")
    parser.add_argument("--delay-s", type=float, default=0.0)
    parser.add_argument("--record-file", default=None)
    parser.add_argument("--default-category", default="technology")
    parser.add_argument("--category", action="append", default=[], metavar="DOMAIN=CATEGORY")
    parser.add_argument("--rate-limit-call", action="append", default=[], metavar="N=RETRY_AFTER_S")
    asyncio.run(_serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
