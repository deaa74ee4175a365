"""The parameters the route tables share: path and query parameters as the OpenAPI
document states them (http/routes.py, http/oversight_routes.py)."""

from __future__ import annotations

from typing import Any, Final

from outboxd.http.endpoints import Param, Schema
from outboxd.http.problems import VALIDATION_FAILED
from outboxd.storage.ports import CURSOR_PATTERN


def path_param(name: str, description: str, **schema: Any) -> Param:
    return Param(name, "path", description, {"type": "string", "minLength": 1, **schema})


def query_param(name: str, description: str, schema: Schema) -> Param:
    return Param(name, "query", description, schema)


def status_param(statuses: tuple[str, ...], description: str) -> Param:
    return query_param("status", description, {"type": "string", "enum": list(statuses)})


JOB_ID: Final = path_param("job_id", "The job id.")
LIMIT: Final = query_param(
    "limit", "Page size.", {"type": "integer", "minimum": 1, "maximum": 500, "default": 50}
)
CURSOR: Final = query_param(
    "cursor",
    "The nextCursor of the previous page; leave it out for the first page (an empty or "
    f"malformed value is {VALIDATION_FAILED.status} {VALIDATION_FAILED.code}).",
    {"type": "string", "pattern": CURSOR_PATTERN},
)
DOMAIN: Final = path_param("domain", "The host name (normalised before the lookup).")
DEPENDENCY: Final = path_param("name", "The outside system.", enum=["portal", "ai", "sqs"])
