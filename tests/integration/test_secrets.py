"""The portal password never reaches logs, responses or the database in any readable form."""

from __future__ import annotations

import base64
import io
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio
import structlog
from aiohttp.test_utils import TestClient, TestServer

from outboxd.config import Settings
from outboxd.daemon.components import build_api_deps
from outboxd.http.app import create_app
from outboxd.metrics import Metrics
from outboxd.observability import configure_logging
from outboxd.security import KeyRing, Sealed
from outboxd.storage.sqlite import SqliteDatabase
from outboxd.storage.store import SqlStore
from tests.support import postgres as pg
from tests.support.ops import sealing_key_id

URL = "/v1/portal-link-jobs"
MAX_BODY = 2048


def needles(secret: str) -> list[bytes]:
    """The secret as UTF-8, and as every base64 alignment (standard and URL-safe alphabets)."""
    raw = secret.encode("utf-8")
    out = [raw, secret.encode("utf-16-le"), raw.hex().encode()]
    for shift in range(3):
        part = raw[shift:]
        part = part[: len(part) // 3 * 3]
        out.append(base64.b64encode(part))
        out.append(base64.urlsafe_b64encode(part))
    return out


def assert_absent(secret: str, haystack: bytes, where: str) -> None:
    for needle in needles(secret):
        assert needle not in haystack, f"{secret!r} found in {where} as {needle!r}"


@pytest.fixture
def captured_logs() -> Iterator[io.StringIO]:
    """outboxd's JSON logs at debug, plus every stdlib logger at DEBUG, into one buffer."""
    stream = io.StringIO()
    saved = structlog.get_config()
    root = logging.getLogger()
    handler = logging.StreamHandler(stream)
    old_level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    configure_logging(level="debug", fmt="json", stream=stream)
    try:
        yield stream
    finally:
        root.removeHandler(handler)
        root.setLevel(old_level)
        structlog.configure(**saved)


@pytest_asyncio.fixture
async def client(
    make_settings: Any, store: SqlStore, keys: KeyRing, captured_logs: io.StringIO
) -> AsyncIterator[TestClient[Any, Any]]:
    settings: Settings = make_settings(server={"max_body_bytes": MAX_BODY})
    deps = build_api_deps(settings, store, keys, Metrics(), queues=None, dispatcher=None)
    c: TestClient[Any, Any] = TestClient(TestServer(create_app(deps), host="127.0.0.1"))
    await c.start_server()
    yield c
    await c.close()


async def raw_database(store: SqlStore, db_url: str) -> bytes:
    if isinstance(store.db, SqliteDatabase):
        data = b""
        for suffix in ("", "-wal", "-shm"):
            f = Path(str(store.db.path) + suffix)
            if f.exists():
                data += f.read_bytes()
        assert data, "no database files found"
        return data
    return (await pg.dump_all(db_url)).encode("utf-8", "surrogateescape")


async def test_password_never_leaks(
    client: TestClient[Any, Any],
    store: SqlStore,
    keys: KeyRing,
    db_url: str,
    captured_logs: io.StringIO,
) -> None:
    """Across accept, replay, 409, 400, 413 and 415 the password is in no log, body or DB byte."""
    password = f"pw-{uuid.uuid4()}"
    username = f"stu-{uuid.uuid4().hex}"
    body = {"portal": "suwon", "username": username, "password": password}
    responses: list[bytes] = []

    async def post(
        payload: Any, key: str, chunked: bool = False, headers: dict[str, str] | None = None
    ) -> int:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()

        async def chunks() -> AsyncIterator[bytes]:
            for i in range(0, len(data), 512):
                yield data[i : i + 512]

        resp = await client.post(
            URL,
            data=chunks() if chunked else data,
            headers={"Idempotency-Key": key, "Content-Type": "application/json", **(headers or {})},
        )
        responses.append(await resp.read())
        responses.append(json.dumps(dict(resp.headers)).encode())
        return resp.status

    assert await post(body, "k-1") == 202
    assert await post(body, "k-1") == 202  # replay
    job_id = json.loads(responses[0])["jobId"]
    # The same key with another body that still carries the password: 409.
    assert await post({**body, "username": "someone-else"}, "k-1") == 409
    assert await post({**body, "password": password + "!"}, "k-1") == 409
    # The password in an unknown field's value, in a field of the wrong type, too long.
    assert await post({**body, "note": password}, "k-2") == 400
    assert await post({**body, "username": [password]}, "k-3") == 400
    assert await post({**body, "password": password * 10}, "k-4") == 400
    assert await post({**body, "portal": password}, "k-5") == 400
    assert await post(b'{"password": "' + password.encode() + b'", ', "k-6") == 400
    # Too large, with and without Content-Length, and a wrong content type.
    big = {**body, "note": password * 100}
    assert await post(big, "k-7") == 413
    assert await post(big, "k-8", chunked=True) == 413
    assert await post(body, "k-9", headers={"Content-Type": "text/plain"}) == 415
    got = await client.get(f"/v1/jobs/{job_id}")
    assert got.status == 200
    responses.append(await got.read())
    # The timeline, a held request and a cancel answer without it too; the events' rows
    # (in the dump below) hold ids and codes only.
    for path in (f"/v1/jobs/{job_id}/events", "/v1/admin/jobs?user=local"):
        got = await client.get(path)
        assert got.status == 200
        responses.append(await got.read())
    waited = await client.get(
        f"/v1/jobs/{job_id}", headers={"Prefer": "wait=1", "If-None-Match": '"stale"'}
    )
    responses.append(await waited.read())
    cancelled = await client.post(f"/v1/jobs/{job_id}/cancel")
    assert cancelled.status == 202
    responses.append(await cancelled.read())
    events = await store.job_events(job_id)
    assert [e.type for e in events] == ["accepted", "cancelled"]
    assert_absent(password, repr(events).encode(), "the job's events")

    # The credentials were sealed under the current key with the job id as AAD (the
    # replay's job, made before the cancel erased its own), and the cancel erased them.
    job = await store.get_job(job_id)
    assert job is not None and job.sealed is None and job.key_id is None
    assert job.status == "CANCELLED"
    other = await client.post(
        URL, json=body, headers={"Idempotency-Key": "k-after", "Content-Type": "application/json"}
    )
    other_id = (await other.json())["jobId"]
    kept = await store.get_job(other_id)
    assert kept is not None and kept.sealed is not None
    assert kept.key_id == sealing_key_id(keys)
    opened = keys.open_json(Sealed(kept.key_id, kept.sealed), associated_data=other_id)
    assert opened == {"username": username, "password": password}

    logs = captured_logs.getvalue()
    assert "job_accepted" in logs and job_id in logs, "logs were not captured"
    for line in logs.splitlines():
        if line.startswith("{"):
            json.loads(line)  # outboxd's own lines are JSON
    assert_absent(password, logs.encode("utf-8"), "the logs")
    for i, r in enumerate(responses):
        assert_absent(password, r, f"response {i}")
    db = await raw_database(store, db_url)
    assert job_id.encode() in db, "the database dump does not hold the job"
    assert_absent(password, db, "the database")
    assert username.encode() not in db, "the username is stored in plaintext"
    assert username.encode("utf-16-le") not in db
