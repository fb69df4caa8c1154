"""`kvgate settings`: every setting `kvgate serve` reads, with its default and meaning,
generated from the declarations in `gateway/settings.py`.

`--markdown` prints the tables of `docs/configuration.md`; `--update docs/configuration.md`
rewrites them in place (a test fails when that page and the declarations disagree);
without either, a plain listing with the value the current environment gives each
setting."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from gateway.commands.generated import GeneratedBlocks
from gateway.errors import ConfigError
from gateway.settings import Declaration, Settings, setting_groups


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown", action="store_true", help="print the settings tables (Markdown)"
    )
    parser.add_argument(
        "--update", type=Path, metavar="PAGE",
        help="rewrite the generated tables of PAGE (docs/configuration.md) between "
        "<!-- settings:GROUP --> markers",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    if args.update is not None:
        GENERATED.rewrite(args.update)
        return 0
    if args.markdown:
        for group in setting_groups():
            print(markdown_table(group))
        return 0
    try:
        print(listing(dict(os.environ)))
    except ConfigError as exc:
        print(f"kvgate settings: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return 0


def markdown_table(group: str) -> str:
    """The group's table for `docs/configuration.md`: the declarations' links, relative to
    the repository's root, made relative to `docs/`."""
    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for declaration, default in setting_groups()[group]:
        meaning = _meaning(declaration).replace("](docs/", "](")
        default_text = declaration.default_text(default)
        rows.append(f"| `{declaration.variable}` | {default_text} | {meaning} |")
    return "\n".join(rows) + "\n"


GENERATED = GeneratedBlocks("settings", markdown_table)
"""docs/configuration.md's generated tables, one per settings group."""


def listing(env: dict[str, str]) -> str:
    """Each setting, its default and the value `env` gives it (validated as at start-up)."""
    Settings.load(env)  # an invalid value is reported as `kvgate serve` would
    lines = []
    for group, entries in setting_groups().items():
        lines.append(f"{group}:")
        for declaration, default in entries:
            given = [name for name, _, _ in declaration.names() if env.get(name, "").strip()]
            source = f"  (set: {given[0]})" if given else ""
            lines.append(
                f"  {declaration.variable:<44} {declaration.default_text(default):<22}"
                f"{declaration.meaning.split(';')[0]}{source}"
            )
    return "\n".join(lines)


def _meaning(declaration: Declaration) -> str:
    aliases = [alias.variable for alias in declaration.aliases]
    named = ", ".join(f"`{name}`" for name in aliases)
    also = f" (AIBrix: {named})" if any(a.startswith("AIBRIX_") for a in aliases) else (
        f" (also read from {named})" if aliases else ""
    )  # fmt: skip
    allowed = (
        "a duration, at most 7 days" if "Go-style" in declaration.allowed else declaration.allowed
    )
    return f"{declaration.meaning}{also}; {allowed}".replace("|", "\\|")
