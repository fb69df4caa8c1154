"""Markdown tables, their cells' number formats, and the marked blocks of a document
that hold them.

A generated table sits in its document right after a `<!-- table:NAME -->` line; the
table (the lines that follow it and begin with `|`) is what gets replaced.
"""

from __future__ import annotations

import math
import re
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence

_BLOCK = re.compile(r"^<!-- table:(?P<name>[a-z0-9-]+) -->\n(?P<body>(?:\|.*\n)*)", re.M)


class TablesError(Exception):
    """A document's marked blocks do not match the tables generated for it."""


def table(headers: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table (no trailing newline)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def num(value: float, digits: int = 0) -> str:
    """`value` with thousands separators and `digits` decimals; `—` when absent."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return f"{value:,.{digits}f}"


def pct(share: float, digits: int = 1) -> str:
    """A share in [0, 1] as a percentage."""
    return "—" if share is None else f"{share * 100:.{digits}f} %"


def spread(values: Sequence[float], fmt: Callable[[float], str]) -> str:
    """The median of repeated rounds, with their range when they differ: `12 (11–14)`."""
    if not values:
        return "—"
    return ranged(statistics.median(values), min(values), max(values), fmt)


def ranged(middle: float, low: float, high: float, fmt: Callable[[float], str]) -> str:
    """A median with its range when the range is not one value: `12 (11–14)`."""
    shown, lowest, highest = fmt(middle), fmt(low), fmt(high)
    return shown if lowest == highest else f"{shown} ({lowest}–{highest})"


def blocks(document: str) -> dict[str, str]:
    """The generated blocks of `document`, by name."""
    return {match["name"]: match["body"] for match in _BLOCK.finditer(document)}


def fill(document: str, tables: Mapping[str, str]) -> str:
    """`document` with every marked block replaced by its table; a block without a table,
    or a table without a block, is an error."""
    found = blocks(document)
    missing = sorted(set(tables) - set(found))
    unknown = sorted(set(found) - set(tables))
    if missing or unknown:
        raise TablesError(f"tables without a block: {missing}; blocks without a table: {unknown}")

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        return f"<!-- table:{name} -->\n{tables[name]}\n"

    return _BLOCK.sub(replace, document)
