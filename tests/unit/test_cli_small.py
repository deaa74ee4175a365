"""Small things of the `outboxd` command (docs/contract.md#cli): `--limit` is 1-500 (exit 2
otherwise), every subcommand has a description, `status` prints queue depths as a line a
person reads, and an admin action names who ran it."""

from __future__ import annotations

import argparse

import pytest

from outboxd import cli, cli_commands


@pytest.mark.parametrize("limit", ["0", "-1", "501", "100000", "ten", "1.5"])
def test_limit_outside_1_to_500_is_bad_usage(
    limit: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        cli.run(["outbox", "list", "--limit", limit, "--config", "/nonexistent.toml"])
    assert done.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert "--limit" in err and "1-500" in err, err


@pytest.mark.parametrize("limit", ["1", "50", "500"])
def test_limit_inside_the_range_parses(limit: str) -> None:
    args = cli._parser().parse_args(["outbox", "list", "--limit", limit])
    assert args.limit == int(limit)


def _subparser(*path: str) -> argparse.ArgumentParser:
    parser = cli._parser()
    for name in path:
        action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = action.choices[name]
    return parser


@pytest.mark.parametrize("path", [("migrate",), ("keygen",), ("queues", "create")])
def test_these_commands_explain_themselves_in_their_help(path: tuple[str, ...]) -> None:
    parser = _subparser(*path)
    assert parser.description and len(parser.description) > 80, path
    shown = " ".join(parser.format_help().split())  # `COMMAND --help`, wrapped
    assert " ".join(parser.description.split()) in shown


def test_status_prints_queue_depths_for_a_person() -> None:
    line = cli_commands.queue_line("jobs", 12, 3, 0)
    assert "{" not in line and "'" not in line
    assert line.split() == ["queue", "jobs", "visible", "12", "in", "flight", "3", "dlq", "0"]


def test_the_cli_actor_names_the_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SUDO_USER", raising=False)
    monkeypatch.setattr(cli_commands.getpass, "getuser", lambda: "alice")
    assert cli_commands.cli_actor() == "cli:alice"
    monkeypatch.setenv("SUDO_USER", "bob")  # `sudo outboxd ...` run by bob
    assert cli_commands.cli_actor() == "cli:bob"

    def no_user() -> str:
        raise KeyError("no passwd entry")

    monkeypatch.delenv("SUDO_USER")
    monkeypatch.setattr(cli_commands.getpass, "getuser", no_user)
    assert cli_commands.cli_actor().startswith("cli:uid ")
