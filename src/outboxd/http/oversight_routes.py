"""The routes of the operator's oversight: the outside systems' state, pause and resume
(services/breakers.py) and the audit log (services/audit.py), in the one route table
(`http/routes.py` ROUTES) like every other route."""

from __future__ import annotations

from typing import Final

from outboxd.http import audit, audit_models, dependencies, dependency_models, models
from outboxd.http.endpoints import Ok, Route
from outboxd.http.params import CURSOR, DEPENDENCY, LIMIT, query_param
from outboxd.http.problems import (
    NOT_FOUND,
    PAYLOAD_TOO_LARGE,
    STORAGE_UNAVAILABLE,
    UNSUPPORTED_MEDIA_TYPE,
    VALIDATION_FAILED,
)

_NO_CONTROL_CHARS: Final = f"^[^{models.NO_CONTROLS}]*$"
_TEXT_128: Final = {"type": "string", "maxLength": 128, "pattern": _NO_CONTROL_CHARS}
_BODY_ERRORS: Final = (VALIDATION_FAILED, PAYLOAD_TOO_LARGE, UNSUPPORTED_MEDIA_TYPE)

OVERSIGHT_ROUTES: Final[tuple[Route, ...]] = (
    Route(
        "GET",
        "/v1/admin/audit",
        audit.list_audit,
        "listAudit",
        "admin",
        "The audit log, newest first: every attempted change through an admin route, a cancel "
        "of another user's job and every state-changing CLI command, done or refused.",
        ok=(Ok(200, "A page of rows.", audit_models.AuditPage),),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
        params=(
            query_param("actor", "Only this actor's rows.", _TEXT_128),
            query_param(
                "action",
                "Only this action (an operationId, or a CLI command).",
                {"type": "string", "maxLength": 64, "pattern": _NO_CONTROL_CHARS},
            ),
            query_param(
                "since",
                "Only rows at or after this time (RFC 3339).",
                {"type": "string", "format": "date-time"},
            ),
            LIMIT,
            CURSOR,
        ),
    ),
    Route(
        "GET",
        "/v1/admin/dependencies",
        dependencies.list_dependencies,
        "listDependencies",
        "admin",
        "Each outside system's state (up, down, maintenance, paused) and its waiting work.",
        ok=(Ok(200, "portal, ai and sqs.", dependency_models.DependencyList),),
        errors=(VALIDATION_FAILED, STORAGE_UNAVAILABLE),
        access="viewer",
    ),
    Route(
        "POST",
        "/v1/admin/dependencies/{name}/pause",
        dependencies.pause_dependency,
        "pauseDependency",
        "admin",
        "Stop calling an outside system, on every instance within a second and across restarts, "
        "with a reason, for forS seconds, until a time, or until resumed; work waits, unspent.",
        ok=(Ok(200, "The dependency, paused.", dependency_models.Dependency),),
        errors=(*_BODY_ERRORS, NOT_FOUND, STORAGE_UNAVAILABLE),
        access="operator",
        request=dependency_models.PauseRequest,
        params=(DEPENDENCY,),
    ),
    Route(
        "POST",
        "/v1/admin/dependencies/{name}/resume",
        dependencies.resume_dependency,
        "resumeDependency",
        "admin",
        "Lift an operator's pause: the work that waited goes out at the configured pace.",
        ok=(Ok(200, "The dependency.", dependency_models.Dependency),),
        errors=(NOT_FOUND, STORAGE_UNAVAILABLE),
        access="operator",
        params=(DEPENDENCY,),
    ),
)
