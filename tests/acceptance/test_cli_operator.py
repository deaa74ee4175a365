"""The CLI as a new operator meets it: --version, --help, check-config (--json), read-only
commands that never create or migrate a database, and one-line refusals naming the key."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from testkit.daemon import dump_toml

from outboxd import __version__
from outboxd.cli import _parser
from tests.support.db import sql
from tests.support.ops import ROOT, run_cli

AWS = {"region": "eu-west-1"}


def write(tmp_path: Path, config: dict[str, Any], name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(dump_toml(config))
    return str(path)


def cli_env(**extra: str) -> dict[str, str]:
    """No OUTBOXD_* and no AWS region or config from the machine running the tests."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OUTBOXD_", "AWS_")) and k != "JOURNAL_STREAM"
    }
    env["AWS_CONFIG_FILE"] = env["AWS_SHARED_CREDENTIALS_FILE"] = "/nonexistent/aws"
    env.update(extra)
    return env


def run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "outboxd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env or cli_env(),
        cwd=ROOT,
        check=False,
    )


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.stdout == "", done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert "Traceback" not in done.stderr
    return lines[0]


def test_version_prints_the_release_number() -> None:
    """From this source tree too, whatever metadata the venv's install holds: the release
    number is src/outboxd/__init__.py's (tests/unit/test_version.py)."""
    done = run("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"outboxd {__version__}"


def _all_parsers(p: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield p.prog, p
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                yield from _all_parsers(sub)


def test_help_is_for_an_operator_and_every_option_has_help() -> None:
    done = run("--help")
    assert done.returncode == 0
    assert "builds Settings" not in done.stdout
    for word in ("serve", "check-config", "AWS", "journald", "OUTBOXD_<SECTION>__<KEY>"):
        assert word in done.stdout, word
    for prog, parser in _all_parsers(_parser()):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for choice in action._choices_actions:
                    assert choice.help, (prog, choice.dest)
                continue
            assert action.help and action.help != argparse.SUPPRESS, (prog, action.dest)


def test_check_config_json_shows_the_resolved_settings(tmp_path: Path) -> None:
    keys = tmp_path / "keys"
    keys.write_text(run("keygen").stdout)
    config = {
        "storage": {"url": "postgresql://outboxd:s3cret-pw@db.internal:5432/outboxd"},
        "sqs": {**AWS, "visibility_timeout_s": 6},
        "security": {"keys_file": str(keys)},
        "server": {"host": "0.0.0.0"},
        "auth": {"tokens": [{"sha256": "ab" * 32, "user": "ops", "role": "admin"}]},
    }
    done = run("check-config", "--json", "--config", write(tmp_path, config))
    assert done.returncode == 0, done.stderr
    assert "s3cret-pw" not in done.stdout and "ab" * 32 not in done.stdout
    out = json.loads(done.stdout)
    assert out["sqs"]["endpoint_url"] is None  # AWS
    assert out["sqs"]["region"] == "eu-west-1"
    assert out["consumer"]["heartbeat_s"] == pytest.approx(2.0)
    assert out["storage"]["url"] == "postgresql://outboxd:***@db.internal:5432/outboxd"
    assert out["auth"]["tokens"][0]["user"] == "ops"
    assert out["scrapers"]["suwon"]["timeout_s"] == 20.0
    assert "base_dir" not in out
    # TOML key names, every section of the file format.
    assert set(out) == {
        "server", "api", "storage", "sqs", "relay", "consumer", "claimer", "scrapers",
        "breakers", "audit", "retention", "security", "auth", "scheduler", "daemon", "logging",
        "metrics",
    }  # fmt: skip
    assert out["metrics"] == {"refresh_s": 5.0}
    assert out["consumer"]["dlq_sweep_s"] == 60.0


@pytest.mark.parametrize(
    ("sqs", "env_extra", "expect"),
    [
        ({"endpoint_url": ""}, {}, "sqs.endpoint_url"),
        (AWS, {"OUTBOXD_SQS__ENDPOINT_URL": '""'}, "sqs.endpoint_url"),
        ({}, {}, "sqs.region"),  # AWS without a region anywhere
    ],
)
def test_check_config_refuses_with_one_line_naming_the_key(
    tmp_path: Path, sqs: dict[str, Any], env_extra: dict[str, str], expect: str
) -> None:
    path = write(tmp_path, {"storage": {"url": "sqlite:///x.db"}, "sqs": sqs})
    for command in ("check-config", "serve"):
        done = run(command, "--config", path, env=cli_env(**env_extra))
        assert done.returncode == 2, done
        assert expect in one_line(done)
    assert not (tmp_path / "x.db").exists()


def test_region_from_the_environment_is_enough(tmp_path: Path) -> None:
    path = write(tmp_path, {"storage": {"url": "sqlite:///x.db"}})
    done = run("check-config", "--config", path, env=cli_env(AWS_REGION="eu-west-1"))
    assert done.returncode == 0, done.stderr


def test_embedded_without_the_extra_names_it_and_the_pip_command(tmp_path: Path) -> None:
    """moto hidden (as in a wheel installed without [embedded]): one line, exit 2."""
    path = write(
        tmp_path, {"storage": {"url": "sqlite:///x.db"}, "sqs": {"endpoint_url": "embedded"}}
    )
    hide_moto = "import sys; sys.modules['moto'] = None; from outboxd.cli import main; main()"
    for command in ("check-config", "serve"):
        done = subprocess.run(
            [sys.executable, "-c", hide_moto, command, "--config", path],
            capture_output=True,
            text=True,
            timeout=60,
            env=cli_env(),
            cwd=ROOT,
            check=False,
        )
        assert done.returncode == 2, done
        line = one_line(done)
        assert "outboxd[embedded]" in line and "pip install" in line, line
    assert not (tmp_path / "x.db").exists()
    # With moto importable the same config is fine.
    assert run("check-config", "--config", path).returncode == 0


def test_check_config_catches_what_serve_would_refuse(tmp_path: Path) -> None:
    sqlite = {"url": "sqlite:///x.db"}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"storage": {"url": "postgresql://u@127.0.0.1:1/db"}, "sqs": AWS}, "security.keys_file"),
        (
            {"storage": sqlite, "sqs": AWS, "security": {"keys_file": "missing-keys"}},
            "security.keys_file",
        ),
        (
            {"storage": sqlite, "sqs": AWS, "scrapers": {"classifier": {"provider": "openai"}}},
            "scrapers.classifier.api_key_env",
        ),
    ]
    for i, (config, key) in enumerate(cases):
        done = run("check-config", "--config", write(tmp_path, config, f"c{i}.toml"))
        assert done.returncode == 2, (config, done)
        assert key in one_line(done)
    bad_keys = tmp_path / "bad-keys"
    bad_keys.write_text("not a key\n")
    config = {"storage": sqlite, "sqs": AWS, "security": {"keys_file": str(bad_keys)}}
    done = run("check-config", "--config", write(tmp_path, config, "bad.toml"))
    assert done.returncode == 2 and "bad-keys" in one_line(done)
    # check-config itself wrote nothing: no database, no key file beside it.
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".toml")) == [
        "bad-keys"
    ]


async def test_read_only_commands_never_create_or_migrate(
    fresh_db_url: str, tmp_path: Path
) -> None:
    """status, outbox list and check-config on a fresh config leave nothing behind."""
    keys = tmp_path / "keys"
    keys.write_text(run("keygen").stdout)
    storage = {"url": fresh_db_url}
    sections = {"sqs": {"endpoint_url": "embedded"}, "security": {"keys_file": str(keys)}}
    config = write(tmp_path, {"storage": storage, **sections})
    for args in (["status"], ["status", "--json"], ["outbox", "list"], ["check-config"]):
        done = run_cli(*args, "--config", config)
        if args == ["check-config"]:
            assert done.returncode == 0, done.stderr
            continue
        assert done.returncode == 1, (args, done)
        line = one_line(done)
        assert "outboxd migrate" in line, line
    if fresh_db_url.startswith("sqlite"):
        assert not (tmp_path / "fresh").exists()
    else:
        tables = await sql(
            fresh_db_url,
            "SELECT COUNT(*) FROM information_schema.tables WHERE table_schema = 'public'",
        )
        assert tables[0][0] == 0
    # After `migrate` the same commands work.
    assert run_cli("migrate", "--config", config).returncode == 0
    assert run_cli("status", "--json", "--config", config).returncode == 0
    assert run_cli("outbox", "list", "--config", config).returncode == 0


def test_the_example_production_config_passes_check_config(tmp_path: Path) -> None:
    """systemd/outboxd.example.toml with the key file the unit hands over and its
    placeholder token replaced: valid, AWS (`endpoint_url` null), Postgres, and nothing
    secret in the output. As shipped, the placeholder token is refused."""
    keys = tmp_path / "keys"
    keys.write_text(run("keygen").stdout)
    example = str(ROOT / "systemd" / "outboxd.example.toml")
    shipped = run(
        "check-config", "--config", example, env=cli_env(OUTBOXD_SECURITY__KEYS_FILE=str(keys))
    )
    assert shipped.returncode == 2 and "auth.tokens[0]" in one_line(shipped), shipped
    env = cli_env(
        OUTBOXD_SECURITY__KEYS_FILE=str(keys),
        OUTBOXD_AUTH__TOKENS='[{sha256 = "' + "ab" * 32 + '", user = "ops", role = "admin"}]',
    )
    assert run("check-config", "--config", example, env=env).stdout.strip() == "config OK"
    done = run("check-config", "--json", "--config", example, env=env)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["sqs"]["endpoint_url"] is None and out["sqs"]["region"]
    assert out["storage"]["url"].startswith("postgresql://")
    assert out["security"]["keys_file"] == str(keys)
    assert out["auth"]["tokens"][0]["sha256"] == "[redacted]"
    # Without a key (the unit's credential), serve would refuse: so does check-config.
    refused = run("check-config", "--config", example)
    assert refused.returncode == 2 and "security.keys_file" in one_line(refused)


def test_a_reader_that_goes_away_is_no_traceback(tmp_path: Path) -> None:
    """`outboxd check-config --json | true`: the reader is gone before the command writes;
    it stops quietly, no BrokenPipeError traceback."""
    keys = tmp_path / "keys"
    keys.write_text(run("keygen").stdout)
    path = write(tmp_path, {"storage": {"url": "sqlite:///x.db"}, "sqs": AWS,
                            "security": {"keys_file": str(keys)}})  # fmt: skip
    full = [sys.executable, "-m", "outboxd", "check-config", "--json", "--config", path]
    done = subprocess.run(
        ["bash", "-c", '"$@" | true', "pipe", *full],
        capture_output=True,
        text=True,
        timeout=60,
        env=cli_env(),
        check=False,
    )
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.stderr == "", done.stderr
