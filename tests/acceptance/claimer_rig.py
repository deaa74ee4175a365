"""The claimer's end-to-end rig (test_claimer_e2e, test_pacing_e2e): `outboxd serve`
subprocesses on the test's database and queues, the fake AI as a process of its own
recording every call, and reads of the database with a driver of our own."""

from __future__ import annotations

import itertools
import json
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testkit.daemon import DaemonProcess, FakeProcess
from testkit.moto import MotoServer

from tests.reliability.harness import Db, http

KEY_ENV = "FAKE_AI_KEY"
KEY = "sk-e2e-claimer-77c1"


def get_website(base_url: str, domain: str) -> dict[str, Any]:
    resp = http("GET", base_url, f"/v1/websites/{urllib.parse.quote(domain)}")
    assert resp.status == 200, resp.text
    return dict(resp.json())


def work_rows(db: Db) -> dict[str, dict[str, Any]]:
    """Every work row with its website's domain and category, by domain."""
    rows = db.rows(
        "SELECT w.domain, w.category, o.status, o.attempt_count, o.attempted_at"
        " FROM work_outbox o JOIN websites w ON w.id = o.website_id"
    )
    return {r["domain"]: r for r in rows}


def read_record(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_no_overlap_per_domain(calls: list[dict[str, Any]]) -> None:
    by_domain: dict[str, list[dict[str, Any]]] = {}
    for call in calls:
        by_domain.setdefault(call["domain"], []).append(call)
    for domain, items in by_domain.items():
        items.sort(key=lambda c: c["start"])
        for a, b in itertools.pairwise(items):
            assert b["start"] >= a["end"], f"two concurrent calls for {domain}: {a} {b}"


def daemon_config(
    db_url: str,
    moto: MotoServer,
    queue_names: dict[str, str],
    classifier: dict[str, Any],
    **claimer: Any,
) -> dict[str, Any]:
    return {
        "server": {"host": "127.0.0.1", "port": 0},
        "storage": {"url": db_url},
        "sqs": {"endpoint_url": moto.endpoint_url, "region": "us-east-1", **queue_names},
        "claimer": {
            "fixed_delay_s": 0.2,
            "retry_delay_s": 1.0,
            "processing_timeout_s": 2.0,
            "max_attempts": 5,
            **claimer,
        },
        "scrapers": {"classifier": classifier},
        "daemon": {"roles": ["api", "claimer"], "shutdown_timeout_s": 5.0},
        "logging": {"level": "info", "format": "json"},
    }


def connected_to(port: int) -> bool:
    """Some process of this machine holds an established TCP connection to loopback `port`
    (read from /proc/net/tcp): a client's request to that server is under way."""
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            _sl, _local, remote, state, *_ = line.split()
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                return True
    return False


def openai_classifier(ai: FakeProcess) -> dict[str, Any]:
    return {
        "provider": "openai",
        "base_url": ai.info["base_url"],
        "model": "fake-model",
        "api_key_env": KEY_ENV,
        # Below claimer.processing_timeout_s, as config validation requires.
        "timeout_s": 1.8,
    }


@dataclass
class ClaimerRig:
    """What a claimer end-to-end test works with; every daemon and fake it starts is
    killed at the end whatever happened (close())."""

    backend: str
    db_url: str
    db: Db
    tmp_path: Path
    moto: MotoServer
    queue_names: dict[str, str]
    env: dict[str, str]
    daemons: list[DaemonProcess] = field(default_factory=list)
    fakes: list[FakeProcess] = field(default_factory=list)

    @property
    def record(self) -> Path:
        """The fake AI's record of calls, one JSON line each."""
        return self.tmp_path / "ai-calls.jsonl"

    def start_ai(self, *args: str) -> FakeProcess:
        ai = FakeProcess(
            self.tmp_path,
            "testkit.fakes.ai",
            "--api-key",
            KEY,
            "--record-file",
            str(self.record),
            *args,
        )
        self.fakes.append(ai)
        return ai

    def config(self, classifier: dict[str, Any], **claimer: Any) -> dict[str, Any]:
        return daemon_config(self.db_url, self.moto, self.queue_names, classifier, **claimer)

    def daemon(self, name: str, config: dict[str, Any]) -> DaemonProcess:
        d = DaemonProcess(self.tmp_path / name, config, env=self.env, name=name)
        self.daemons.append(d)
        return d

    def work(self) -> dict[str, dict[str, Any]]:
        return work_rows(self.db)

    def calls(self) -> list[dict[str, Any]]:
        return read_record(self.record)

    def close(self) -> None:
        try:
            for d in self.daemons:
                d.kill()
            for f in self.fakes:
                f.stop()
        finally:
            self.db.close()
