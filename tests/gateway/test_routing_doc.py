"""docs/routing.md's plugin and policy tables are the code's, rendered: a plugin or a
parameter added, renamed or given a new default without that page following fails here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gateway.commands.routing import GENERATED
from gateway.routing.catalogue import TABLES, default_parameters, plugins
from gateway.routing.config import BUILTIN, normalise, read_config
from gateway.routing.plugins import COSTS, FILTERS, PICKERS, PLACEMENTS, PREFERENCES, SCORERS
from gateway.settings import AIBRIX_STRATEGIES

PAGE = Path(__file__).resolve().parents[2] / "docs" / "routing.md"


def test_the_routing_tables_are_generated_from_the_code() -> None:
    text = PAGE.read_text(encoding="utf-8")
    assert set(GENERATED.blocks(text)) == set(TABLES)
    for name, table in GENERATED.blocks(text).items():
        assert table == TABLES[name](), (
            f"docs/routing.md's {name} table is stale: run "
            "`.venv/bin/kvgate routing plugins --update docs/routing.md`"
        )
    assert GENERATED.updated(text) == text


def test_every_plugin_and_parameter_is_listed_with_its_meaning() -> None:
    docs = plugins()
    registered = {*FILTERS, *SCORERS, *COSTS, *PLACEMENTS, *PICKERS, *PREFERENCES}
    assert {doc.name for doc in docs} == registered and len(docs) == len(registered)
    for doc in docs:
        assert doc.meaning, doc.name
        names = [p.name for p in doc.parameters]
        assert len(names) == len(set(names)), doc.name
        for p in doc.parameters:
            assert p.meaning and p.default and p.allowed, (doc.name, p.name)
    placement = next(doc for doc in docs if doc.name == "first-turn")
    tolerance = next(p for p in placement.parameters if p.name == "load_tolerance")
    assert (tolerance.default, tolerance.allowed) == ("0.25", "[0, 10]")


def test_predicted_latency_is_an_alias_of_prefix_cache() -> None:
    specs = normalise(read_config(BUILTIN), BUILTIN.name)
    assert specs["predicted-latency"] == specs["prefix-cache"]
    assert AIBRIX_STRATEGIES["least-latency"] == "predicted-latency"
    assert "| `predicted-latency` (alias of `prefix-cache`; AIBrix `least-latency`) |" in (
        TABLES["policies"]()
    )


def test_kvgate_routing_plugins_lists_them(tmp_path: Path) -> None:
    shown = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "routing", "plugins"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    heads = [line.split(":")[0] for line in shown.stdout.splitlines() if line[:1] != " "]
    assert heads.pop() == "default policy"
    assert sorted(heads) == sorted(f"{doc.kind} {doc.name}" for doc in plugins())
    current = PAGE.read_text(encoding="utf-8")
    stale = tmp_path / "routing.md"
    stale.write_text(current.replace("| `load_tolerance` | number | 0.25 |", "| x |"))
    assert stale.read_text(encoding="utf-8") != current
    subprocess.run(
        [sys.executable, "-m", "gateway.cli", "routing", "plugins", "--update", str(stale)],
        capture_output=True, timeout=60, check=True,
    )  # fmt: skip
    assert stale.read_text(encoding="utf-8") == current


def test_the_default_policy_has_six_parameters_or_fewer() -> None:
    """Every parameter the default profile sets or inherits that can change its pick."""
    names = default_parameters()
    assert len(names) <= 6, names
    assert "KVGATE_SLO_SHED" in names and "KVGATE_COST_CONTEXT_SHARE" in names
    assert f"default policy: {len(names)} parameters" in TABLES["default"]()
