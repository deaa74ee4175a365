"""The `outboxd` command as an operator runs it (docs/contract.md#cli): exit codes and output.

Exit 0 on success, 2 on bad usage or config (one line naming the key), 1 otherwise.
Every command runs as a subprocess against the test's database, without a daemon.
"""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from testkit.moto import free_port

from outboxd.security import KeyRing, hash_token
from outboxd.storage.store import SqlStore
from tests.support.db import sql
from tests.support.ops import (
    db_counts,
    dead_jobs_of_every_kind,
    jobs_in_each_status,
    kill_at_publish,
    kill_in_processing,
    run_cli,
    submit_job,
    write_config,
)


def config_for(tmp_path: Path, db_url: str, **extra: Any) -> str:
    config: dict[str, Any] = {
        "storage": {"url": db_url},
        "sqs": {"endpoint_url": "embedded"},  # never AWS from a test
        **extra,
    }
    return str(write_config(tmp_path, config))


def test_migrate_twice(fresh_db_url: str, tmp_path: Path) -> None:
    if fresh_db_url.startswith("sqlite"):
        (tmp_path / "fresh").mkdir()
    config = config_for(
        tmp_path, fresh_db_url, storage={"url": fresh_db_url, "auto_migrate": False}
    )
    first = run_cli("migrate", "--config", config)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith("applied: "), first.stdout
    second = run_cli("migrate", "--config", config)
    assert second.returncode == 0, second.stderr
    assert second.stdout.strip() == "up to date"
    # The schema is there: status can read every table.
    status = run_cli("status", "--json", "--config", config)
    assert status.returncode == 0, status.stderr


async def test_status_human_output(
    store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path
) -> None:
    await jobs_in_each_status(store, keys)
    truth = await db_counts(db_url)
    done = run_cli("status", "--config", config_for(tmp_path, db_url))
    assert done.returncode == 0, done.stderr
    shown: dict[tuple[str, str], int] = {}
    for line in done.stdout.splitlines():
        m = re.fullmatch(r"(\w+)\s+([A-Z_]+)\s+(\d+)", line.strip())
        if m:
            shown[(m[1], m[2])] = int(m[3])
    assert shown == {(t, s): n for t, per in truth.items() for s, n in per.items()}
    assert re.search(r"oldest pending jobs\s+\d+\.\d s", done.stdout), done.stdout
    assert re.search(r"oldest pending work_outbox\s+-", done.stdout), done.stdout
    # The embedded SQS lives inside the daemon: status says so instead of failing.
    assert "queues: not reachable" in done.stdout


async def test_outbox_list_dead_and_redrive(
    store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path
) -> None:
    config = config_for(tmp_path, db_url)
    pending = await submit_job(store, keys, key="p")
    dead_rows = [
        await kill_at_publish(store, (await submit_job(store, keys, key=f"d{i}")).id, f"err {i}")
        for i in range(2)
    ]

    listed = run_cli("outbox", "list", "--status", "DEAD", "--config", config)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:4] == ["id", "kind", "status", "att"]
    ids = [line.split()[0] for line in lines[1:] if line.strip()]
    assert sorted(ids) == sorted(r.id for r in dead_rows)
    assert all(" DEAD " in line for line in lines[1:])
    assert "err 0" in listed.stdout and "err 1" in listed.stdout

    as_json = run_cli("outbox", "list", "--status", "DEAD", "--json", "--config", config)
    assert as_json.returncode == 0
    items = json.loads(as_json.stdout)
    assert sorted(i["id"] for i in items) == sorted(r.id for r in dead_rows)
    assert all(i["status"] == "DEAD" and i["kind"] == "job" for i in items)

    target = dead_rows[0]
    ok = run_cli("outbox", "redrive", target.id, "--config", config)
    assert ok.returncode == 0, ok.stderr
    assert target.id in ok.stdout
    # The action's log line, on stderr (stdout is the command's output): who ran it.
    (logged,) = [json.loads(line) for line in ok.stderr.splitlines()]
    assert logged["event"] == "outbox_redriven" and logged["outbox_id"] == target.id
    assert logged["actor"].startswith("cli:") and len(logged["actor"]) > 4, logged
    row = await store.get_relay_row(target.id)
    assert row is not None and (row.status, row.attempt_count) == ("PENDING", 0)
    job = await store.get_job(target.job_id or "")
    assert job is not None and job.status == "QUEUED"

    again = run_cli("outbox", "redrive", target.id, "--config", config)
    assert again.returncode == 1
    assert "not DEAD" in again.stderr and again.stdout == ""

    pending_row = await store.latest_relay_row_for_job(pending.id)
    assert pending_row is not None
    not_dead = run_cli("outbox", "redrive", pending_row.id, "--config", config)
    assert not_dead.returncode == 1
    assert "PENDING" in not_dead.stderr

    missing = run_cli("outbox", "redrive", str(uuid.uuid4()), "--config", config)
    assert missing.returncode == 1
    assert "no outbox row" in missing.stderr
    assert "Traceback" not in missing.stderr + not_dead.stderr + again.stderr

    # Only the one redrive changed anything.
    remaining = run_cli("outbox", "list", "--status", "DEAD", "--json", "--config", config)
    assert [i["id"] for i in json.loads(remaining.stdout)] == [dead_rows[1].id]


async def test_jobs_redrive(store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path) -> None:
    config = config_for(tmp_path, db_url)
    job = await submit_job(store, keys)
    await kill_in_processing(store, job.id)
    ok = run_cli("jobs", "redrive", job.id, "--config", config, env={"SUDO_USER": "alice"})
    assert ok.returncode == 0, ok.stderr
    (logged,) = [json.loads(line) for line in ok.stderr.splitlines()]
    assert (logged["event"], logged["job_id"]) == ("job_redriven", job.id)
    assert logged["actor"] == "cli:alice"  # run through sudo by alice
    fresh = await store.get_job(job.id)
    assert fresh is not None and fresh.status == "QUEUED" and fresh.error_code is None
    latest = await store.latest_relay_row_for_job(job.id)
    assert latest is not None and latest.status == "PENDING"
    ph = "?" if db_url.startswith("sqlite") else "$1"
    rows = await sql(db_url, f"SELECT COUNT(*) FROM relay_outbox WHERE job_id = {ph}", job.id)
    assert rows[0][0] == 2

    queued = run_cli("jobs", "redrive", job.id, "--config", config)
    assert queued.returncode == 1 and "QUEUED" in queued.stderr
    missing = run_cli("jobs", "redrive", "no-such-job", "--config", config)
    assert missing.returncode == 1 and "no job" in missing.stderr


async def test_jobs_events(store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path) -> None:
    """A job's timeline as a table and as the API's JSON; the redrive names the CLI's
    daemon.instance_id; a missing job exits 1."""
    config = config_for(tmp_path, db_url, daemon={"instance_id": "ops-cli"})
    job = await submit_job(store, keys)
    await kill_in_processing(store, job.id)
    assert run_cli("jobs", "redrive", job.id, "--config", config).returncode == 0
    table = run_cli("jobs", "events", job.id, "--config", config)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"job {job.id}  QUEUED")
    assert [line.split()[2] for line in lines[2:]][-1] == "redriven"
    assert "ops-cli" in lines[-1] and '"outboxId"' in lines[-1]
    as_json = run_cli("jobs", "events", job.id, "--json", "--config", config)
    assert as_json.returncode == 0, as_json.stderr
    body = json.loads(as_json.stdout)
    assert body["jobId"] == job.id
    types = [e["type"] for e in body["events"]]
    assert types[0] == "accepted" and types[-1] == "redriven"
    assert body["events"][-1]["status"] == "QUEUED" and body["events"][-1]["instance"] == "ops-cli"
    assert [e.type for e in await store.job_events(job.id)] == types
    missing = run_cli("jobs", "events", str(uuid.uuid4()), "--config", config)
    assert missing.returncode == 1 and "no job" in missing.stderr


async def test_jobs_list(store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path) -> None:
    config = config_for(tmp_path, db_url)
    queued = await submit_job(store, keys, key="q")
    dead = [await submit_job(store, keys, key=f"d{i}") for i in range(3)]
    for job in dead:
        await kill_at_publish(store, job.id, f"err {job.id[-4:]}")

    listed = run_cli("jobs", "list", "--status", "DEAD", "--config", config)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert lines[0].split()[:3] == ["id", "status", "att"]
    # Newest first, each with its error.
    assert [line.split()[0] for line in lines[1:]] == [j.id for j in reversed(dead)]
    assert all(" DEAD " in line and "RETRIES_EXHAUSTED" in line for line in lines[1:])

    limited = run_cli(
        "jobs", "list", "--status", "DEAD", "--limit", "2", "--json", "--config", config
    )
    assert limited.returncode == 0, limited.stderr
    items = json.loads(limited.stdout)
    assert [i["jobId"] for i in items] == [dead[2].id, dead[1].id]
    assert all(i["status"] == "DEAD" and i["error"]["code"] == "RETRIES_EXHAUSTED" for i in items)

    everything = json.loads(run_cli("jobs", "list", "--json", "--config", config).stdout)
    assert {i["jobId"] for i in everything} == {queued.id, *(j.id for j in dead)}
    bad = run_cli("jobs", "list", "--status", "LOST", "--config", config)
    assert bad.returncode == 2 and "usage:" in bad.stderr


async def test_jobs_redrive_every_dead_job(
    store: SqlStore, keys: KeyRing, db_url: str, tmp_path: Path
) -> None:
    """The bulk redrive: refused without --yes, then a progress line per batch and the
    count; each job's DEAD relay rows superseded; an unredrivable job named, exit 1."""
    config = config_for(tmp_path, db_url)
    dead = await dead_jobs_of_every_kind(store, keys, at_publish=120)
    erased, at_publish, in_processing = dead.erased, dead.at_publish, dead.in_processing
    before = await db_counts(db_url)
    assert before["jobs"] == {"DEAD": 122}
    # The erased job's SENT row went with its credentials (outbox.prune).
    assert before["relay_outbox"] == {"DEAD": 120, "SENT": 1}

    unconfirmed = run_cli("jobs", "redrive", "--status", "DEAD", "--config", config)
    assert unconfirmed.returncode == 2
    assert "--yes" in unconfirmed.stderr and unconfirmed.stdout == ""
    assert await db_counts(db_url) == before
    both = run_cli("jobs", "redrive", erased.id, "--status", "DEAD", "--yes", "--config", config)
    assert both.returncode == 2 and await db_counts(db_url) == before
    neither = run_cli("jobs", "redrive", "--config", config)
    assert neither.returncode == 2 and await db_counts(db_url) == before

    done = run_cli("jobs", "redrive", "--status", "DEAD", "--yes", "--config", config)
    assert done.returncode == 1, done.stderr  # one job could not be redriven
    out = done.stdout.splitlines()
    assert out[0] == "DEAD jobs to redrive: 122"
    # A batch is a hundred jobs, newest first: the erased job is in the second.
    assert out[1:3] == ["redriven 100/122, refused 0", "redriven 121/122, refused 1"]
    assert (
        out[3] == f"refused {erased.id}: the job's credentials were erased; it cannot be redriven"
    )
    assert out[-1] == "redriven: 121 jobs, refused: 1"
    after = await db_counts(db_url)
    assert after["jobs"] == {"QUEUED": 121, "DEAD": 1}
    assert after["relay_outbox"] == {"SUPERSEDED": 120, "SENT": 1, "PENDING": 121}
    # The acting user of every batch, on stderr (stdout stays the operator's).
    audit = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    batches = [e for e in audit if e["event"] == "jobs_redriven"]
    assert [e["count"] for e in batches] == [100, 21]
    assert all(e["actor"].startswith("cli:") for e in batches)
    assert {i for e in batches for i in e["job_ids"]} == {
        j.id for j in [*at_publish, in_processing]
    }

    nothing = run_cli(
        "jobs", "redrive", "--status", "DEAD", "--yes", "--limit", "5", "--config", config
    )
    assert nothing.returncode == 1  # the erased one is still refused
    assert nothing.stdout.splitlines()[0] == "DEAD jobs to redrive: 1"


@pytest.mark.parametrize(
    ("toml", "key"),
    [
        ("[sqs]\nwait_time_s = 30\n", "sqs.wait_time_s"),
        ("[server]\nbogus = 1\n", "server.bogus"),
        ('[relay]\nbatch_size = "ten"\n', "relay.batch_size"),
        ('[storage]\nurl = "mysql://x"\n', "storage.url"),
        ("[server\n", "invalid TOML"),
    ],
)
def test_bad_config_exits_2_with_one_line(tmp_path: Path, toml: str, key: str) -> None:
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    for command in (["status"], ["outbox", "list"]):
        done = run_cli(*command, "--config", str(path))
        assert done.returncode == 2, (command, done.stderr)
        err = done.stderr.strip()
        assert len(err.splitlines()) == 1, err
        assert key in err, err
        assert done.stdout == ""


def test_missing_config_file_exits_2(tmp_path: Path) -> None:
    done = run_cli("status", "--config", str(tmp_path / "nope.toml"))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1
    assert "not found" in done.stderr


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        [],
        ["outbox"],
        ["outbox", "purge"],
        ["outbox", "list", "--status", "LOST"],
        ["status", "--bogus"],
        ["token", "create"],
    ],
)
def test_bad_usage_exits_2(argv: list[str]) -> None:
    done = run_cli(*argv)
    assert done.returncode == 2, done
    assert "usage:" in done.stderr
    assert "Traceback" not in done.stderr


def test_database_down_exits_1_with_one_line(tmp_path: Path) -> None:
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/nothing"
    config = config_for(tmp_path, url, storage={"url": url, "acquire_timeout_s": 1})
    for command in (["status"], ["outbox", "redrive", "x"]):
        done = run_cli(*command, "--config", config)
        assert done.returncode == 1, done
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert "Traceback" not in done.stderr


def test_check_config_keygen_and_token(tmp_path: Path) -> None:
    db_url = f"sqlite:///{tmp_path / 'x.db'}"
    ok = run_cli("check-config", "--config", config_for(tmp_path, db_url))
    assert ok.returncode == 0 and ok.stdout.strip() == "config OK"

    key = run_cli("keygen")
    assert key.returncode == 0
    assert len(key.stdout.splitlines()) == 1
    KeyRing.from_lines(key.stdout.splitlines(), "keygen")  # the format keys_file holds

    tok = run_cli("token", "create", "--user", "ops", "--role", "admin")
    assert tok.returncode == 0
    token, *entry = tok.stdout.splitlines()
    assert entry[0] == "[[auth.tokens]]"
    assert f'sha256 = "{hash_token(token)}"' in entry
    assert 'role = "admin"' in entry and 'user = "ops"' in entry
    # The printed entry is a valid config.
    path = tmp_path / "with-token.toml"
    path.write_text(
        f'[storage]\nurl = "{db_url}"\n[sqs]\nregion = "eu-west-1"\n\n' + "\n".join(entry) + "\n"
    )
    assert run_cli("check-config", "--config", str(path)).returncode == 0
