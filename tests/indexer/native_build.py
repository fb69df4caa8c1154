"""Which build of indexer/_native.c the indexer's tests run against.

By default, the installed one. scripts/sanitize_native.sh builds the source with
AddressSanitizer and UndefinedBehaviorSanitizer into build/sanitize/ and names that file
in KVGATE_TEST_NATIVE_BUILD: `import_requested_build` then imports it as
`indexer._native`, in the test process (tests/indexer/conftest.py) and in the child
interpreters the crash tests start (tests/indexer/test_native_safety.py), before anything
asks for the compiled primitives (`indexer.native.load_native` imports them on first call).
Kept free of pytest so that a child interpreter imports it cheaply.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from pathlib import Path

NATIVE_BUILD_ENV = "KVGATE_TEST_NATIVE_BUILD"

CHILD_PRELUDE = "import tests.indexer.native_build as _b; _b.import_requested_build()\n"
"""The first line of a child interpreter's script when a build is named: the same build
as the parent's (the child runs in the repository's root, where `tests` is found)."""


def requested_build() -> Path | None:
    """The build KVGATE_TEST_NATIVE_BUILD names, or None (the installed one)."""
    path = os.environ.get(NATIVE_BUILD_ENV)
    return Path(path).resolve() if path else None


def import_requested_build() -> None:
    """Imports the requested build as `indexer._native` (nothing when none is named)."""
    build = requested_build()
    if build is None:
        return
    if "indexer._native" in sys.modules:
        raise RuntimeError(f"{NATIVE_BUILD_ENV}: indexer._native was imported already")
    if not build.is_file():
        raise RuntimeError(f"{NATIVE_BUILD_ENV}={build}: no such file")
    loader = importlib.machinery.ExtensionFileLoader("indexer._native", str(build))
    spec = importlib.util.spec_from_file_location("indexer._native", build, loader=loader)
    if spec is None:
        raise RuntimeError(f"{NATIVE_BUILD_ENV}={build}: not an extension module")
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    sys.modules["indexer._native"] = module
    import indexer

    indexer._native = module
