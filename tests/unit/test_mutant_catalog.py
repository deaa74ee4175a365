"""The mutation catalog (tests/mutants/) stays applicable as the code changes.

Running the catalog takes minutes (`./dev mutants`); this checks in a moment what makes
a run meaningful: every entry's search text is in the current source exactly once, and
every test it names exists. A drifting entry fails here, in CI, not as NOT-APPLIED later.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.mutants.run import ROOT, Mutant, applies, load

CATALOG = load()
# Survivors of the first mutation check (issue 12): each must keep its own entry.
SURVIVORS = {
    "redrive_in_two_transactions",
    "idempotency_lookup_not_scoped_to_user",
    "relay_sent_without_version_sqlite",
    "relay_sent_without_version_postgres",
    "finish_job_without_version",
    "finish_job_by_id_only",
    "delete_before_the_succeeded_commit",
    "failed_path_deletes_without_commit",
    "portal_rejection_only_on_status_200",
    "redaction_password_keys_removed",
    "redaction_url_scrub_removed",
    "shutdown_skips_the_visibility_reset",
    "claimer_tick_not_shielded",
    "send_batch_later_chunk_fails_the_batch",
}


def test_the_catalog_is_large_enough_and_keeps_the_survivors() -> None:
    names = {m.name for m in CATALOG}
    assert len(CATALOG) >= 40
    assert not SURVIVORS - names, SURVIVORS - names


@pytest.mark.parametrize("mutant", CATALOG, ids=[m.name for m in CATALOG])
def test_the_entry_applies_to_the_current_source(mutant: Mutant) -> None:
    assert mutant.file.startswith("src/"), "a mutant changes the product, not the tests"
    assert applies(mutant) is None, applies(mutant)
    assert mutant.why.strip()


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


@pytest.mark.parametrize("mutant", CATALOG, ids=[m.name for m in CATALOG])
def test_the_entry_names_existing_tests(mutant: Mutant) -> None:
    for node_id in mutant.tests:
        match = re.fullmatch(r"(tests/[\w/]+\.py)::(test_\w+)(\[[^\]]+\])?", node_id)
        assert match is not None, f"not a test node id: {node_id}"
        path = ROOT / match.group(1)
        assert path.is_file(), node_id
        assert match.group(2) in _test_functions(path), node_id
        param = match.group(3)
        if param is not None:
            # Parametrized over the backends (and maybe more): the backend comes first.
            assert param[1:-1].split("-")[0] in {"sqlite", "postgres"}, node_id
