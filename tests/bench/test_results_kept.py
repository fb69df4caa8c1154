"""bench/results/: a run writes under the git-ignored runs/ unless `--keep`; the committed
results (the latest kept run of each benchmark) stay within their size bound."""

from __future__ import annotations

import argparse
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import cli as bench_cli
from bench import demo_cli
from bench.results_io import RESULTS_DIR, RUNS_DIR, keep_outputs

REPO = Path(__file__).resolve().parents[2]
MAX_RESULTS_BYTES = 5 * 1024 * 1024
"""bench/results/ in git: the latest result of each benchmark, 5 MB at most."""


def _parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    bench_cli.configure_parser(parser)
    args = parser.parse_args(argv)
    keep_outputs(args)
    return args


def _git(*argv: str) -> subprocess.CompletedProcess[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    return subprocess.run(["git", "-C", str(REPO), *argv], capture_output=True, text=True)


def test_a_run_writes_under_runs_unless_kept() -> None:
    plain = _parse("decision")
    assert plain.json == RUNS_DIR / "decision.json"
    assert plain.plot == RUNS_DIR / "decision.png"
    kept = _parse("decision", "--keep")
    assert kept.json == RESULTS_DIR / "decision.json"
    assert kept.plot == RESULTS_DIR / "decision.png"
    assert _parse("chaos", "--keep").json == RESULTS_DIR / "chaos" / "chaos.json"
    assert _parse("sim").json == RUNS_DIR / "sim.json"
    assert _parse("pin-depth", "--keep").out == RESULTS_DIR / "pin-depth"


def test_keep_leaves_a_path_given_explicitly(tmp_path: Path) -> None:
    args = _parse("soak", "--keep", "--json", str(tmp_path / "soak.json"))
    assert args.json == tmp_path / "soak.json"
    assert args.plot == RESULTS_DIR / "soak" / "soak.png"


def test_the_demo_keeps_its_results_only_when_asked() -> None:
    parser = argparse.ArgumentParser()
    demo_cli.configure_parser(parser)
    plain = parser.parse_args([])
    keep_outputs(plain)
    assert plain.out == RUNS_DIR / "demo"
    kept = parser.parse_args(["--keep"])
    keep_outputs(kept)
    assert kept.out == RESULTS_DIR / "demo"


def test_runs_are_ignored_by_git_and_kept_results_are_not() -> None:
    ignored = _git("check-ignore", "-q", "bench/results/runs/routing/x/routing.json")
    assert ignored.returncode == 0, "bench/results/runs/ must be git-ignored"
    tracked = _git("check-ignore", "-q", "bench/results/routing/x/routing.json")
    assert tracked.returncode == 1, "a kept run folder must not be git-ignored"


def test_committed_results_stay_within_their_bound() -> None:
    listed = _git("ls-files", "-z", "bench/results")
    assert listed.returncode == 0, listed.stderr
    files = [REPO / name for name in listed.stdout.split("\0") if name]
    assert files, "bench/results/ holds the results docs/benchmarks.md is generated from"
    assert not [f for f in files if f.is_relative_to(RUNS_DIR)], "runs/ is never committed"
    total = sum(f.stat().st_size for f in files if f.exists())
    assert total <= MAX_RESULTS_BYTES, f"bench/results/ holds {total / 2**20:.1f} MB in git"
