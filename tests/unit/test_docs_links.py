"""Every Markdown document that the code, tests, bench or README cite is in the repository.

A citation is a path ending in `.md` (optionally with a `#section`); it resolves against the
repository root or the citing file's folder. A `#section` must name a heading of the cited file.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("src", "tests", "bench", "testkit", "systemd", "docs")
SUFFIXES = {".py", ".md", ".sql", ".toml", ".txt", ".service", ""}
_CITATION = re.compile(r"(?<![\w/.-])([\w./-]*\w\.md)\b(?:#([a-z0-9-]+))?")
_HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$", re.MULTILINE)


def _slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _sources() -> list[Path]:
    files = [ROOT / "README.md"]
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*")):
            # Not caches or other hidden folders: not our text.
            parts = path.relative_to(ROOT).parts
            if any(p == "__pycache__" or p.startswith(".") for p in parts):
                continue
            if path.is_file() and path.suffix in SUFFIXES:
                files.append(path)
    return files


def _citations() -> list[tuple[Path, str, str | None]]:
    found = []
    for source in _sources():
        text = source.read_text(encoding="utf-8", errors="replace")
        for match in _CITATION.finditer(text):
            found.append((source, match.group(1), match.group(2)))
    return found


def _resolve(source: Path, cited: str) -> Path | None:
    for base in (ROOT, source.parent):
        candidate = (base / cited).resolve()
        if candidate.is_file() and candidate.is_relative_to(ROOT):
            return candidate
    return None


def test_the_scan_sees_the_documents_the_code_cites() -> None:
    """The scan finds citations of each of the three docs (so the checks below are not vacuous)."""
    cited = {c for _, c, _ in _citations()}
    assert {"docs/contract.md", "docs/portal.md", "docs/architecture.md"} <= cited
    assert {"docs/operations.md", "docs/performance.md", "docs/reliability.md"} <= cited


def test_the_readme_opens_with_its_title_summary_and_the_two_commands() -> None:
    """The landing page: the title, one line of what outboxd is, then exactly the two commands
    (run the daemon, run the tests), before anything else."""
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    head = [line for line in lines[:8] if line.strip()]
    assert head[0] == "# outboxd" and not head[1].startswith(("#", "`"))
    assert head[2] == "```sh" and head[5] == "```"
    assert head[3].startswith("./dev serve ") and head[4].startswith("./dev test ")


def test_the_readme_stays_a_landing_page() -> None:
    """Short, and no table of internal goals: the figures live in docs/performance.md."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 200
    assert "MISS" not in text and "PASS" not in text


def test_every_cited_markdown_file_exists() -> None:
    """No source, test, bench file or the README cites a .md file missing from the clone."""
    missing = [
        f"{source.relative_to(ROOT)}: {cited}"
        for source, cited, _ in _citations()
        if _resolve(source, cited) is None
    ]
    assert missing == []


def test_every_cited_section_is_a_heading_of_its_document() -> None:
    """A `<doc>.md#section` citation names a heading that exists in that file."""
    broken = []
    for source, cited, anchor in _citations():
        target = _resolve(source, cited)
        if anchor is None or target is None:
            continue
        slugs = {_slug(h) for h in _HEADING.findall(target.read_text(encoding="utf-8"))}
        if anchor not in slugs:
            broken.append(f"{source.relative_to(ROOT)}: {cited}#{anchor}")
    assert broken == []


def test_slug_follows_github_anchors() -> None:
    """Headings with parentheses and apostrophes map to the anchors GitHub renders."""
    assert _slug("Queue (SQS)") == "queue-sqs"
    assert _slug("The job's result") == "the-jobs-result"
    assert _slug("SQLite on its own thread with stdlib `sqlite3`, not aiosqlite") == (
        "sqlite-on-its-own-thread-with-stdlib-sqlite3-not-aiosqlite"
    )
