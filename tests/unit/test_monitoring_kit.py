"""contrib/: the alert rules and the dashboard name only metrics the daemon exports, the
rules pass promtool (syntax and behaviour), and docs/operations.md lists every metric."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from outboxd.metrics import REQUEST_OUTCOMES, Metrics

ROOT = Path(__file__).resolve().parents[2]
ALERTS = ROOT / "contrib" / "prometheus" / "alerts.yml"
DASHBOARD = ROOT / "contrib" / "grafana" / "outboxd.json"
ALERT_TESTS = Path(__file__).parent / "data" / "alerts_test.yml"
METRIC = re.compile(r"\b(?:outboxd|process)_[a-z_]+\b")
SUFFIXES = {
    "counter": ("_total", "_created"),
    "gauge": ("",),
    "histogram": ("_bucket", "_count", "_sum", "_created"),
}


def exported_names() -> set[str]:
    """Every series name the registry can expose (a counter's _total, a histogram's _bucket...)."""
    names: set[str] = set()
    for family in Metrics().registry.collect():
        names.update(family.name + s for s in SUFFIXES[family.type])
    return names


def alert_exprs() -> list[str]:
    """The `expr:` values of the rules file (block scalars included)."""
    exprs: list[str] = []
    lines = ALERTS.read_text().splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)expr:\s*(.*)$", line)
        if not m:
            continue
        if m.group(2) not in (">-", "|", ">"):
            exprs.append(m.group(2))
            continue
        body = []
        for nxt in lines[i + 1 :]:
            if nxt.strip() and len(nxt) - len(nxt.lstrip()) <= len(m.group(1)):
                break
            body.append(nxt.strip())
        exprs.append(" ".join(body))
    return exprs


def panel_exprs() -> list[str]:
    dash = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_every_metric_an_alert_names_exists() -> None:
    exprs = alert_exprs()
    assert len(exprs) >= 7
    named = {n for e in exprs for n in METRIC.findall(e)}
    assert named, exprs
    assert named <= exported_names(), named - exported_names()


def test_every_metric_a_panel_names_exists() -> None:
    exprs = panel_exprs()
    named = {n for e in exprs for n in METRIC.findall(e)}
    assert len(named) >= 8, named
    assert named <= exported_names(), named - exported_names()


def test_the_alerts_cover_what_operators_need() -> None:
    text = ALERTS.read_text()
    for alert in (
        "OutboxdDown",
        "OutboxdDeadRowsRising",
        "OutboxdOldestPendingTooOld",
        "OutboxdDlqNotEmpty",
        "OutboxdNotReady",
        "OutboxdStatsStale",
        "OutboxdClaimerNotTicking",
        "OutboxdConsumerNotReceiving",
        "OutboxdRelayFailing",
        "OutboxdRateLimited",
        "OutboxdRestarting",
        "OutboxdPortalFailing",
        "OutboxdAiFailing",
        "OutboxdJobRunningTooLong",
        "OutboxdVacuumFallingBehind",
        "OutboxdTransactionHeldOpen",
    ):
        assert f"alert: {alert}" in text, alert


def test_the_promtool_cases_use_exported_series() -> None:
    """The input series of the promtool cases are named as the daemon exports them, and a
    request counter's `outcome` is one the daemon counts: a case on a made-up series would
    pass while the rule never fires in production."""
    cases = ALERT_TESTS.read_text()
    series = re.findall(r'^\s*- series: "(\w+)\{(.*)\}"$', cases, re.MULTILINE)
    assert len(series) > 50
    unknown = {name for name, _ in series if name != "up"} - exported_names()
    assert unknown == set()
    for name, labels in series:
        if name in ("outboxd_portal_requests_total", "outboxd_ai_requests_total"):
            outcome = re.search(r'outcome=\\"(\w+)\\"', labels)
            assert outcome and outcome.group(1) in REQUEST_OUTCOMES, (name, labels)


def test_the_request_counters_start_at_zero_for_every_outcome() -> None:
    """Every outcome of the portal and AI counters is exported from the start, so a share of
    failures has a denominator before the first failure and the first one is an increase."""
    text = generate_latest(Metrics().registry).decode()
    for family in ("outboxd_portal_requests_total", "outboxd_ai_requests_total"):
        for outcome in REQUEST_OUTCOMES:
            assert f'{family}{{outcome="{outcome}"}} 0.0' in text, (family, outcome)


def test_every_alert_has_a_promtool_case_that_fires() -> None:
    """Each rule is exercised by tests/unit/data/alerts_test.yml with an alert expected."""
    names = re.findall(r"^\s*- alert: (\w+)$", ALERTS.read_text(), re.MULTILINE)
    cases = ALERT_TESTS.read_text()
    for name in names:
        fired = re.search(rf"alertname: {name}\n\s*exp_alerts:\n\s*- exp_labels", cases)
        assert fired, f"no promtool case expects {name} to fire"


CLUSTER_WIDE = re.compile(
    r"\b(?:outboxd_rows|outboxd_oldest_pending_age_seconds|outboxd_oldest_running_job_age_seconds"
    r"|outboxd_queue_depth|outboxd_pace_\w+|outboxd_table_\w+"
    r"|outboxd_oldest_transaction_age_seconds)\b"
)
SUM = re.compile(r"\bsum\s*(?:(?:by|without)\s*\([^()]*\)\s*)?\(")


def summed_parts(expr: str) -> list[str]:
    """The argument of every `sum(...)` / `sum by (...) (...)` in a PromQL expression."""
    parts = []
    for m in SUM.finditer(expr):
        depth, i = 1, m.end()
        while depth and i < len(expr):
            depth += {"(": 1, ")": -1}.get(expr[i], 0)
            i += 1
        parts.append(expr[m.end() : i - 1])
    return parts


def test_cluster_wide_gauges_are_never_summed() -> None:
    """Every instance exports the same row counts, ages, queue depths, pace and growth: a sum
    would show N instances as N times the truth (they are taken with max)."""
    assert summed_parts("sum by (table) (outboxd_rows)") == ["outboxd_rows"]
    for expr in alert_exprs() + panel_exprs():
        for part in summed_parts(expr):
            assert not CLUSTER_WIDE.search(part), expr


def test_operations_doc_lists_every_metric() -> None:
    """The metrics table of docs/operations.md ("Metrics and alerts") names every family."""
    doc = (ROOT / "docs/operations.md").read_text()
    table = doc.split("## Metrics and alerts", 1)[1].split("\n## ", 1)[0]
    for family in Metrics().registry.collect():
        shown = family.name + ("_total" if family.type == "counter" else "")
        assert f"| `{shown}` |" in table, shown


def _promtool() -> str:
    path = shutil.which("promtool")
    if path is None:
        msg = "promtool not on PATH (Debian: apt-get install prometheus)"
        if os.environ.get("OUTBOXD_REQUIRE_POSTGRES"):  # CI: .ci/run installs it
            pytest.fail(msg)
        pytest.skip(msg)
    return path


def test_promtool_check_rules() -> None:
    done = subprocess.run(
        [_promtool(), "check", "rules", str(ALERTS)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_promtool_alert_unit_tests() -> None:
    """Each alert fires on the series it is meant for (and not before)."""
    done = subprocess.run(
        [_promtool(), "test", "rules", ALERT_TESTS.name],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ALERT_TESTS.parent,
    )
    assert done.returncode == 0, done.stdout + done.stderr
