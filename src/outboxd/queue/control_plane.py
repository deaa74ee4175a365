"""The control plane: SQS through aiobotocore, for what is done seldom and must be done as
AWS's own SDK does it. It resolves the region, the credentials chain, the endpoint and
the CA bundle, and hands the message plane (queue/message_plane.py) that same view;
it creates or looks up the queues and their DLQs, checks or converges their attributes,
and reads attributes and depths.

Every call runs under the retry policy and error mapping of queue/failures.py, so
botocore's untyped responses and its zoo of exceptions stay in here.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
from contextlib import AsyncExitStack
from dataclasses import KW_ONLY, dataclass, field
from typing import Any
from urllib.parse import urlsplit

import structlog
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession
from botocore import xform_name
from botocore.httpsession import get_cert_path

from outboxd.config import SqsSettings, is_loopback_host
from outboxd.queue.failures import (
    QUEUE_EXISTS_CODES,
    REQUEST_RETRY,
    SQS_FAILURES,
    QueueError,
    RetryPolicy,
    queue_error,
)
from outboxd.queue.message_plane import Credentials, CredentialSource, SqsClientView

# Kept longer than the main queues' default 4 days: in a standard queue a message keeps
# its original enqueue time when it moves to the DLQ, so a short DLQ retention could
# drop it soon after arriving, before anyone looked (AWS's own advice).
DLQ_RETENTION_S = 14 * 24 * 3600
LOOPBACK_DUMMY_CREDENTIAL = "outboxd"
LOOPBACK_DEFAULT_REGION = "us-east-1"
CONNECT_TIMEOUT_S = 2.0  # loopback or the regional endpoint: 2 s without a TCP handshake is down
# A request that has not answered in a few seconds is stuck: the relay / consumer should
# learn that quickly and apply their own backoff. (Long polls have their own timeout.)
CONTROL_READ_TIMEOUT_S = 5.0
# botocore tries once: queue/failures.py's RetryPolicy retries, for both planes alike.
# (`total_max_attempts`, not `max_attempts`: in a client Config the latter counts retries.)
_BOTOCORE_RETRIES: dict[str, Any] = {"mode": "standard", "total_max_attempts": 1}

log = structlog.get_logger(__name__)


def dlq_name(name: str) -> str:
    """`<name>-dlq`, or `<base>-dlq.fifo` for a FIFO queue (a FIFO DLQ must be FIFO too)."""
    if name.endswith(".fifo"):
        return f"{name.removesuffix('.fifo')}-dlq.fifo"
    return f"{name}-dlq"


def is_loopback_endpoint(endpoint_url: str | None) -> bool:
    if endpoint_url is None:
        return False
    host = urlsplit(endpoint_url).hostname
    return host is not None and is_loopback_host(host)


def resolve_region(
    settings: SqsSettings, endpoint_url: str | None, session: Any = None
) -> str | None:
    """sqs.region, else AWS_REGION, else botocore's (AWS_DEFAULT_REGION, ~/.aws/config).

    Reads local configuration only, never the network. A loopback endpoint (moto, the
    embedded server) ignores the region, so any valid one is returned for it.
    """
    if settings.region:
        return settings.region
    region = os.environ.get("AWS_REGION") or (session or AioSession()).get_config_variable("region")
    if region:
        return str(region)
    if is_loopback_endpoint(endpoint_url):
        return LOOPBACK_DEFAULT_REGION
    return None


def resolve_ca_bundle(session: Any) -> str:
    """The CA bundle botocore verifies the endpoint's certificate with: AWS_CA_BUNDLE or the
    profile's `ca_bundle`, else REQUESTS_CA_BUNDLE (botocore's own fallback), else the
    bundle botocore ships with. Both planes are given this one file."""
    configured = session.get_config_variable("ca_bundle") or os.environ.get("REQUESTS_CA_BUNDLE")
    return str(get_cert_path(configured or True))


@dataclass(eq=False, repr=False)
class SqsControlPlane:
    """aiobotocore's SQS client, opened by `open()` (which returns the view the message
    plane must use) and closed by `close()`. Works on queue names and URLs; which queue
    is jobs or tasks is the facade's business (queue/sqs.py)."""

    settings: SqsSettings
    endpoint_url: str | None
    _: KW_ONLY
    max_connections: int
    retry: RetryPolicy = REQUEST_RETRY
    _stack: AsyncExitStack | None = field(default=None, init=False)
    # aiobotocore clients are untyped; the Any stays in here
    _client: Any = field(default=None, init=False)
    region: str | None = field(default=None, init=False)  # resolved by open()

    # --- lifecycle ---------------------------------------------------------------------

    async def open(self) -> SqsClientView:
        """Resolve region, credentials and CA bundle, open the client; SQS as both planes see it."""
        await self.close()
        stack = AsyncExitStack()
        try:
            session = AioSession()
            region = resolve_region(self.settings, self.endpoint_url, session)
            if region is None:
                raise QueueError("no AWS region configured: set sqs.region (or AWS_REGION)")
            self.region = region
            credentials = await self._credential_overrides(session)
            ca_bundle = resolve_ca_bundle(session)
            self._client = await stack.enter_async_context(
                session.create_client(
                    "sqs",
                    config=self._config(),
                    region_name=region,
                    endpoint_url=self.endpoint_url,
                    verify=ca_bundle,
                    **credentials,
                )
            )
            # The endpoint as botocore resolved it (sqs.endpoint_url, or the region's).
            endpoint = str(self._client.meta.endpoint_url)
            context = None
            if urlsplit(endpoint).scheme == "https":
                # Reading a bundle of a few hundred certificates is blocking file I/O.
                context = await asyncio.to_thread(ssl.create_default_context, cafile=ca_bundle)
            view = SqsClientView(
                endpoint_url=endpoint,
                region=region,
                credentials=await self._credential_source(session, credentials),
                ssl_context=context,
            )
        except BaseException as exc:
            self._client = None
            await stack.aclose()
            if isinstance(exc, SQS_FAILURES):
                raise queue_error("client setup", exc) from exc
            raise
        self._stack = stack
        return view

    async def close(self) -> None:
        stack, self._stack = self._stack, None
        self._client = None
        if stack is not None:
            await stack.aclose()

    def _config(self) -> AioConfig:
        return AioConfig(
            connect_timeout=CONNECT_TIMEOUT_S,
            read_timeout=CONTROL_READ_TIMEOUT_S,
            retries=dict(_BOTOCORE_RETRIES),
            max_pool_connections=self.max_connections,
            # Loading the SQS service model from disk is blocking file I/O and JSON
            # parsing; do it in a thread rather than on the event loop.
            warm_up_loader_caches=True,
            # Every call is built in this package from typed values: botocore's walk of
            # the request against the service model checks nothing we do not.
            parameter_validation=False,
        )

    async def _credential_overrides(self, session: Any) -> dict[str, str]:
        """Dummy keys for a loopback server when the standard chain finds none.

        Real credentials, wherever the chain finds them, are never replaced. For a
        loopback endpoint the instance-metadata and container providers are dropped
        first: they would try link-local HTTP for seconds on a laptop, and a role's
        credentials mean nothing to a local server anyway.
        """
        if not is_loopback_endpoint(self.endpoint_url):
            return {}
        resolver = session.get_component("credential_provider")
        for method in ("iam-role", "container-role"):
            resolver.remove(method)
        if await session.get_credentials() is not None:
            return {}
        return {
            "aws_access_key_id": LOOPBACK_DUMMY_CREDENTIAL,
            "aws_secret_access_key": LOOPBACK_DUMMY_CREDENTIAL,
        }

    async def _credential_source(self, session: Any, overrides: dict[str, str]) -> CredentialSource:
        """What the message plane signs with: the same credentials as the botocore client
        (the overrides, or the chain's), read afresh per request so that refreshable
        credentials (an instance role, SSO) are renewed as botocore renews them."""
        if overrides:
            fixed = Credentials(overrides["aws_access_key_id"], overrides["aws_secret_access_key"])

            async def static() -> Credentials:
                return fixed

            return static
        chain = await session.get_credentials()

        async def current() -> Credentials:
            if chain is None:
                raise QueueError("no AWS credentials found (environment, files or role)")
            frozen = await chain.get_frozen_credentials()
            return Credentials(frozen.access_key, frozen.secret_key, frozen.token)

        return current

    # --- calls -------------------------------------------------------------------------

    async def call(self, operation: str, subject: str = "", **params: Any) -> dict[str, Any]:
        """One SQS operation (e.g. "GetQueueUrl") under the retry policy; its answer.
        `subject` (a queue name) goes into the error message."""
        if self._client is None:
            raise QueueError("SQS client is not started: call start() first")
        method = getattr(self._client, xform_name(operation))
        label = f"{operation} {subject}" if subject else operation
        answer: dict[str, Any] = await self.retry.run(label, lambda: method(**params))
        return answer

    async def queue_url(self, name: str) -> str:
        return str((await self.call("GetQueueUrl", name, QueueName=name))["QueueUrl"])

    async def attributes(self, url: str, names: list[str], subject: str = "") -> dict[str, str]:
        resp = await self.call("GetQueueAttributes", subject, QueueUrl=url, AttributeNames=names)
        return {str(k): str(v) for k, v in resp.get("Attributes", {}).items()}

    # --- the queues --------------------------------------------------------------------

    def _expected(self, fifo: bool) -> tuple[dict[str, str], dict[str, str]]:
        """(the main queue's attributes without its redrive policy, the DLQ's)."""
        # We always pass a dedup id (the task's), so content-based dedup stays off: two
        # tasks with equal bodies are still two tasks.
        fifo_attrs = {"FifoQueue": "true", "ContentBasedDeduplication": "false"} if fifo else {}
        main = {**fifo_attrs, "VisibilityTimeout": str(self.settings.visibility_timeout_s)}
        return main, {**fifo_attrs, "MessageRetentionPeriod": str(DLQ_RETENTION_S)}

    def _redrive(self, dlq_arn: str) -> dict[str, Any]:
        return {"deadLetterTargetArn": dlq_arn, "maxReceiveCount": self.settings.max_receive_count}

    async def ensure_pair(self, name: str) -> tuple[str, str]:
        """Create queue `name` and its DLQ, or converge existing ones: (main URL, DLQ URL).

        DLQ first, since a redrive policy names its DLQ's ARN. A queue that exists with
        other mutable attributes (visibility timeout, redrive policy) is updated in place.
        Safe to run from several instances at once: CreateQueue with equal attributes
        returns the existing queue.
        """
        main_attrs, dlq_attrs = self._expected(name.endswith(".fifo"))
        dead = dlq_name(name)
        dlq_url = await self._ensure_queue(dead, dlq_attrs)
        dlq_arn = (await self.attributes(dlq_url, ["QueueArn"], dead))["QueueArn"]
        redrive = json.dumps(self._redrive(dlq_arn))
        main_url = await self._ensure_queue(name, {**main_attrs, "RedrivePolicy": redrive})
        return main_url, dlq_url

    async def _ensure_queue(self, name: str, attributes: dict[str, str]) -> str:
        try:
            resp = await self.call("CreateQueue", name, QueueName=name, Attributes=attributes)
            return str(resp["QueueUrl"])
        except QueueError as exc:
            if exc.code not in QUEUE_EXISTS_CODES:
                raise
        # It exists with other attributes: converge. FifoQueue cannot change (and cannot
        # differ here, the .fifo suffix decides it), so it is left out of the update.
        url = await self.queue_url(name)
        mutable = {k: v for k, v in attributes.items() if k != "FifoQueue"}
        await self.call("SetQueueAttributes", name, QueueUrl=url, Attributes=mutable)
        log.info("sqs_queue_attributes_converged", queue=name, attributes=sorted(mutable))
        return url

    async def resolve_pair(self, name: str) -> tuple[str, str]:
        """The URLs of existing queue `name` and its DLQ; QueueError if either is missing."""
        return await self.queue_url(name), await self.queue_url(dlq_name(name))

    async def check_pair(self, name: str, main_url: str, dlq_url: str) -> int:
        """With sqs.create_queues off, the queues are someone else's: compare queue `name`
        with what the daemon expects (FIFO for a .fifo name, a redrive policy to its DLQ
        with sqs.max_receive_count, sqs.visibility_timeout_s) and log one
        `sqs_queue_mismatch` per difference. Changes nothing; how many differ."""
        attrs = await self.attributes(
            main_url, ["FifoQueue", "VisibilityTimeout", "RedrivePolicy"], name
        )
        dead = dlq_name(name)
        dlq_arn = (await self.attributes(dlq_url, ["QueueArn"], dead))["QueueArn"]
        expected, _ = self._expected(name.endswith(".fifo"))
        found: list[tuple[str, str, str | None]] = [
            (key, expected[key], attrs.get(key))
            for key in ("FifoQueue", "VisibilityTimeout")
            if key in expected and attrs.get(key) != expected[key]
        ]
        redrive = self._redrive(dlq_arn)
        try:
            policy = json.loads(attrs["RedrivePolicy"])
        except (KeyError, ValueError):
            policy = None
        if not isinstance(policy, dict):
            found.append(("RedrivePolicy", json.dumps(redrive), attrs.get("RedrivePolicy")))
        else:
            found += [
                (f"RedrivePolicy.{key}", str(want), None if got is None else str(got))
                for key, want in redrive.items()
                if str(got := policy.get(key)) != str(want)
            ]
        for attribute, want, got in found:
            log.warning(
                "sqs_queue_mismatch", queue=name, attribute=attribute, expected=want, actual=got
            )
        return len(found)
