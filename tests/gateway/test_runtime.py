from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from gateway.runtime import tune_gc


@pytest.fixture
def restore_gc() -> Iterator[None]:
    saved = gc.get_threshold()
    yield
    gc.set_threshold(*saved)


def test_tune_gc_raises_gen0_only(restore_gc: None) -> None:
    before = gc.get_threshold()
    assert tune_gc(12_345) == before
    assert gc.get_threshold() == (12_345, before[1], before[2])
    tune_gc(0)
    assert gc.get_threshold()[0] == 12_345
