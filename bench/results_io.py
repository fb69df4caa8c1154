"""Printing and saving benchmark results: a table on stdout, JSON and PNG.

A run writes under `bench/results/runs/` (ignored by git); with `--keep` it writes to the
committed place instead, `bench/results/`, which holds the latest kept result of each
benchmark and which docs/benchmarks.md's tables are generated from.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import platform
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

RESULTS_DIR = Path(__file__).resolve().parent / "results"
"""The committed results: the latest kept run of each benchmark."""
RUNS_DIR = RESULTS_DIR / "runs"
"""Where a run writes unless it is kept (`--keep`); ignored by git."""


def results_dir(keep: bool) -> Path:
    """Where a run's default outputs go: the committed folder with `--keep`, else runs/."""
    return RESULTS_DIR if keep else RUNS_DIR


def add_keep_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--keep",
        action="store_true",
        help="write the results to the committed bench/results/ (the latest kept result of "
        "this benchmark, which docs/benchmarks.md's tables read) instead of the git-ignored "
        "bench/results/runs/",
    )


def keep_outputs(args: argparse.Namespace) -> None:
    """With `--keep`, move every default output path of `args` (one under runs/) to the same
    place under the committed folder; paths given explicitly stay as they are."""
    if not getattr(args, "keep", False):
        return
    for name, value in vars(args).items():
        if isinstance(value, Path) and value.is_relative_to(RUNS_DIR):
            setattr(args, name, RESULTS_DIR / value.relative_to(RUNS_DIR))


def percentile(values: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of `values` (pct in [0, 100])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def print_table(title: str, rows: Sequence[tuple[str, str, str]]) -> None:
    """Rows of (figure, value, target or note)."""
    width = max(len(row[0]) for row in rows)
    value_width = max(len(row[1]) for row in rows)
    print(f"\n{title}")
    print("-" * (width + value_width + 20))
    for name, value, note in rows:
        print(f"{name:<{width}}  {value:>{value_width}}  {note}")
    print()


def write_json(path: Path, results: Mapping[str, Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "generated_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "processor": platform.machine(),
        },
        **results,
    }
    path.write_text(json.dumps(document, indent=2, sort_keys=False) + "\n")
    return path


def add_output_arguments(parser: argparse.ArgumentParser, name: str, *, plot: bool = True) -> None:
    """`--json PATH` and (with `plot`) `--plot PATH`, defaulting to
    bench/results/runs/<name>.json|png (`name` may hold a folder: `chaos/chaos`); with
    `--keep`, bench/results/<name>.json|png."""
    outputs = [("--json", "json", "the JSON results"), ("--plot", "png", "the plot")]
    for flag, suffix, what in outputs[: 2 if plot else 1]:
        parser.add_argument(
            flag,
            type=Path,
            default=RUNS_DIR / f"{name}.{suffix}",
            metavar="PATH",
            help=f"where to write {what} (default bench/results/runs/{name}.{suffix}; "
            f"with --keep bench/results/{name}.{suffix})",
        )


def have_matplotlib() -> bool:
    return importlib.util.find_spec("matplotlib") is not None


@contextlib.contextmanager
def figure(path: Path, *grid: int, dpi: float | None = None, **options: Any) -> Iterator[Any]:
    """A matplotlib figure of `grid` subplots (`plt.subplots(*grid, **options)`): yields
    (figure, axes); saved to `path` (tight layout, `dpi`) when the block ends, closed
    either way."""
    plt = pyplot(path)
    fig, axes = plt.subplots(*grid, **options)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, **({} if dpi is None else {"dpi": dpi}))
    finally:
        plt.close(fig)


def plot_cdf(axis: Any, values: Sequence[float], label: str, style: str = "-") -> None:
    """The empirical CDF of `values` on `axis`."""
    ordered = sorted(values)
    axis.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], style, label=label)


def log_axis(axis: Any, title: str, xlabel: str, ylabel: str, **legend: Any) -> None:
    """A log-x panel of curves: labels, title, grid and legend."""
    axis.set_xscale("log")
    axis.set_xlabel(xlabel)
    axis.set_ylabel(ylabel)
    axis.set_title(title)
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(**legend)


def pyplot(path: Path) -> Any:
    """matplotlib's pyplot on the headless Agg backend, with `path`'s folder created."""
    try:
        import matplotlib
    except ImportError:
        raise SystemExit("plots need matplotlib: pip install 'kvgate[bench]'") from None

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    return plt
