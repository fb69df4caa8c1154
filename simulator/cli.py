"""`kvgate sim`: simulated vLLM/SGLang engines."""

from __future__ import annotations

import argparse
import sys


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name", default="e1", help="engine name")


def run(args: argparse.Namespace) -> int:
    print("kvgate sim: not yet available in this version", file=sys.stderr)
    return 2
