"""One SQS client view: an https endpoint behind a private CA, trusted through AWS_CA_BUNDLE
or the profile's `ca_bundle`, works for queue setup (botocore) and for the calls that carry
messages (the signed JSON client) alike, and fails clearly for both without the CA.

SQS is the session's moto behind a TLS-terminating proxy on loopback whose certificate a
CA made by the test signed.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest
import pytest_asyncio
from testkit.moto import MotoServer

from outboxd.queue.control_plane import SqsControlPlane
from outboxd.queue.failures import REQUEST_RETRY
from outboxd.queue.message_plane import SqsMessagePlane
from outboxd.queue.sqs import OutgoingMessage, QueueError, SqsQueues
from tests.support.sqs_proxy import queue_settings
from tests.support.tcp_proxy import TcpProxy
from tests.support.tls import PrivateCa, make_private_ca

# A certificate that does not verify is final at once: no retries, no backoff. Counted in
# connections the client opens, not in seconds (a busy machine stretches those).


@pytest.fixture
def ca(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PrivateCa:
    # Only what a test sets decides which CA is trusted.
    for var in ("AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    return make_private_ca(tmp_path)


@pytest_asyncio.fixture
async def tls_proxy(ca: PrivateCa, moto_server: MotoServer) -> AsyncIterator[TcpProxy]:
    proxy = TcpProxy("127.0.0.1", moto_server.port, ssl=ca.server_context())
    await proxy.start()
    try:
        yield proxy
    finally:
        await proxy.stop()


@pytest_asyncio.fixture
async def https_url(tls_proxy: TcpProxy) -> str:
    return f"https://127.0.0.1:{tls_proxy.port}"


@pytest_asyncio.fixture
async def counted(tls_proxy: TcpProxy) -> AsyncIterator[tuple[str, TcpProxy]]:
    """The TLS endpoint behind a plain TCP proxy that counts the connections made to it
    (every attempt, a handshake that fails included): the URL, and that proxy."""
    plain = TcpProxy("127.0.0.1", tls_proxy.port)
    port = await plain.start()
    try:
        yield f"https://127.0.0.1:{port}", plain
    finally:
        await plain.stop()


async def round_trip(queues: SqsQueues) -> None:
    """Send, receive, delete and ping: every call of the message plane."""
    await queues.ping()
    sent = await queues.send_batch("jobs", [OutgoingMessage("m1", "over tls")])
    assert set(sent.successful) == {"m1"} and sent.failed == {}
    [got] = await queues.receive("jobs", 1)
    assert got.body == "over tls" and got.message_id == sent.successful["m1"]
    await queues.delete("jobs", got.receipt_handle)
    assert await queues.receive("jobs", 1) == []
    assert (await queues.depth("jobs")).in_flight == 0


async def test_aws_ca_bundle_is_trusted_by_both_planes(
    ca: PrivateCa, https_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AWS_CA_BUNDLE", str(ca.ca_pem))
    async with SqsQueues(queue_settings(https_url), https_url) as queues:
        await round_trip(queues)


async def test_the_profiles_ca_bundle_is_trusted_by_both_planes(
    ca: PrivateCa, https_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "aws-config"
    config.write_text(f"[default]\nca_bundle = {ca.ca_pem}\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    async with SqsQueues(queue_settings(https_url), https_url) as queues:
        await round_trip(queues)


async def test_without_the_ca_start_fails_clearly_and_every_call_says_why(
    counted: tuple[str, TcpProxy],
) -> None:
    url, plain = counted
    queues = SqsQueues(queue_settings(url), url)
    with pytest.raises(QueueError) as info:
        await queues.start()
    assert "CERTIFICATE_VERIFY_FAILED" in str(info.value) and info.value.outage
    assert plain.accepted == 1, f"start tried {plain.accepted} connections, not one"
    with pytest.raises(QueueError, match="CERTIFICATE_VERIFY_FAILED"):
        await queues.send_batch("jobs", [OutgoingMessage("m1", "x")])
    # It says why from what start saw, or after one attempt of its own; never retries.
    assert plain.accepted <= 2, f"send_batch tried {plain.accepted - 1} connections"
    await queues.close()


async def test_the_message_plane_verifies_with_the_views_context_only(
    ca: PrivateCa, counted: tuple[str, TcpProxy], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given the control plane's view, the JSON client reaches the endpoint; without the
    view's SSL context (the bug this guards: setup worked, every send failed) it fails
    with a clear QueueError at once."""
    monkeypatch.setenv("AWS_CA_BUNDLE", str(ca.ca_pem))
    https_url, plain = counted
    settings = queue_settings(https_url)
    control = SqsControlPlane(settings, https_url, max_connections=1)
    view = await control.open()
    try:
        assert view.ssl_context is not None and view.endpoint_url == https_url
        url, _ = await control.ensure_pair(settings.jobs_queue)
    finally:
        await control.close()
    params = {"QueueUrl": url, "AttributeNames": ["QueueArn"]}
    for context in (view.ssl_context, None):
        plane = SqsMessagePlane(
            replace(view, ssl_context=context),
            connect_timeout_s=2.0,
            read_timeout_s=5.0,
            retry=REQUEST_RETRY,
            max_connections=1,
        )
        before = plain.accepted
        try:
            answer = await plane.call("GetQueueAttributes", params)
        except QueueError as exc:
            assert context is None, exc
            assert plain.accepted - before == 1, "one connection tried, not retried"
            assert "certificate verify failed" in str(exc).lower()
            assert exc.outage and exc.code is None
        else:
            assert context is not None
            assert answer["Attributes"]["QueueArn"].endswith(settings.jobs_queue)
        finally:
            await plane.close()
