"""Process-wide runtime settings of a kvgate process.

Event decoding allocates GC-tracked objects (events, lists) by the thousand per batch;
with CPython's default generation-0 threshold (700 allocations) the collector runs
constantly. The index itself holds no GC-tracked object per block (its blocks are ints,
or items of the compiled index's arrays). kvgate's
processes raise it once at start-up (`KVGATE_GC_GEN0_THRESHOLD`, 0 keeps CPython's
default).
"""

from __future__ import annotations

import gc

DEFAULT_GC_GEN0_THRESHOLD = 50_000


def tune_gc(gen0_threshold: int = DEFAULT_GC_GEN0_THRESHOLD) -> tuple[int, int, int]:
    """Raise the generation-0 threshold (0 leaves the default); returns the old thresholds."""
    previous = gc.get_threshold()
    if gen0_threshold > 0:
        gc.set_threshold(gen0_threshold, previous[1], previous[2])
    return previous
