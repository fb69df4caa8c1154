"""kvgate's version: the installed package's, else the source tree's constant."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _package_version

VERSION = "0.1.0"
"""Kept equal to `project.version` in pyproject.toml (a test checks it); used when kvgate
runs from a source tree that is not installed."""


def version() -> str:
    try:
        return _package_version("kvgate")
    except PackageNotFoundError:
        return VERSION
