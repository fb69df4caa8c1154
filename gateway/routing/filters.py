"""Filters: which candidates a decision may choose from."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from gateway.control.registry import PodState
from gateway.routing.load import LoadEstimator
from gateway.routing.request import RoutingRequest


class Filter(Protocol):
    name: str

    def filter(self, request: RoutingRequest, pods: Sequence[PodState]) -> Sequence[PodState]:
        """The candidates kept, in their order (read by the next plugins, never changed)."""
        ...


class RoutableFilter:
    """Ready (per discovery) and healthy (per the metrics scraper)."""

    name = "routable"

    def filter(self, request: RoutingRequest, pods: Sequence[PodState]) -> Sequence[PodState]:
        known = request.routable
        if known is not None and pods is request.candidates:  # the registry's cached answer
            return known
        return [pod for pod in pods if pod.routable]


class HotSpotFilter:
    """Keeps only pods within `margin` requests of the least loaded one.

    Without it, a popular prefix would pile every request onto the pod that holds it:
    cache affinity must never turn one pod into the fleet's queue.
    """

    name = "hot-spot-guard"

    def __init__(self, margin: int, estimator: LoadEstimator | None = None) -> None:
        self.margin = margin
        self.estimator = estimator or LoadEstimator()

    def filter(self, request: RoutingRequest, pods: Sequence[PodState]) -> list[PodState]:
        if len(pods) < 2:
            return list(pods)
        loads = {pod.name: self.estimator.load(pod) for pod in pods}
        least = min(loads.values())
        return [pod for pod in pods if loads[pod.name] < least + self.margin]
