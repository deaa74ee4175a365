"""This release's migrations keep the previous release working on the migrated schema
(docs/upgrades.md#the-migration-rule): expand now, contract a release later.

Every migration after the previous release's schema (tests/support/previous_release.py) is
read, comments left out, for the statements that take away or tighten what older code
may still use: dropping or renaming a table or a column, changing a column's type, a new
NOT NULL without a default, a constraint or a unique index on a table that already holds
rows. Such a statement belongs only in a contract migration, a release after the last
code using it, and that migration must record in `schema_floor` which code may still run
(storage/schema.py), so older code refuses the schema instead of failing on it.
"""

from __future__ import annotations

import re

import pytest

from outboxd.storage.db import load_migrations
from tests.support.previous_release import PREVIOUS_SCHEMA

CONTRACTING = {
    "drops a table": r"\bDROP\s+TABLE\b",
    "drops a column": r"\bDROP\s+COLUMN\b",
    "renames": r"\bRENAME\b",
    "changes a column's type": r"\bALTER\s+COLUMN\s+\w+\s+(SET\s+DATA\s+)?TYPE\b",
    "makes a column NOT NULL": r"\bSET\s+NOT\s+NULL\b",
    "drops a default": r"\bDROP\s+DEFAULT\b",
    "adds a constraint": r"\bADD\s+CONSTRAINT\b",
    "adds a NOT NULL column without a default": (
        r"\bADD\s+COLUMN\b(?:(?!\bDEFAULT\b)[^;,])*\bNOT\s+NULL\b(?:(?!\bDEFAULT\b)[^;,])*[;,]"
    ),
}
_COMMENT = re.compile(r"--[^\n]*")
_NEW_TABLE = re.compile(r"\bCREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_UNIQUE_INDEX = re.compile(r"\bCREATE\s+UNIQUE\s+INDEX\b[^;]*?\bON\s+(\w+)", re.IGNORECASE)

THIS_RELEASE = [
    pytest.param(backend, name, script, id=f"{backend}-{name}")
    for backend in ("sqlite", "postgres")
    for version, name, script in load_migrations(backend)
    if version > PREVIOUS_SCHEMA
]


def contractions(script: str) -> list[str]:
    """What `script` does that an expand-only migration may not."""
    sql = _COMMENT.sub("", script)
    found = [what for what, pattern in CONTRACTING.items() if re.search(pattern, sql, re.I)]
    created = {t.lower() for t in _NEW_TABLE.findall(sql)}
    found += [
        f"adds a unique index on {table}"
        for table in _UNIQUE_INDEX.findall(sql)
        if table.lower() not in created
    ]
    return found


@pytest.mark.parametrize(("backend", "name", "script"), THIS_RELEASE)
def test_this_releases_migrations_only_expand(backend: str, name: str, script: str) -> None:
    found = contractions(script)
    if found:
        # A contract migration: allowed only with its floor (storage/schema.py).
        assert re.search(r"\bINSERT\s+INTO\s+schema_floor\b", _COMMENT.sub("", script), re.I), (
            f"{backend}/{name} {', '.join(found)}: a contract; it must wait a release after "
            "the last code that uses what it takes away, and record its schema_floor "
            "(docs/upgrades.md#the-migration-rule)"
        )


def test_this_release_has_migrations_to_check() -> None:
    assert THIS_RELEASE, "no migration since the previous release: is PREVIOUS_SCHEMA right?"


@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("ALTER TABLE jobs ADD COLUMN x TEXT;", []),
        ("ALTER TABLE jobs ADD COLUMN x INTEGER NOT NULL DEFAULT 0;", []),
        ("ALTER TABLE jobs ADD COLUMN x INTEGER NOT NULL;", ["adds a NOT NULL column"]),
        ("ALTER TABLE jobs DROP COLUMN x;", ["drops a column"]),
        ("ALTER TABLE jobs RENAME COLUMN x TO y;", ["renames"]),
        ("ALTER TABLE jobs ALTER COLUMN x TYPE BIGINT;", ["changes a column's type"]),
        ("ALTER TABLE jobs ALTER COLUMN x SET NOT NULL;", ["makes a column NOT NULL"]),
        ("DROP TABLE jobs;", ["drops a table"]),
        ("ALTER TABLE jobs ADD CONSTRAINT c CHECK (x > 0);", ["adds a constraint"]),
        ("CREATE UNIQUE INDEX u ON jobs (x);", ["adds a unique index on jobs"]),
        ("CREATE TABLE t (a TEXT NOT NULL); CREATE UNIQUE INDEX u ON t (a);", []),
        ("-- DROP TABLE jobs, said in a comment\nCREATE INDEX i ON jobs (x);", []),
        ("ALTER TABLE jobs SET (autovacuum_vacuum_scale_factor = 0.05);", []),
    ],
)
def test_what_counts_as_a_contraction(script: str, expected: list[str]) -> None:
    found = contractions(script)
    assert len(found) == len(expected), found
    for got, want in zip(found, expected, strict=True):
        assert got.startswith(want), found
