"""Routing profiles: filters → weighted scorers → picker → preferences, each plugin timed."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gateway.control.registry import PodState
from gateway.routing.filters import Filter
from gateway.routing.pickers import Picker
from gateway.routing.request import RoutingRequest
from gateway.routing.scorers import Scorer
from predictor import Prediction

PluginTimer = Callable[[str, float], None]
"""(plugin name, seconds it took in one decision)."""


class Preference(Protocol):
    """Names the candidate that must go first whatever the scores (a pinned conversation's
    pod), or None. Runs after the picker; the rest of the ranking stays as retry targets."""

    name: str

    def prefer(self, request: RoutingRequest, pods: Sequence[PodState]) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Weighted:
    scorer: Scorer
    weight: float


@dataclass(slots=True)  # not frozen: one per decision, and a frozen __init__ costs 2.4×
class Decision:
    """One profile's verdict (read-only once built)."""

    policy: str
    ranking: list[PodState]
    """Candidates that passed the filters, best first."""
    scores: dict[str, float] = field(default_factory=dict)
    """Per pod, the weighted sum of its scores (empty when the profile has no scorer)."""
    components: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per pod, each scorer's score before weighting (for /admin/match; empty when the
    profile has no scorer)."""
    predictions: dict[str, Prediction] = field(default_factory=dict)
    """Per pod, the predicted TTFT, when a plugin of this profile predicted it."""


def _untimed(plugin: str, seconds: float) -> None:
    pass


class RoutingProfile:
    """One policy: filters in order, then sum(weight × clamp(score)), then the picker, then
    the preferences (the first that names a candidate moves it to the front)."""

    def __init__(
        self,
        name: str,
        *,
        filters: Sequence[Filter],
        scorers: Sequence[Weighted],
        picker: Picker,
        preferences: Sequence[Preference] = (),
        timer: PluginTimer = _untimed,
        spec: dict[str, Any] | None = None,
    ) -> None:
        self.name = name
        self.filters = list(filters)
        self.scorers = list(scorers)
        self.picker = picker
        self.preferences = list(preferences)
        self.timer = timer
        self.spec = spec or {}
        """The configuration this profile was built from (normalised)."""
        self.uses_prefix = picker.uses_prefix or any(w.scorer.uses_prefix for w in self.scorers)

    def decide(self, request: RoutingRequest, candidates: Sequence[PodState]) -> Decision:
        clock = time.perf_counter
        timer = self.timer
        pods = candidates  # filters return new lists, or lists nobody changes
        for step in self.filters:
            started = clock()
            pods = step.filter(request, pods)
            timer(step.name, clock() - started)
            if not pods:
                return Decision(self.name, [])
        # without scorers nothing is summed: the picker ranks by its own measure
        totals = dict.fromkeys([pod.pod.name for pod in pods], 0.0) if self.scorers else {}
        components: dict[str, dict[str, float]] = (
            {name: {} for name in totals} if self.scorers else {}
        )
        for weighted in self.scorers:
            started = clock()
            scored = weighted.scorer.score(request, pods)
            timer(weighted.scorer.name, clock() - started)
            for name, value in scored.items():
                clamped = min(1.0, max(0.0, value))
                components[name][weighted.scorer.name] = clamped
                totals[name] += weighted.weight * clamped
        started = clock()
        ranking = self.picker.rank(request, pods, totals)
        timer(self.picker.name, clock() - started)
        for preference in self.preferences:
            started = clock()
            chosen = preference.prefer(request, ranking)
            timer(preference.name, clock() - started)
            if chosen is not None:
                _to_front(ranking, chosen)
                break
        return Decision(self.name, ranking, totals, components, request.state.predictions)


def _to_front(ranking: list[PodState], name: str) -> None:
    for index, state in enumerate(ranking):
        if state.name == name:
            if index:
                ranking.insert(0, ranking.pop(index))
            return
