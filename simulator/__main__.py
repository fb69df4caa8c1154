"""`python -m simulator …`: the same as `kvgate sim …`."""

from __future__ import annotations

import argparse
import sys

from simulator.cli import configure_parser, run

if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m simulator")
    configure_parser(parser)
    sys.exit(run(parser.parse_args()))
