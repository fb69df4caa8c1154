"""A decision's kernels: the compiled ones (indexer/_native.c) give the pure ones' answers."""

from __future__ import annotations

import math
import random

import pytest

from gateway.routing import kernels
from gateway.routing.kernels import Kernels


@pytest.fixture
def compiled() -> Kernels:
    loaded = Kernels.load(pure_python=False)
    if loaded.argsort is kernels.argsort:
        pytest.skip("the C extension is not built here (no compiler): the pure path runs")
    return loaded


def test_affine_costs_are_the_pure_ones(compiled: Kernels) -> None:
    """Same operations in the same order: equal to the last bit."""
    rng = random.Random(5)
    for size in (0, 1, 7, 64):
        lists = [[rng.uniform(-1.0, 2.0) for _ in range(size)] for _ in range(4)]
        args = (*lists, rng.choice((100, 2048.0)), rng.uniform(0.0, 2.0), rng.uniform(0.0, 1.0))
        assert compiled.affine_costs(*args) == kernels.affine_costs(*args)
    with pytest.raises(ValueError, match="differ in length"):
        compiled.affine_costs([1.0], [1.0], [1.0], [], 1.0, 1.0, 0.0)
    with pytest.raises(TypeError):
        compiled.affine_costs([1.0], [1.0], [1.0], ["x"], 1.0, 1.0, 0.0)  # type: ignore[list-item]


def test_argsort_is_sorted_by_value_and_stable(compiled: Kernels) -> None:
    rng = random.Random(9)
    for size in (0, 1, 2, 64, 300):
        values = [float(rng.randrange(8)) / 4 for _ in range(size)]  # many equal values
        assert compiled.argsort(values) == kernels.argsort(values)
    assert compiled.argsort([1.0, math.nan, 0.5, math.inf]) == [2, 0, 1, 3]  # NaN as +inf
    with pytest.raises(TypeError):
        compiled.argsort((1.0, 2.0))  # type: ignore[arg-type]


def test_lists_changed_while_read_are_refused(compiled: Kernels) -> None:
    """An item whose float conversion empties the list it is read from: an error, not a
    read past the list's end."""
    values: list[float] = []

    class Shrinking:
        def __float__(self) -> float:
            values.clear()
            return 1.0

    values.extend([Shrinking(), 2.0, 3.0])  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="changed while read"):
        compiled.argsort(values)
    values.extend([Shrinking(), 2.0])  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="changed while read"):
        compiled.affine_costs(values, [1.0, 1.0], [1.0, 1.0], [1.0, 1.0], 1.0, 1.0, 0.0)
