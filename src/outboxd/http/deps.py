"""What the HTTP side is given by the wiring, and the keys it keeps on the app and requests.

The HTTP side sees services and narrow Protocols only: the store through storage/ports.py,
readiness and this process's runtime state through the Protocols below. It never imports
a worker; the wiring (daemon/) hands it objects that fit.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from outboxd.config import Settings
from outboxd.metrics import Metrics
from outboxd.security import Principal, TokenVerifier
from outboxd.services.admin import AdminService
from outboxd.services.audit import AuditLog
from outboxd.services.breakers import Breakers
from outboxd.services.gauges import ReadinessCheck, StatsGauges
from outboxd.services.job_waits import JobWaits
from outboxd.services.portal_jobs import PortalJobService
from outboxd.services.portal_logins import PortalLoginAdmin
from outboxd.services.tasks import TaskService
from outboxd.services.websites import WebsiteService
from outboxd.storage.ports import JobStore, RelayStore, StatsStore, TaskStore
from outboxd.tracing import NO_TRACING, Tracing


class ApiStore(JobStore, RelayStore, TaskStore, StatsStore, Protocol):
    pass


class RuntimeView(Protocol):
    """This process's in-memory state for the console (daemon/runtime.py implements it)."""

    def claimer_pace(self) -> tuple[float | None, float | None, float | None] | None: ...
    def schedules(self) -> list[tuple[str, str, float]]: ...
    def throughput_series(self) -> list[tuple[float, int, int, int]]: ...


@dataclass(frozen=True)
class ApiDeps:
    settings: Settings
    store: ApiStore
    jobs: PortalJobService
    websites: WebsiteService
    tasks: TaskService
    admin: AdminService
    tokens: TokenVerifier
    metrics: Metrics
    readiness: ReadinessCheck
    gauges: StatsGauges
    # The portal login lock's listing and unlock.
    logins: PortalLoginAdmin
    runtime: RuntimeView | None = None
    # Requests held on a job (`Prefer: wait`); None: every request is answered at once.
    waits: JobWaits | None = None
    tracing: Tracing = NO_TRACING
    # The outside systems' breakers: their state, pause and resume (services/breakers.py).
    breakers: Breakers | None = None
    # Every attempted change through an admin route (services/audit.py).
    audit: AuditLog | None = None


DEPS = web.AppKey("deps", ApiDeps)
# The audit log's row of this request (services/audit.py): set by a handler whose route is
# not audited by itself (a cancel of another user's job), or to name the target and the
# reason better than the path does.
AUDITED = web.RequestKey("audited", bool)
AUDIT_TARGET = web.RequestKey("audit_target", str)
AUDIT_REASON = web.RequestKey("audit_reason", str)
REQUEST_ID = web.RequestKey("request_id", str)
PRINCIPAL = web.RequestKey("principal", Principal)


def deps_of(request: web.Request) -> ApiDeps:
    return request.app[DEPS]


def principal_of(request: web.Request) -> Principal:
    return request[PRINCIPAL]


OPENAPI_JSON = web.AppKey("openapi_json", bytes)
