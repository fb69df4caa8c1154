"""`kvgate routing plugins`: every registered routing plugin with the parameters it
declares (name, type, default, range, meaning), generated from the code.

`--markdown` prints the tables of `docs/routing.md` (plugins, then the built-in
policies); `--update docs/routing.md` rewrites them in place between
`<!-- routing:NAME -->` markers (a test fails when that page and the code disagree)."""

from __future__ import annotations

import argparse
from pathlib import Path

from gateway.commands.generated import GeneratedBlocks
from gateway.routing.catalogue import TABLES, plugins_listing, plugins_markdown, policies_markdown

GENERATED = GeneratedBlocks("routing", lambda name: TABLES[name]())
"""docs/routing.md's generated tables."""


def configure_parser(parser: argparse.ArgumentParser) -> None:
    topics = parser.add_subparsers(dest="topic", metavar="TOPIC", required=True)
    listing = topics.add_parser(
        "plugins",
        help="every routing plugin and its parameters",
        description="List every routing plugin a routing config may name, with each "
        "parameter's type, default, range and meaning, and the built-in policies.",
    )
    listing.add_argument(
        "--markdown", action="store_true", help="print docs/routing.md's tables (Markdown)"
    )
    listing.add_argument(
        "--update", type=Path, metavar="PAGE",
        help="rewrite the generated tables of PAGE (docs/routing.md) between "
        "<!-- routing:NAME --> markers",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.update is not None:
        GENERATED.rewrite(args.update)
        return 0
    if args.markdown:
        print(plugins_markdown())
        print(policies_markdown(), end="")
        return 0
    print(plugins_listing())
    return 0
