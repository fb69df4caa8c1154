"""The `min-cost` picker: the candidates by the weighted sum of their cost scorers'
seconds, lowest first; near-ties go to the better cache match (or, for a first turn's
placement, to the less loaded pod), and now and then a stale pod is probed."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gateway.control.registry import PodState
from gateway.routing.charges import CostScorer
from gateway.routing.objectives import check_tpot
from gateway.routing.placement import FirstTurnPlacement
from gateway.routing.request import RoutingRequest
from gateway.routing.terms import DecisionTerms, decision_terms
from predictor import Predictor, argsort, most_cached_first, near_ties

TIE_TOLERANCE = 0.05
"""Pods within this share of the best cost go by cache affinity (more held first)."""
PROBE_RATE = 0.02
"""Share of decisions that put first an idle pod unanswered for `predictor.STALE_S`: a pod
one unlucky answer made look slow gets measured again instead of starving."""


class MinCostPicker:
    name = "min-cost"
    uses_prefix = True

    def __init__(
        self,
        cost: Predictor,
        block_size: int,
        rng: random.Random,
        costs: Sequence[CostScorer],
        placement: FirstTurnPlacement | None = None,
    ) -> None:
        self._cost = cost
        self._block_size = block_size
        self._rng = rng
        self.costs = tuple(costs)
        self.placement = placement

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]:
        if not pods:
            return []
        state = request.state
        ranking = [*pods, *state.fallback] if state.decided else self._by_cost(request, pods)
        check_tpot(self._cost, self._block_size, request, ranking)
        return ranking

    def _by_cost(self, request: RoutingRequest, pods: Sequence[PodState]) -> list[PodState]:
        terms = decision_terms(self._cost, self._block_size, request, pods)
        placement = self.placement
        placing = placement is not None and placement.applies(request)
        if placement is not None and placing:
            terms.base = placement.as_if_held(request, terms)
        total = self._total(request, terms)
        order = argsort(total)
        probed = self._probed(order, terms.names)
        if probed is not None:
            return [pods[probed], *(pods[i] for i in order)]
        if placement is not None and placing:
            placement.order(order, total, terms)
        else:
            # Near-equal costs: keep the cache warm where it already is; among pods that
            # hold as much, a random one (none is favoured by its place in the list).
            equal = most_cached_first(order, near_ties(order, total, TIE_TOLERANCE), terms.cached)
            if equal > 1:
                order.insert(0, order.pop(self._rng.randrange(equal)))
        return [pods[i] for i in order]

    def _total(self, request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        """Each candidate's weighted sum of its costs, in the scorers' order (each scorer
        adds its own to the sum in one pass: no list of costs apart)."""
        total: list[float] | None = None
        for scorer in self.costs:
            if scorer.weight:
                total = scorer.add(total, request, terms)
        return [0.0] * len(terms.names) if total is None else total

    def _probed(self, order: list[int], names: Sequence[str]) -> int | None:
        """Now and then a stale pod goes first, taken out of `order` (the most avoided of
        them); a pod in use is never probed."""
        if self._rng.random() >= PROBE_RATE:
            return None
        stale = [i for i in order[1:] if self._cost.stale(names[i])]
        if not stale:
            return None
        order.remove(stale[-1])
        return stale[-1]
