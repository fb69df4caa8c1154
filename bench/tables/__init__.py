"""docs/benchmarks.md's tables, generated from the committed results under bench/results/
(`kvgate bench tables`)."""

from bench.tables.cli import TABLES, generate

__all__ = ["TABLES", "generate"]
