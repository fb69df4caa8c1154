"""Routing profiles: filters, weighted scorers and a picker, built by policy name."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from gateway.registry import PodState
from gateway.routing.filters import Filter, HotSpotFilter, RoutableFilter
from gateway.routing.load import LoadEstimator
from gateway.routing.pickers import (
    MaxScorePicker,
    Picker,
    RandomPicker,
    RoundRobinPicker,
    SessionPicker,
)
from gateway.routing.request import RoutingRequest
from gateway.routing.scorers import KVUsageScorer, LoadScorer, PrefixScorer, Scorer
from gateway.settings import Settings


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float


@dataclass(frozen=True, slots=True)
class Decision:
    policy: str
    ranking: list[PodState]
    """Candidates that passed the filters, best first."""
    scores: dict[str, float] = field(default_factory=dict)
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per pod, each scorer's score before weighting (for /admin/match)."""


class RoutingProfile:
    """One policy: filters in order, then sum(weight × clamp(score)), then the picker."""

    def __init__(
        self,
        name: str,
        *,
        filters: Sequence[Filter],
        scorers: Sequence[Weighted],
        picker: Picker,
    ) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self.uses_prefix = any(isinstance(w.scorer, PrefixScorer) for w in self.scorers)

    def decide(self, request: RoutingRequest, candidates: Sequence[PodState]) -> Decision:
        pods = list(candidates)
        for step in self.filters:
            pods = step.filter(request, pods)
            if not pods:
                return Decision(self.name, [])
        totals = {pod.name: 0.0 for pod in pods}
        components: dict[str, dict[str, float]] = {pod.name: {} for pod in pods}
        for weighted in self.scorers:
            for name, value in weighted.scorer.score(request, pods).items():
                clamped = min(1.0, max(0.0, value))
                components[name][weighted.scorer.name] = clamped
                totals[name] += weighted.weight * clamped
        ranking = self.picker.rank(request, pods, totals)
        return Decision(self.name, ranking, totals, components)


def build_policies(settings: Settings, rng: random.Random) -> dict[str, RoutingProfile]:
    routable = RoutableFilter()
    estimator = LoadEstimator()
    hot_spot = HotSpotFilter(settings.hot_spot_margin, estimator)
    prefix = PrefixScorer(settings.tier_weights)
    load = LoadScorer(estimator=estimator)
    # KV usage only breaks ties: it is scraped once a second and every busy cache is full,
    # so at 0.1 it outweighed a request of load difference (routing benchmark, `unique`).
    cache_aware = [Weighted(prefix, 1.0), Weighted(load, 1.0), Weighted(KVUsageScorer(), 0.02)]
    best = MaxScorePicker(rng)
    return {
        "prefix-cache": RoutingProfile(
            "prefix-cache", filters=[routable, hot_spot], scorers=cache_aware, picker=best
        ),
        "least-request": RoutingProfile(
            "least-request", filters=[routable], scorers=[Weighted(load, 1.0)], picker=best
        ),
        "round-robin": RoutingProfile(
            "round-robin", filters=[routable], scorers=[], picker=RoundRobinPicker()
        ),
        "random": RoutingProfile(
            "random", filters=[routable], scorers=[], picker=RandomPicker(rng)
        ),
        "session": RoutingProfile(
            "session",
            filters=[routable],
            scorers=cache_aware,
            picker=SessionPicker(MaxScorePicker(rng)),
        ),
    }
