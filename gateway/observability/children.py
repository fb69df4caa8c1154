"""Labelled series looked up from a dict, for the request path."""

from __future__ import annotations

from typing import Generic, TypeVar

from prometheus_client import Counter, Gauge

_Metric = TypeVar("_Metric", Counter, Gauge)
_MAX_CHILDREN = 10_000


class Children(Generic[_Metric]):
    """A labelled metric's children from a dict: prometheus_client's `labels()` checks the
    values and takes a lock on every call (~2 µs), and a request looks up about ten. Label
    series are never removed here, so a remembered child is always the live one."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: _Metric) -> None:
        self.metric: _Metric = metric
        self._children: dict[tuple[str, ...], _Metric] = {}

    def labels(self, *values: str) -> _Metric:
        child = self._children.get(values)
        if child is None:
            if len(self._children) >= _MAX_CHILDREN:  # bounded whatever the label values
                self._children.clear()
            child = self._children[values] = self.metric.labels(*values)
        return child
