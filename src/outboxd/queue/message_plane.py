"""The message plane: the calls that carry messages, on SQS's JSON protocol (AWS JSON 1.0),
signed with Signature Version 4, on one aiohttp session.

The calls made once per message or per batch (SendMessageBatch, ReceiveMessage,
DeleteMessage[Batch], ChangeMessageVisibility[Batch], and the readiness ping) go through here;
everything else (the credential chain, the region, the endpoint and its CA bundle,
creating and inspecting queues) is the control plane's, on aiobotocore
(queue/control_plane.py). The control plane hands this module its view of SQS
(`SqsClientView`), so both planes reach one endpoint, trust one CA bundle and sign with
one credential chain.

Why: botocore's machinery per call (endpoint rules, event hooks, serialisation, signing,
parsing) costs the event loop that also answers the API several times what this request
costs (docs/decisions/0006-sqs-json-client.md). The wire format is small and stable: a
POST to the endpoint's `/` with `X-Amz-Target: AmazonSQS.<Operation>` and a JSON body,
answered with JSON.

Errors and retries are the ones of queue/failures.py, shared with the control plane.
"""

from __future__ import annotations

import hashlib
import hmac
import ssl
import time
import urllib.request
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import msgspec

from outboxd.queue.failures import RetryPolicy, SqsFault

CONTENT_TYPE = "application/x-amz-json-1.0"
SERVICE = "sqs"
_ALGORITHM = "AWS4-HMAC-SHA256"
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


@dataclass(frozen=True)
class SqsClientView:
    """SQS as the control plane resolved it, for the message plane to use as is."""

    endpoint_url: str  # botocore's: sqs.endpoint_url, or the region's
    region: str
    credentials: CredentialSource  # the same chain (or loopback dummies) botocore signs with
    # Verifies an https endpoint against the CA bundle botocore verifies it with
    # (AWS_CA_BUNDLE, the profile's ca_bundle, else botocore's own); None for http.
    ssl_context: ssl.SSLContext | None = None


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


class SqsMessagePlane:
    """Signed JSON calls to the endpoint of `view`, each under `retry`; `close()` after use.

    One per kind of call, since a long poll and a send want opposite read timeouts: a
    receive legitimately waits up to 20 s for the first byte, while a send, delete or
    visibility change that has not answered in a few seconds is stuck.
    """

    def __init__(
        self,
        view: SqsClientView,
        *,
        connect_timeout_s: float,
        read_timeout_s: float,
        retry: RetryPolicy,
        max_connections: int,
    ) -> None:
        self._url = view.endpoint_url.rstrip("/") + "/"
        self._host = canonical_host(view.endpoint_url)
        self._region = view.region
        self._credentials = view.credentials
        self._ssl: ssl.SSLContext | bool = view.ssl_context or True
        self._keys = _SigningKeys(view.region)
        self._limits = aiohttp.ClientTimeout(
            total=None, sock_connect=connect_timeout_s, sock_read=read_timeout_s
        )
        self._retry = retry
        self._max_connections = max_connections
        self._proxy = proxy_for(view.endpoint_url)
        self._session: aiohttp.ClientSession | None = None

    def _open(self) -> aiohttp.ClientSession:
        # Created on first use, inside the running loop.
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self._max_connections, ssl=self._ssl),
                cookie_jar=aiohttp.DummyCookieJar(),
                auto_decompress=False,
                skip_auto_headers=("Accept-Encoding",),
            )
        return self._session

    async def close(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def call(self, operation: str, params: Mapping[str, Any]) -> dict[str, Any]:
        """One operation; its decoded answer. QueueError (queue/failures.py) when SQS refused
        it or could not be reached, once the retry policy is spent."""
        body = _encode(params)
        target = f"AmazonSQS.{operation}"
        return await self._retry.run(operation, lambda: self._once(target, body))

    async def _once(self, target: str, body: bytes) -> dict[str, Any]:
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
            self._url, data=body, headers=headers, timeout=self._limits, proxy=self._proxy
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
