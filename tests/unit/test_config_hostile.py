"""Config numbers are finite everywhere, token hashes are unique, check-config says which key."""

from __future__ import annotations

import dataclasses
import hashlib
import math
import subprocess
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from outboxd.config import ConfigError, Settings
from outboxd.config_file import settings_from_mapping
from tests.support.ops import run_cli


def _float_keys(tp: type[Any], where: str = "") -> Iterator[str]:
    """Every float-typed key of the settings tree (tables only, not arrays of tables)."""
    hints = typing.get_type_hints(tp)
    for f in dataclasses.fields(tp):
        if f.name == "base_dir":
            continue
        hint = hints[f.name]
        key = f"{where}.{f.name}" if where else f.name
        if dataclasses.is_dataclass(hint):
            yield from _float_keys(typing.cast(type[Any], hint), key)
        elif hint is float or float in typing.get_args(hint):
            yield key


FLOAT_KEYS = sorted(_float_keys(Settings))


def _nested(key: str, value: Any) -> dict[str, Any]:
    *sections, leaf = key.split(".")
    out: dict[str, Any] = {leaf: value}
    for section in reversed(sections):
        out = {section: out}
    return out


def test_the_walk_found_the_durations() -> None:
    assert "relay.interval_s" in FLOAT_KEYS and "daemon.shutdown_timeout_s" in FLOAT_KEYS
    assert "server.read_timeout_s" in FLOAT_KEYS and len(FLOAT_KEYS) >= 15


@pytest.mark.parametrize("key", FLOAT_KEYS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_number_refuses_non_finite_values(key: str, bad: float) -> None:
    with pytest.raises(ConfigError) as exc:
        settings_from_mapping(_nested(key, bad), env={}, base_dir=Path("/srv"))
    msg = str(exc.value)
    assert key in msg and "finite" in msg and "\n" not in msg


def test_a_non_finite_every_s_in_a_schedule_is_refused() -> None:
    raw = {"scheduler": {"jobs": [{"name": "n", "task": "noop", "every_s": math.inf}]}}
    with pytest.raises(ConfigError, match=r"scheduler\.jobs\[0\]\.every_s.*finite"):
        settings_from_mapping(raw, env={}, base_dir=Path("/srv"))


def test_an_environment_override_of_inf_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"relay\.interval_s.*finite"):
        settings_from_mapping({}, env={"OUTBOXD_RELAY__INTERVAL_S": "inf"}, base_dir=Path("/s"))


def _token(user: str, secret: str, role: str = "user") -> dict[str, str]:
    return {"sha256": hashlib.sha256(secret.encode()).hexdigest(), "user": user, "role": role}


@pytest.mark.parametrize("upper", [False, True], ids=["same-case", "other-case"])
def test_two_tokens_with_the_same_hash_are_refused(upper: bool) -> None:
    second = _token("mallory", "s3cret", "admin")
    if upper:
        second["sha256"] = second["sha256"].upper()
    raw = {"auth": {"tokens": [_token("alice", "s3cret"), _token("bob", "other"), second]}}
    with pytest.raises(ConfigError) as exc:
        settings_from_mapping(raw, env={}, base_dir=Path("/srv"))
    assert str(exc.value).startswith("config: auth.tokens:")
    assert "[2]" in str(exc.value) and "[0]" in str(exc.value)


def test_distinct_tokens_are_fine() -> None:
    raw = {"auth": {"tokens": [_token("alice", "a"), _token("bob", "b")]}}
    assert len(settings_from_mapping(raw, env={}, base_dir=Path("/srv")).auth.tokens) == 2


def _check_config(tmp_path: Path, text: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "c.toml"
    path.write_text(text)
    return run_cli("check-config", "--config", str(path), cwd=tmp_path)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[relay]\ninterval_s = inf\n", "relay.interval_s"),
        ("[daemon]\nshutdown_timeout_s = nan\n", "daemon.shutdown_timeout_s"),
        ("[server]\nread_timeout_s = -inf\n", "server.read_timeout_s"),
        (
            "".join(f'[[auth.tokens]]\nsha256 = "{"ab" * 32}"\nuser = "{u}"\n' for u in ("a", "b")),
            "auth.tokens",
        ),
    ],
    ids=["inf", "nan", "-inf", "duplicate-token"],
)
def test_check_config_exits_2_naming_the_key(tmp_path: Path, text: str, key: str) -> None:
    proc = _check_config(tmp_path, text)
    assert proc.returncode == 2, proc
    lines = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and key in lines[0], lines


@pytest.mark.parametrize("name", ["nightly prune", "prüne", "x" * 97, "tab\there"])
def test_a_schedule_name_outside_the_sqs_dedup_alphabet_is_refused(name: str) -> None:
    raw = {"scheduler": {"jobs": [{"name": name, "task": "noop", "every_s": 60}]}}
    with pytest.raises(ConfigError, match=r"scheduler\.jobs\[0\]\.name"):
        settings_from_mapping(raw, env={}, base_dir=Path("/srv"))
