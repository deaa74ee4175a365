"""Task types and status names have one home each; everything else reads them from there."""

from __future__ import annotations

from outboxd.http.openapi import openapi_document
from outboxd.services import tasks
from outboxd.storage import ports


def test_the_task_registry_is_the_one_list_of_task_types() -> None:
    schemas = openapi_document()["components"]["schemas"]
    assert tasks.BUILTIN_TASKS == tuple(tasks.TASK_TYPES) == ("outbox.prune", "noop")
    assert schemas["TaskRequest"]["properties"]["type"]["enum"] == list(tasks.BUILTIN_TASKS)


def test_the_status_tuples_and_the_openapi_enums_come_from_the_literals() -> None:
    schemas = openapi_document()["components"]["schemas"]
    assert ports.JOB_STATUSES == ("QUEUED", "RUNNING", "SUCCEEDED", "FAILED", "DEAD")
    assert ports.RELAY_STATUSES == ("PENDING", "SENT", "RETRYABLE_FAILED", "DEAD", "SUPERSEDED")
    assert schemas["RelayStatus"]["enum"] == list(ports.RELAY_STATUSES)
    assert dict(ports.TABLE_STATUSES) == {
        "jobs": ports.JOB_STATUSES,
        "relay_outbox": ports.RELAY_STATUSES,
        "work_outbox": ports.WORK_STATUSES,
        "task_runs": ports.TASK_STATUSES,
    }
    assert schemas["JobStatus"]["enum"] == list(ports.JOB_STATUSES)
    assert schemas["TaskStatus"]["enum"] == list(ports.TASK_STATUSES)
    assert set(ports.TERMINAL_JOB_STATUSES) <= set(ports.JOB_STATUSES)
    assert set(ports.TERMINAL_TASK_STATUSES) <= set(ports.TASK_STATUSES)
    assert set(ports.RELAY_UNSENT_STATUSES) <= set(ports.RELAY_STATUSES)
