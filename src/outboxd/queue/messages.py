"""The body of an outboxd SQS message: written by the relay, read by the consumer.

A body carries ids only (`type`, `jobId` or `taskId`, and `outboxId`); everything else,
credentials included, stays in the database where the consumer reads it. This module is
the one place that knows the field names, so the writer and the reader cannot drift.
"""

from __future__ import annotations

import json
from typing import Literal

import msgspec

IdField = Literal["jobId", "taskId", "outboxId"]
# msgspec, not json.dumps: the relay encodes a body per message
# (docs/decisions/0005-relay-rounds.md); compact JSON, the same fields in the same order.
_encode = msgspec.json.Encoder().encode


def encode_job(job_id: str, outbox_id: str) -> str:
    """The body of a portal-link job's message."""
    return _encode({"type": "portal_link", "jobId": job_id, "outboxId": outbox_id}).decode()


def encode_task(task_id: str, outbox_id: str) -> str:
    """The body of a task run's message."""
    return _encode({"type": "task", "taskId": task_id, "outboxId": outbox_id}).decode()


def id_field(body: str, key: IdField) -> str | None:
    """One id from a body, or None when the body is not ours (not JSON, not an object,
    the field absent, empty or not a string): the caller treats that as malformed."""
    try:
        data = json.loads(body)
    except ValueError:
        return None
    value = data.get(key) if isinstance(data, dict) else None
    return value if isinstance(value, str) and value else None
