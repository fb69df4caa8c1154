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


def test_affine_order_is_the_pure_one(compiled: Kernels) -> None:
    """The ranking, its near-ties by cached tokens and the counts: as the pure twin, on
    lists with many equal costs and equal cached lengths."""
    rng = random.Random(13)
    for size in (0, 1, 2, 7, 64, 200):
        for tolerance in (0.0, 0.05, 0.5):
            bases = [float(rng.randrange(6)) / 8 for _ in range(size)]
            units = [rng.choice((0.0, 1e-4)) for _ in range(size)]
            ends = [rng.uniform(-1.0, 1.0) for _ in range(size)]
            cached = [float(rng.choice((0, 0, 16, 512, 1024))) for _ in range(size)]
            args = (bases, units, ends, cached, 1024.0, rng.uniform(0.0, 1.0), 0.25, tolerance)
            assert compiled.affine_order(*args) == kernels.affine_order(*args)
    # the two within 5 % of the best, the better cached first; both hold as much as each other
    order = kernels.affine_order(
        [1.0, 0.5, 0.51, 2.0], [0.0] * 4, [0.0] * 4, [0.0, 16.0, 32.0, 0.0], 10.0, 0.0, 1.0, 0.05
    )
    assert order == ([2, 1, 0, 3], 2, 1)
    with pytest.raises(ValueError, match="differ in length"):
        compiled.affine_order([1.0], [1.0], [1.0], [], 1.0, 1.0, 0.0, 0.05)
