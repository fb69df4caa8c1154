"""`kvgate bench pin-depth --quick`, run as users run it (a real subprocess, small sizes).

Behaviour only, never timings: the flood empties the baseline's cache, the pinned
conversation stays cached, and the table, JSON and plot are written.
"""

from __future__ import annotations

import json
from pathlib import Path

from bench.workloads.pin_depth import trie_tokens
from tests.helpers import run_kvgate


def test_trie_tokens_counts_shared_prefixes_once() -> None:
    assert trie_tokens([[1, 2, 3], [1, 2, 4], [1, 2, 3, 5], [9]]) == 3 + 1 + 1 + 1
    assert trie_tokens([]) == 0


def test_bench_pin_depth_quick(tmp_path: Path) -> None:
    result = run_kvgate("bench", "pin-depth", "--quick", "--depths", "0", "2",
                        "--out", str(tmp_path), timeout=180)  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    assert "| Depth | Prompt Tokens | BL TTFT | PIN TTFT |" in result.stdout
    document = json.loads((tmp_path / "results.json").read_text())
    assert (tmp_path / "ttft.png").stat().st_size > 0
    assert document["flood"]["requests_per_depth"] > 0
    summary = document["summary"]
    assert [row["depth"] for row in summary] == [0, 2]
    for row in summary:
        assert row["cached_baseline_pct"] < 10  # the flood evicted the unpinned prefix
        assert row["cached_pinned_pct"] > 70  # the pinned prefix survived it
        assert row["blocks_pinned"] > 0
        assert row["prompt_tokens"] > 0
    assert summary[1]["prompt_tokens"] > summary[0]["prompt_tokens"]
