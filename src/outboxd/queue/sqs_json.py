"""SQS's JSON protocol (AWS JSON 1.0), signed with Signature Version 4, on one aiohttp session.

The calls made once per message or per batch (SendMessageBatch, ReceiveMessage,
DeleteMessage, ChangeMessageVisibility) go through here; everything else (the
credential chain, the region, the endpoint, creating and inspecting queues) stays on
aiobotocore in `queue/sqs.py`, which is the only caller of this module.

Why: botocore spends about 1.6 ms of CPU on one SendMessageBatch of ten (endpoint rules,
its event hooks, serialisation, signing, parsing), on the event loop that also answers
the API. The same request built here costs about 0.6 ms, most of it aiohttp's. The wire
format is small and stable: a POST to the endpoint's `/` with `X-Amz-Target:
AmazonSQS.<Operation>` and a JSON body, answered with JSON
(docs/architecture.md, "The SQS wire path").

Retries follow botocore's "standard" mode as the rest of the adapter configures it: a
connection failure, a timeout, a 5xx or a throttling answer is tried again after a
jittered backoff (rand x 1 s, then rand x 2 s) up to `attempts` in all.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import random
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec

CONTENT_TYPE = "application/x-amz-json-1.0"
SERVICE = "sqs"
_ALGORITHM = "AWS4-HMAC-SHA256"
# What botocore's standard retry mode treats as transient, besides transport failures.
_THROTTLING_CODES = frozenset(
    {
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottledException",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "TransactionInProgressException",
        "RequestLimitExceeded",
        "BandwidthLimitExceeded",
        "LimitExceededException",
        "RequestThrottled",
        "SlowDown",
        "PriorRequestNotComplete",
        "EC2ThrottledException",
        "RequestTimeout",
        "RequestTimeoutException",
    }
)
_RETRY_STATUSES = frozenset({500, 502, 503, 504})
_ERROR_TEXT_MAX = 200

_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder().decode


@dataclass(frozen=True)
class Credentials:
    access_key: str
    secret_key: str
    token: str | None = None


# Returns the credentials to sign the next request with (botocore's refreshable
# credentials behind it renew themselves before they expire).
CredentialSource = Callable[[], Awaitable[Credentials]]


class SqsFault(Exception):
    """SQS answered with an error. `code` is the query-protocol code when SQS sent one
    (the `x-amzn-query-error` header, as botocore reports it), else the JSON type."""

    def __init__(self, code: str, message: str, status: int) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.status = status

    @property
    def retryable(self) -> bool:
        return self.status in _RETRY_STATUSES or self.code in _THROTTLING_CODES


def canonical_host(endpoint_url: str) -> str:
    """The Host header, as signed: the endpoint's host, with its port unless default."""
    parts = urlsplit(endpoint_url)
    netloc = parts.netloc.rsplit("@", 1)[-1]
    default = {"http": ":80", "https": ":443"}.get(parts.scheme, "")
    if default and netloc.endswith(default):
        netloc = netloc[: -len(default)]
    return netloc


def proxy_for(endpoint_url: str) -> str | None:
    """The proxy botocore would use for this endpoint: HTTPS_PROXY / HTTP_PROXY by the
    endpoint's scheme, unless NO_PROXY names its host (the standard library's reading of
    those variables). Resolved once; aiohttp's own `trust_env` would also read ~/.netrc."""
    parts = urlsplit(endpoint_url)
    proxy = urllib.request.getproxies().get(parts.scheme)
    if not proxy or urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    return proxy


class _SigningKeys:
    """The day's signing key, derived once a day (and per secret) instead of per request."""

    def __init__(self, region: str) -> None:
        self._region = region
        self._cached: tuple[str, str, bytes] | None = None  # (day, secret, key)

    def key(self, day: str, secret: str) -> bytes:
        cached = self._cached
        if cached is not None and cached[0] == day and cached[1] == secret:
            return cached[2]
        k = hmac.digest(("AWS4" + secret).encode(), day.encode(), "sha256")
        for part in (self._region, SERVICE, "aws4_request"):
            k = hmac.digest(k, part.encode(), "sha256")
        self._cached = (day, secret, k)
        return k


def signed_headers(
    *,
    host: str,
    region: str,
    target: str,
    body: bytes,
    amz_date: str,
    credentials: Credentials,
    keys: _SigningKeys | None = None,
) -> dict[str, str]:
    """The headers of one signed POST to `/` (Signature Version 4, the payload hashed).

    `amz_date` is the request time as `YYYYMMDDTHHMMSSZ` (UTC).
    """
    day = amz_date[:8]
    headers = {
        "content-type": CONTENT_TYPE,
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-target": target,
    }
    if credentials.token:
        headers["x-amz-security-token"] = credentials.token
    names = sorted(headers)
    signed = ";".join(names)
    canonical = "\n".join(
        (
            "POST",
            "/",
            "",
            "".join(f"{n}:{headers[n]}\n" for n in names),
            signed,
            hashlib.sha256(body).hexdigest(),
        )
    )
    scope = f"{day}/{region}/{SERVICE}/aws4_request"
    to_sign = "\n".join(
        (_ALGORITHM, amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest())
    )
    key = (keys or _SigningKeys(region)).key(day, credentials.secret_key)
    signature = hmac.new(key, to_sign.encode(), "sha256").hexdigest()
    headers["authorization"] = (
        f"{_ALGORITHM} Credential={credentials.access_key}/{scope}, "
        f"SignedHeaders={signed}, Signature={signature}"
    )
    return headers


def _fault(status: int, headers: Mapping[str, str], payload: bytes) -> SqsFault:
    code = message = ""
    try:
        data = _decode(payload) if payload else {}
    except msgspec.DecodeError:
        data = None
    if isinstance(data, dict):
        code = str(data.get("__type") or data.get("code") or "").rsplit("#", 1)[-1]
        message = str(data.get("message") or data.get("Message") or "")
    else:
        message = payload[:_ERROR_TEXT_MAX].decode("utf-8", "replace")
    # As botocore reads it: "<query code>;<Sender|Receiver>" wins over the JSON type.
    query = headers.get("x-amzn-query-error", "").split(";")
    if len(query) == 2 and query[0]:
        code = query[0]
    return SqsFault(code or f"HTTP {status}", message[:_ERROR_TEXT_MAX], status)


def _jittered_backoff_s(attempt: int) -> float:
    """Before the retry after failed attempt n (1-based): rand x 2^(n-1) s, at most 20 s."""
    return random.random() * min(20.0, 2.0 ** (attempt - 1))


class SqsJsonClient:
    """Signed JSON calls to one SQS endpoint; `close()` after use."""

    def __init__(
        self,
        endpoint_url: str,
        region: str,
        credentials: CredentialSource,
        *,
        connect_timeout_s: float,
        max_connections: int,
        backoff_s: Callable[[int], float] | None = None,
    ) -> None:
        self._url = endpoint_url.rstrip("/") + "/"
        self._host = canonical_host(endpoint_url)
        self._region = region
        self._credentials = credentials
        self._keys = _SigningKeys(region)
        self._connect_timeout_s = connect_timeout_s
        self._max_connections = max_connections
        self._backoff_s = backoff_s or _jittered_backoff_s
        self._proxy = proxy_for(endpoint_url)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def call(
        self,
        operation: str,
        params: Mapping[str, Any],
        *,
        read_timeout_s: float,
        attempts: int,
    ) -> dict[str, Any]:
        """One operation; its decoded answer. Raises SqsFault when SQS refused it, and
        aiohttp.ClientError, TimeoutError or OSError when it could not be reached, once
        `attempts` are spent on what is worth another try."""
        body = _encode(params)
        limits = aiohttp.ClientTimeout(
            total=None, sock_connect=self._connect_timeout_s, sock_read=read_timeout_s
        )
        target = f"AmazonSQS.{operation}"
        attempt = 1
        while True:
            try:
                return await self._once(target, body, limits)
            except SqsFault as exc:
                if not exc.retryable or attempt >= attempts:
                    raise
            except (aiohttp.ClientError, TimeoutError, OSError):
                if attempt >= attempts:
                    raise
            await asyncio.sleep(self._backoff_s(attempt))
            attempt += 1

    async def _once(
        self, target: str, body: bytes, limits: aiohttp.ClientTimeout
    ) -> dict[str, Any]:
        credentials = await self._credentials()
        amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        headers = signed_headers(
            host=self._host,
            region=self._region,
            target=target,
            body=body,
            amz_date=amz_date,
            credentials=credentials,
            keys=self._keys,
        )
        async with self._open().post(
            self._url, data=body, headers=headers, timeout=limits, proxy=self._proxy
        ) as resp:
            payload = await resp.read()
            if resp.status != 200:
                raise _fault(resp.status, resp.headers, payload)
        try:
            data = _decode(payload) if payload else {}
        except msgspec.DecodeError:
            raise SqsFault("InvalidResponse", "the answer is not JSON", resp.status) from None
        if not isinstance(data, dict):
            raise SqsFault("InvalidResponse", "the answer is not a JSON object", resp.status)
        return data
