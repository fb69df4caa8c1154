"""The default policy's cost ranking as a test builds it: the SLO filter, then the
`min-cost` picker over the predicted TTFT and the charges, with first-turn placement."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gateway.control.registry import PodState
from gateway.routing import (
    ArrivalCost,
    CycleState,
    DelayCost,
    FirstTurnPlacement,
    MinCostPicker,
    RoutingRequest,
    SloFeasibleFilter,
    TtftCost,
)
from predictor import Predictor

BLOCK = 16


class Ranker:
    """`SloFeasibleFilter` → `MinCostPicker`, as a profile runs them."""

    def __init__(
        self,
        cost: Predictor,
        rng: random.Random,
        *,
        shed: bool = False,
        delay_weight: float = 0.0,
        arrival_weight: float = 0.0,
        load_tolerance: float = 0.25,
        placement: bool = True,
    ) -> None:
        window = cost.params.activity_window_s
        costs = (TtftCost(), DelayCost(delay_weight), ArrivalCost(arrival_weight, window))
        placed = FirstTurnPlacement(cost, rng, load_tolerance=load_tolerance) if placement else None
        self.filter = SloFeasibleFilter(cost, BLOCK, shed=shed)
        self.picker = MinCostPicker(cost, BLOCK, rng, costs, placed)

    def rank(
        self, request: RoutingRequest, pods: Sequence[PodState], scores: Mapping[str, float]
    ) -> list[PodState]:
        request.state = CycleState()  # one decision per call, however often `request` is
        kept = self.filter.filter(request, pods)
        return self.picker.rank(request, kept, scores) if kept else []
