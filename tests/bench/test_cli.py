"""The `kvgate` command line, run as users run it (a real subprocess)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.helpers import run_kvgate as kvgate


def test_help_describes_every_command() -> None:
    result = kvgate("--help")
    assert result.returncode == 0
    for command in ("serve", "sim", "demo", "bench"):
        assert command in result.stdout
    for command in ("serve", "sim", "demo", "bench", "bench indexer"):
        sub = kvgate(*command.split(), "--help")
        assert sub.returncode == 0, sub.stderr
        assert "usage: kvgate" in sub.stdout


def test_bench_indexer_writes_every_figure(tmp_path: Path) -> None:
    out = tmp_path / "indexer.json"
    plot = tmp_path / "indexer.png"
    result = kvgate(
        "bench", "indexer", "--quick", "--pods", "4", "--blocks-per-pod", "600",
        "--matches", "50", "--json", str(out), "--plot", str(plot),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    figures = json.loads(out.read_text())
    for key in (
        "ingest_blocks_per_s",
        "remove_blocks_per_s",
        "match_p50_us",
        "match_p99_us",
        "match_p50_us_64",
        "match_p99_us_64",
        "hash_2048_tokens_p50_us",
        "bytes_per_pair",
    ):
        assert figures[key] > 0, key
        assert key in result.stdout
    assert figures["config"]["pods"] == 4
    assert plot.stat().st_size > 0


def test_bench_decision_with_step_ends_writes_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "decision.json"
    result = kvgate(
        "bench", "decision", "--pods", "8", "--requests", "20", "--step-ends", "4",
        "--json", str(out), "--plot", str(tmp_path / "decision.png"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    document = json.loads(out.read_text())
    assert document["step_ends_per_decision"] == 4
    assert "4 step ends between decisions" in result.stdout
    for policy in ("prefix-cache", "prefix-share", "round-robin"):
        figures = document["policies"][policy]
        assert 0 < figures["p50_us"] <= figures["p99_us"], policy
        assert figures["route_p50_us"] > 0, policy
    refused = kvgate("bench", "decision", "--step-ends", "-1")
    assert refused.returncode == 2
    assert "--step-ends >= 0" in refused.stdout
