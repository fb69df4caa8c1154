"""A decision's kernels: the compiled ones (indexer/_native.c) give the pure ones' answers."""

from __future__ import annotations

import math
import random

import pytest

from gateway.routing import kernels
from gateway.routing.cost import _Estimate, _PodWork
from gateway.routing.kernels import Kernels
from gateway.routing.ttft_model import PodSpeed


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
    lists with many equal costs and equal cached lengths, with and without the charges for
    its own prefill and for the delays to the requests waiting on each pod and to those
    arriving there."""
    rng = random.Random(13)
    for size in (0, 1, 2, 7, 64, 200):
        for tolerance in (0.0, 0.05, 0.5):
            for weight, arrival_weight, prefill_weight in (
                (0.0, 0.0, 0.0), (1.0, 0.0, 0.0), (2.5, 0.0, 0.0), (0.0, 1.5, 0.0),
                (1.0, 0.5, 0.0), (0.0, 0.0, 0.5), (2.0, 1.0, 0.5),
            ):  # fmt: skip
                bases = [float(rng.randrange(6)) / 8 for _ in range(size)]
                units = [rng.choice((0.0, 1e-4)) for _ in range(size)]
                ends = [rng.uniform(-1.0, 1.0) for _ in range(size)]
                cached = [float(rng.choice((0, 0, 16, 512, 1024))) for _ in range(size)]
                waits = [float(rng.choice((0, 0, 1, 3))) for _ in range(size)]
                rates = [rng.choice((0.0, 0.0, 2.5, 40.0)) for _ in range(size)]
                args = (bases, units, ends, cached, 1024.0, rng.uniform(0.0, 1.0), 0.25,
                        tolerance, waits, weight, rates, arrival_weight,
                        prefill_weight)  # fmt: skip
                assert compiled.affine_order(*args) == kernels.affine_order(*args)
    # the two within 5 % of the best, the better cached first; both hold as much as each other
    order = kernels.affine_order([1.0, 0.5, 0.51, 2.0], [0.0] * 4, [0.0] * 4,
                                 [0.0, 16.0, 32.0, 0.0], 10.0, 0.0, 1.0, 0.05, [], 0.0, [],
                                 0.0, 0.0)  # fmt: skip
    assert order == ([2, 1, 0, 3], 2, 1)
    # charged the delay to the one request waiting on the second (its TTFT 0.5 + 10 tokens ×
    # 0.1 = 1.5, + 1 × 1.0 = 2.5): it goes last; without a weight the waits are not read.
    # Charged instead for the 2 requests a second reaching it during its 1 s prefill (+ 0.5 ×
    # 2 × 1.0²): last too; without an arrival weight the rates are not read.
    delayed = ([1.0, 0.5, 0.51, 2.0], [0.0, 0.1, 0.0, 0.0], [0.0] * 4, [0.0, 10.0, 0.0, 0.0],
               20.0, 0.0, 1.0, 0.05, [0.0, 1.0, 0.0, 0.0], 1.0, [], 0.0, 0.0)  # fmt: skip
    arriving = (*delayed[:8], [], 0.0, [0.0, 2.0, 0.0, 0.0], 0.5, 0.0)
    # Charged its own 1 s prefill there once more (2.5 against the fourth's 2.0): last too.
    burning = (*delayed[:8], [], 0.0, [], 0.0, 1.0)
    for kernel in (compiled.affine_order, kernels.affine_order):
        assert kernel(*delayed) == ([2, 0, 3, 1], 1, 1)
        assert kernel(*arriving) == ([2, 0, 3, 1], 1, 1)
        assert kernel(*burning) == ([2, 0, 3, 1], 1, 1)
        assert kernel(*delayed[:8], [], 0.0, [], 0.0, 0.0) == ([2, 0, 1, 3], 1, 1)
    one = ([1.0], [1.0], [1.0])
    with pytest.raises(ValueError, match="differ in length"):
        compiled.affine_order(*one, [], 1.0, 1.0, 0.0, 0.05, [], 0.0, [], 0.0, 0.0)
    with pytest.raises(ValueError, match="waits differ in length"):
        compiled.affine_order(*one, [1.0], 1.0, 1.0, 0.0, 0.05, [], 1.0, [], 0.0, 0.0)
    with pytest.raises(ValueError, match="rates differ in length"):
        compiled.affine_order(*one, [1.0], 1.0, 1.0, 0.0, 0.05, [], 0.0, [], 1.0, 0.0)


def _random_work(rng: random.Random, scraped_at: float | None) -> _PodWork:
    work = _PodWork("pod-a")
    work.prefilling = rng.randrange(4)
    work.prefill_tokens = rng.choice((0.0, rng.uniform(0.0, 5000.0)))
    work.in_step_requests = rng.randrange(work.prefilling + 1)
    work.in_step_tokens = rng.uniform(0.0, work.prefill_tokens)
    work.decoding = rng.randrange(3)
    work.step_seeded = rng.random() < 0.5
    work.mean_tokens = rng.uniform(0.0, 3000.0)
    work.step_start = rng.uniform(0.0, 10.0)
    work.decode_step_s = rng.uniform(0.0, 0.05)
    work.version = rng.randrange(100)
    if rng.random() < 0.5:
        work.speed = PodSpeed(rng.uniform(-1.0, 1.0), 3)
    if rng.random() < 0.5:  # noted by the scraper already (else: first sight)
        work.at_scrape = (scraped_at, rng.randrange(4), rng.randrange(3))
    return work


def test_pod_estimate_is_the_pure_one(compiled: Kernels) -> None:
    """Every branch (scraped or not, other replicas' work or not, a seeded step, a pod with
    its own speed or the typical one): the same estimate to the last bit, and the same
    scrape noted on the work."""
    rng = random.Random(11)
    for _ in range(2000):
        theta = tuple(rng.uniform(0.0, 0.5) for _ in range(7))
        scraped_at = rng.choice((None, rng.uniform(0.0, 10.0)))
        running = float(rng.randrange(6))
        waiting = rng.choice((0.0, float(rng.randrange(6)), math.inf, math.nan))
        seed = rng.random()
        works = [_random_work(random.Random(seed), scraped_at) for _ in range(2)]
        args = (theta, rng.uniform(0.5, 2.0), rng.randrange(9), scraped_at, running, waiting)
        pure = kernels.pod_estimate(works[0], *args, _Estimate)
        built = compiled.pod_estimate(works[1], *args, _Estimate)
        assert type(built) is _Estimate
        assert built == pure or str(built) == str(pure)  # (NaN is unequal to itself)
        assert works[1].estimate is built and works[0].estimate is pure
        assert works[1].at_scrape == works[0].at_scrape


def test_pod_estimate_refuses_what_it_cannot_read(compiled: Kernels) -> None:
    work = _PodWork("pod-a")
    theta = (0.0,) * 7
    with pytest.raises(TypeError, match="7-tuple"):
        compiled.pod_estimate(work, (0.0,) * 6, 1.0, 0, None, 0.0, 0.0, _Estimate)
    with pytest.raises(TypeError, match="tuple type"):
        compiled.pod_estimate(work, theta, 1.0, 0, None, 0.0, 0.0, dict)  # type: ignore[type-var]
    with pytest.raises(AttributeError):
        compiled.pod_estimate(object(), theta, 1.0, 0, None, 0.0, 0.0, _Estimate)
    work.at_scrape = "no tuple"  # type: ignore[assignment]
    with pytest.raises(TypeError, match="at_scrape"):
        compiled.pod_estimate(work, theta, 1.0, 0, 1.0, 0.0, 0.0, _Estimate)
