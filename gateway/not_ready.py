"""Shared behaviour of commands that a later release fills in."""

from __future__ import annotations

import sys


def not_yet_available(command: str) -> int:
    print(f"kvgate {command}: not yet available in this version", file=sys.stderr)
    return 2
