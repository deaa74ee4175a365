"""The Prometheus metrics of one daemon: every series outboxd exports, in one registry."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector

from outboxd import __version__


def package_version() -> str:
    """The release number of the code running (`outboxd.__version__`): the same from a wheel,
    an editable install or a bare source tree, whatever metadata the environment holds."""
    return __version__


# The tables whose rows can become DEAD (`outboxd_dead_total`), by the names the stats use.
DEAD_TABLES = ("jobs", "relay_outbox", "task_runs")
# Where the stats gauges come from (`outboxd_stats_refresh_success{source}`).
STATS_SOURCES = ("database", "sqs")
# How one request to the portal or the AI provider ended (`outboxd_portal_requests_total`,
# `outboxd_ai_requests_total`): answered (`ok`), refused (`rejected`: a 4xx or a rejected
# login), `unavailable` (5xx), `rate_limited` (429), `timeout`, or `error` (no answer:
# refused, reset, unresolvable).
RequestOutcome = Literal["ok", "rejected", "unavailable", "rate_limited", "timeout", "error"]
REQUEST_OUTCOMES: tuple[RequestOutcome, ...] = get_args(RequestOutcome)
# The outside systems with a breaker, and the states each can be in (docs/contract.md).
DEPENDENCIES = ("portal", "ai", "sqs")
DependencyState = Literal["up", "down", "maintenance", "paused"]
DEPENDENCY_STATES: tuple[DependencyState, ...] = get_args(DependencyState)


class Metrics:
    """One registry per daemon (not the global one), so tests can run several apps.

    `roles` are the daemon's roles (all of them when None): a gauge that only one role
    sets is registered only where that role runs, so a process without the claimer
    exports no claimer tick to alert on.
    `schema` is the newest migration this code knows for its database (build_info's
    `schema` label; empty when not given).
    """

    def __init__(self, roles: Iterable[str] | None = None, schema: int | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        running = None if roles is None else frozenset(roles)

        # One call a metric: its name, help text and label names; a gauge that only one role
        # sets names that role.
        def counter(name: str, doc: str, *labels: str) -> Counter:
            return Counter(name, doc, labels, registry=r)

        def histogram(name: str, doc: str, *labels: str) -> Histogram:
            return Histogram(name, doc, labels, registry=r)

        def gauge(name: str, doc: str, *labels: str, role: str | None = None) -> Gauge:
            here = role is None or running is None or role in running
            return Gauge(name, doc, labels, registry=r if here else None)

        ProcessCollector(registry=r)
        self.build_info = gauge(
            "outboxd_build_info",
            "Always 1; `version` is outboxd's, `schema` the newest migration it knows",
            "version",
            "schema",
        )
        self.build_info.labels(package_version(), "" if schema is None else str(schema)).set(1)
        self.http_requests = counter(
            "outboxd_http_requests", "HTTP requests by route and status", "route", "status"
        )
        self.http_latency = histogram(
            "outboxd_http_request_duration_seconds", "HTTP request duration", "route"
        )
        self.jobs_accepted = counter("outboxd_jobs_accepted", "Portal jobs accepted")
        self.publishes = counter(
            "outboxd_relay_publishes", "Outbox rows published, by result", "result"
        )
        self.send_window = gauge(
            "outboxd_relay_send_window",
            "SendMessageBatch calls the relay may have at SQS at once (narrower while SQS is slow)",
        )
        self.claims = counter("outboxd_claims", "Work-outbox rows claimed, by outcome", "outcome")
        self.handler_duration = histogram(
            "outboxd_handler_duration_seconds", "Queue handler duration", "kind", "outcome"
        )
        self.dead = counter("outboxd_dead", "Rows this process made DEAD, by table", "table")
        for table in DEAD_TABLES:
            # Exported from the start at 0: the first DEAD row is an increase, not a new series.
            self.dead.labels(table)
        self.portal_requests = counter(
            "outboxd_portal_requests", "Requests to the portal, by outcome", "outcome"
        )
        self.ai_requests = counter(
            "outboxd_ai_requests", "Requests to the AI provider, by outcome", "outcome"
        )
        for outcome in REQUEST_OUTCOMES:
            self.portal_requests.labels(outcome)
            self.ai_requests.labels(outcome)
        self.rows = gauge("outboxd_rows", "Rows by table and status", "table", "status")
        self.oldest_pending_age = gauge(
            "outboxd_oldest_pending_age_seconds", "Age of the oldest pending row", "table"
        )
        self.oldest_running_job_age = gauge(
            "outboxd_oldest_running_job_age_seconds",
            "Age (since it was accepted) of the oldest RUNNING job, 0 when none runs",
        )
        # Growth in sight (storage/growth_ports.py): cluster-wide, read from the database.
        self.table_bytes = gauge(
            "outboxd_table_bytes",
            "Bytes a table takes on disk, its indexes and TOAST included (SQLite: `*` the file's "
            "tables together when it is not split by table, `*free` its free pages)",
            "table",
        )
        self.table_live_rows = gauge(
            "outboxd_table_live_rows",
            "Live rows of a table, as the statistics estimate them (Postgres only)",
            "table",
        )
        self.table_dead_rows = gauge(
            "outboxd_table_dead_rows",
            "Dead rows of a table waiting for vacuum, as the statistics estimate them "
            "(Postgres only)",
            "table",
        )
        self.oldest_transaction_age = gauge(
            "outboxd_oldest_transaction_age_seconds",
            "Age of the oldest transaction open in the database, which holds back vacuum "
            "(0: none; always 0 on SQLite)",
        )
        self.queue_depth = gauge(
            "outboxd_queue_depth", "SQS messages by queue and state", "queue", "state"
        )
        self.ready = gauge(
            "outboxd_ready",
            "1 when the readiness check passes (as /readyz), 0 when it fails",
            "check",
        )
        self.stats_refresh_success = gauge(
            "outboxd_stats_refresh_success",
            "1 when the last refresh of the gauges read from this source succeeded, "
            "0 when they are stale",
            "source",
        )
        self.stats_last_success = gauge(
            "outboxd_stats_last_success_timestamp_seconds",
            "Unix time the gauges read from this source were last refreshed",
            "source",
        )
        self.claimer_last_tick = gauge(
            "outboxd_claimer_last_tick_timestamp_seconds",
            "Unix time the claimer last finished a tick (idle ones too)",
            role="claimer",
        )
        self.consumer_last_receive = gauge(
            "outboxd_consumer_last_receive_timestamp_seconds",
            "Unix time the consumer last had an answer from a receive on this queue "
            "(empty ones too)",
            "queue",
            role="consumer",
        )
        # Cluster pacing (docs/pacing.md): one series per pace row, database clock.
        self.pace_last_slot = gauge(
            "outboxd_pace_last_slot_timestamp_seconds",
            "Start of the last slot handed out, per paced resource (0: none yet)",
            "resource",
        )
        self.pace_next_slot = gauge(
            "outboxd_pace_next_slot_timestamp_seconds",
            "Earliest start of the next slot, per paced resource (0: none yet)",
            "resource",
        )
        self.pace_paused_until = gauge(
            "outboxd_pace_paused_until_timestamp_seconds",
            "End of the pause a provider's Retry-After set, per paced resource (0: never)",
            "resource",
        )
        self.pace_sessions = gauge(
            "outboxd_pace_sessions", "Session leases held now, per paced resource", "resource"
        )
        # The outside systems' breakers (services/breakers.py): cluster-wide, same on every
        # instance (aggregate with max).
        self.dependency_state = gauge(
            "outboxd_dependency_state",
            "1 for a dependency's current state (up, down, maintenance, paused), 0 for the others",
            "dependency",
            "state",
        )
        self.dependency_waiting = gauge(
            "outboxd_dependency_waiting", "Jobs or rows waiting for a dependency", "dependency"
        )
        self.dependency_outages = counter(
            "outboxd_dependency_outage_failures",
            "Runs this process saw end in an outage failure of a dependency",
            "dependency",
        )
        for name in DEPENDENCIES:
            self.dependency_outages.labels(name)
            self.dependency_waiting.labels(name)
            for state in DEPENDENCY_STATES:
                self.dependency_state.labels(name, state).set(1 if state == "up" else 0)

    def portal_request(self, outcome: RequestOutcome) -> None:
        """Count one request to the portal (the scraper's callback)."""
        self.portal_requests.labels(outcome).inc()

    def ai_request(self, outcome: RequestOutcome) -> None:
        """Count one request to the AI provider (the classifier's callback)."""
        self.ai_requests.labels(outcome).inc()
