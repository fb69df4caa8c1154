"""The README a user reads first: short, its demo table the committed demo result, and every
link in it and in docs/ leading to a file and heading that exist."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from bench.demo.report import RunSummary, format_table

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DEMO_RESULT = REPO / "bench" / "results" / "demo" / "demo.json"
DEMO_TABLE = re.compile(r"<!-- demo:table -->\n```\n(.*?)```\n<!-- /demo:table -->", re.DOTALL)
LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *#*$", re.MULTILINE)
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def test_the_readme_is_short() -> None:
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 250


def test_the_readme_demo_table_is_the_committed_demo_result() -> None:
    document = json.loads(DEMO_RESULT.read_text(encoding="utf-8"))
    fields = {field.name for field in dataclasses.fields(RunSummary)}
    base, best = (
        RunSummary(**{key: value for key, value in run.items() if key in fields})
        for run in document["runs"].values()
    )
    expected = format_table(base, best) + "\n"
    shown = DEMO_TABLE.search(README.read_text(encoding="utf-8"))
    assert shown is not None, "the README has no <!-- demo:table --> block"
    assert shown.group(1) == expected, (
        "the README's demo table is not bench/results/demo/demo.json; put this between "
        f"its <!-- demo:table --> markers:\n{expected}"
    )


def anchors(page: Path) -> set[str]:
    """The heading anchors GitHub gives a Markdown page."""
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        if count:
            slug = f"{slug}-{count}"
        seen.setdefault(slug, 1)
    return set(seen)


def pages() -> list[Path]:
    return [README, *sorted((REPO / "docs").rglob("*.md"))]


@pytest.mark.parametrize("page", pages(), ids=lambda page: str(page.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading(page: Path) -> None:
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no such heading in {linked.relative_to(REPO)}")
    assert not broken, broken
