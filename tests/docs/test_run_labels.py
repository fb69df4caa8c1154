"""No internal run labels (a benchmark run's short name, a work item's number) anywhere a
user reads: code, comments, tests, the README, docs/ and the names of committed files. A
reader who was not there cannot decode them; the history they stand for is in git, and the
choices they led to are in docs/decisions/, the one place they may appear."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# A run's short name (`s` and one or two digits, alone or before a suffix such as
# "-closed"), a numbered stop or issue (with a space, `#`, `-` or `_` or nothing before the
# number); the parametrized cases below spell them out. An S3 URL is not a label.
LABEL = re.compile(r"\bs[0-9]{1,2}\b(?!://)" r"|(?i:\bstop ?#?[0-9]+\b|\bissue[ _-]?#?[0-9]+)")
ALLOWED_UNDER = "docs/decisions/"
VENDORED = "indexer/third_party/"
"""Upstream's files, kept as published."""
RESULTS = "bench/results/"
"""Benchmark results are data: their contents are not read, only their paths (and any
Markdown page kept among them)."""


def tracked() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True, timeout=60
    )
    return [name for name in listed.stdout.decode().split("\0") if name]


def text_of(path: Path) -> str | None:
    """The file's text, or None for a binary file (or one deleted but not yet committed)."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    if b"\0" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return None


def labels_in(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), start=1):
        for match in LABEL.finditer(line):
            found.append(f"{number}: {match.group(0)!r} in {line.strip()[:120]}")
    return found


@pytest.mark.parametrize(
    "text",
    ["s" + "35", "(s" + "36)", "`s" + "3-closed`", "Stop " + "36", "stop " + "36",
     "issue " + "13", "issue" + "13-open", "Issue #" + "8"],
)  # fmt: skip
def test_the_pattern_catches_run_labels(text: str) -> None:
    assert labels_in(text), text


@pytest.mark.parametrize(
    "text",
    ["s3://bucket/key", "Amazon S3", "ipv4", "a 10s timeout", "1m30s", "x-session-id",
     "sha256_cbor", "the stops", "an issue", "s100 is not a run", "tests/", "#s1a2b3c"],
)  # fmt: skip
def test_the_pattern_spares_ordinary_text(text: str) -> None:
    assert not labels_in(text), text


def test_no_run_labels_outside_the_decision_records() -> None:
    offenders: list[str] = []
    for name in tracked():
        if name.startswith((ALLOWED_UNDER, VENDORED)):
            continue
        offenders += [f"{name} (path): {found}" for found in labels_in(name)]
        if name.startswith(RESULTS) and not name.endswith(".md"):
            continue
        text = text_of(REPO / name)
        if text is not None:
            offenders += [f"{name}:{found}" for found in labels_in(text)]
    assert not offenders, (
        f"{len(offenders)} run labels outside docs/decisions/ (say what the run showed "
        "instead):\n" + "\n".join(offenders[:200])
    )
