"""The settings table of docs/contract.md#configuration names exactly the keys the settings
dataclasses have: a key added in config.py without its line in the table (or a line left for a
key that is gone) fails here."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from outboxd.config import Settings

CONTRACT = Path(__file__).resolve().parents[2] / "docs/contract.md"
KEY = re.compile(r"[a-z][a-z0-9_]*")


def documented() -> dict[str, set[str]]:
    """Section -> the keys its rows name: the backticked words outside parentheses."""
    text = CONTRACT.read_text(encoding="utf-8")
    table = text[text.index("## Configuration") : text.index("## CLI")]
    sections: dict[str, set[str]] = {}
    for line in table.splitlines():
        cells = line.split(" | ")
        if not line.startswith("| `") or len(cells) != 2:
            continue
        section = cells[0].split("`")[1]
        keys = sections.setdefault(section, set())
        depth = 0
        for part in re.split(r"(`[^`]*`|[()])", cells[1]):
            if part == "(":
                depth += 1
            elif part == ")":
                depth -= 1
            elif depth == 0 and part.startswith("`") and KEY.fullmatch(part.strip("`")):
                keys.add(part.strip("`"))
    return sections


def in_code() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for f in dataclasses.fields(Settings):
        if f.name == "base_dir":
            continue
        if f.name in ("scrapers", "breakers"):  # sections of sections
            parent = getattr(Settings(), f.name)
            for sub in dataclasses.fields(parent):
                cls = type(getattr(parent, sub.name))
                out[f"{f.name}.{sub.name}"] = {g.name for g in dataclasses.fields(cls)}
            continue
        out[f.name] = {g.name for g in dataclasses.fields(getattr(Settings(), f.name))}
    return out


def test_the_scan_reads_the_table() -> None:
    table = documented()
    assert {"server", "storage", "scrapers.suwon", "metrics"} <= set(table)
    assert {"host", "port", "max_connections"} <= table["server"]


def test_the_settings_table_names_every_key_and_no_other() -> None:
    table, code = documented(), in_code()
    assert set(table) == set(code)
    for section, keys in code.items():
        assert table[section] == keys, (
            f"{section}: missing from docs/contract.md {sorted(keys - table[section])}, "
            f"documented but not in config.py {sorted(table[section] - keys)}"
        )
