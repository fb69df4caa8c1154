"""docs/benchmarks.md's tables are what `kvgate bench tables` generates from the committed
results, and the page stays a reference."""

from __future__ import annotations

import argparse
import difflib
import json
import shutil
from pathlib import Path

import pytest

from bench.results_io import RESULTS_DIR
from bench.tables import TABLES, generate
from bench.tables import cli as tables_cli
from bench.tables.markdown import TablesError, blocks, fill

DOC = tables_cli.DOC
MAX_LINES = 500


def _args(doc: Path, results: Path, *, update: bool = False) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    tables_cli.configure_parser(parser)
    argv = ["--doc", str(doc), "--results", str(results), *(["--update"] if update else [])]
    return parser.parse_args(argv)


def test_the_doc_tables_match_the_committed_results() -> None:
    document = DOC.read_text()
    generated = fill(document, generate())
    diff = "\n".join(difflib.unified_diff(document.splitlines(), generated.splitlines(), n=0))
    assert generated == document, f"run `kvgate bench tables --update`:\n{diff}"


def test_every_table_has_its_place_in_the_doc() -> None:
    assert sorted(blocks(DOC.read_text())) == sorted(TABLES)


def test_a_changed_result_is_caught_and_update_rewrites_its_table(tmp_path: Path) -> None:
    results, doc = tmp_path / "results", tmp_path / "benchmarks.md"
    shutil.copytree(RESULTS_DIR, results, ignore=shutil.ignore_patterns("runs", "*.png"))
    doc.write_text(DOC.read_text())
    indexer = json.loads((results / "indexer.json").read_text())
    indexer["bytes_per_pair"] = 4321.0
    (results / "indexer.json").write_text(json.dumps(indexer))

    assert tables_cli.run(_args(doc, results)) == 1
    assert doc.read_text() == DOC.read_text(), "a check writes nothing"
    assert tables_cli.run(_args(doc, results, update=True)) == 0
    updated = doc.read_text()
    assert "| 4,321.0 | ≤ 200 ✗ |" in blocks(updated)["indexer"]
    assert tables_cli.run(_args(doc, results)) == 0
    changed = [line for line in difflib.ndiff(DOC.read_text().splitlines(), updated.splitlines())]
    assert sum(line.startswith("+ ") for line in changed) == 1, "only that row changes"


def test_a_block_without_a_table_is_an_error() -> None:
    document = "<!-- table:indexer -->\n| a |\n|---|\n\n<!-- table:unknown -->\n"
    with pytest.raises(TablesError, match="unknown"):
        fill(document, {"indexer": "| b |\n|---|"})


def test_the_doc_is_a_reference_not_a_notebook() -> None:
    lines = DOC.read_text().splitlines()
    assert len(lines) <= MAX_LINES, f"docs/benchmarks.md has {len(lines)} lines"
