"""Pickers: order the scored candidates, best first (the proxy retries down the list)."""

from __future__ import annotations

import itertools
import random
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from typing import Protocol

from gateway.control.registry import PodState
from gateway.routing.request import RoutingRequest

_MAX_MODELS = 1024
"""Models whose candidates' order a round-robin picker keeps (its turns are per model too)."""


def _name(pod: PodState) -> str:
    return pod.name


class Picker(Protocol):
    name: str
    uses_prefix: bool

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]: ...


class MaxScorePicker:
    """Highest score first; ties broken at random (shuffled before a stable sort)."""

    name = "max-score"
    uses_prefix = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]:
        shuffled = list(pods)
        self._rng.shuffle(shuffled)
        return sorted(shuffled, key=lambda pod: scores.get(pod.name, 0.0), reverse=True)


class RandomPicker:
    name = "random"
    uses_prefix = False

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]:
        shuffled = list(pods)
        self._rng.shuffle(shuffled)
        return shuffled


class RoundRobinPicker:
    """Each model's pods in turn (by name, so the order survives pods coming and going)."""

    name = "round-robin"
    uses_prefix = False

    def __init__(self) -> None:
        self._turns: dict[str, itertools.count[int]] = {}
        self._orders: dict[str, tuple[Sequence[PodState], list[PodState]]] = {}
        """Per model, the last candidates seen and their order by name: the registry hands
        out the same tuple until a pod comes, goes or changes health, so most decisions
        sort nothing."""

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]:
        if not pods:
            return []
        known = self._orders.get(request.model)
        if known is not None and known[0] is pods:
            ordered = known[1]
        else:
            ordered = sorted(pods, key=_name)
            if isinstance(pods, tuple):  # immutable: safe to recognise by identity
                if len(self._orders) >= _MAX_MODELS:
                    self._orders.clear()
                self._orders[request.model] = (pods, ordered)
        turn = next(self._turns.setdefault(request.model, itertools.count()))
        start = turn % len(ordered)
        return ordered[start:] + ordered[:start]


class SessionPicker:
    """Keeps a session on the pod it was first sent to; otherwise defers to `fallback`.

    Sessions are remembered in a bounded LRU map; a session whose pod is gone (or not a
    candidate now) moves to the fallback's choice.
    """

    name = "session"
    uses_prefix = False

    def __init__(self, fallback: Picker, *, max_sessions: int = 100_000) -> None:
        self._fallback = fallback
        self._max_sessions = max_sessions
        self._sessions: OrderedDict[tuple[str, str], str] = OrderedDict()

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]:
        ranking = self._fallback.rank(request, pods, scores)
        if request.session is None or not ranking:
            return ranking
        key = (request.model, request.session)
        bound = self._sessions.get(key)
        sticky = next((pod for pod in ranking if pod.name == bound), None)
        if sticky is not None:
            ranking.remove(sticky)
            ranking.insert(0, sticky)
        self._sessions[key] = ranking[0].name
        self._sessions.move_to_end(key)
        if len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)
        return ranking
