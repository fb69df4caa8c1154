"""The request path's histograms expose exactly what prometheus_client's own would."""

from __future__ import annotations

import re

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest

from gateway.observability.histograms import LabelledHistogram

_CREATED = re.compile(r"^.*_created\{.*\n", re.MULTILINE)


@pytest.mark.parametrize("buckets", [(0.001, 0.01, 0.1, 1.0), (-0.5, 0.0, 0.001, 0.01, 1.0)])
def test_the_exposition_is_prometheus_clients_own(buckets: tuple[float, ...]) -> None:
    ours_registry, theirs_registry = CollectorRegistry(), CollectorRegistry()
    ours = LabelledHistogram(
        "kvgate_test_seconds", "help", ["pod"], buckets=buckets, registry=ours_registry
    )
    theirs = Histogram(
        "kvgate_test_seconds", "help", ["pod"], buckets=buckets, registry=theirs_registry
    )
    # bounds themselves (inclusive), between them, below the first, past the last
    values = [-1.0, -0.5, 0.0, 1e-9, 0.001, 0.0011, 0.05, 1.0, 7.5]
    for index, value in enumerate(values):
        for pod in ("a", "b") if index % 2 else ("a",):
            ours.labels(pod).observe(value)
            theirs.labels(pod).observe(value)
    exposed = generate_latest(ours_registry).decode()
    assert 'kvgate_test_seconds_bucket{le="0.001",pod="a"} 5.0' in exposed
    assert ("kvgate_test_seconds_sum" in exposed) is (buckets[0] >= 0)
    assert 'kvgate_test_seconds_count{pod="b"} 4.0' in exposed
    assert _CREATED.sub("", exposed) == _CREATED.sub("", generate_latest(theirs_registry).decode())
    assert exposed.count("kvgate_test_seconds_created{") == 2


def test_bad_buckets_labels_and_duplicates_are_refused() -> None:
    registry = CollectorRegistry()
    with pytest.raises(ValueError, match="increasing"):
        LabelledHistogram("kvgate_a", "help", ["x"], buckets=(0.1, 0.01), registry=registry)
    histogram = LabelledHistogram("kvgate_b", "help", ["x"], buckets=(0.1,), registry=registry)
    with pytest.raises(ValueError, match="label values"):
        histogram.labels("one", "two")
    with pytest.raises(ValueError, match="Duplicated"):
        LabelledHistogram("kvgate_b", "help", ["x"], buckets=(0.1,), registry=registry)
