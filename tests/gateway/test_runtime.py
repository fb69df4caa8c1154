from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.runtime import DEFAULT_GC_GEN0_THRESHOLD, gc_gen0_threshold, tune_gc
from indexer import ConfigError


@pytest.fixture
def restore_gc() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_threshold_from_environment() -> None:
    assert gc_gen0_threshold({}) == DEFAULT_GC_GEN0_THRESHOLD
    assert gc_gen0_threshold({"KVGATE_GC_GEN0_THRESHOLD": "0"}) == 0
    with pytest.raises(ConfigError, match="KVGATE_GC_GEN0_THRESHOLD"):
        gc_gen0_threshold({"KVGATE_GC_GEN0_THRESHOLD": "lots"})


def test_tune_gc_raises_gen0_only(restore_gc: None) -> None:
    before = gc.get_threshold()
    assert tune_gc(12_345) == before
    assert gc.get_threshold() == (12_345, before[1], before[2])
    tune_gc(0)
    assert gc.get_threshold()[0] == 12_345
