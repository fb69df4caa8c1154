"""`kvgate demo`: the one-command demonstration."""

from __future__ import annotations

import argparse
import sys


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--engines", type=int, default=4, help="number of simulated engines")
    parser.add_argument("--no-serve", action="store_true", help="exit after the results table")


def run(args: argparse.Namespace) -> int:
    print("kvgate demo: not yet available in this version", file=sys.stderr)
    return 2
