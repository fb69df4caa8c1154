"""Cost scorers: each adds, per candidate, seconds of cost to a decision the `min-cost`
picker ranks by (lowest first), times its weight. The first is the predicted TTFT itself;
the charges count what sending the request there costs the other requests."""

from __future__ import annotations

from typing import Protocol

from gateway.routing.request import RoutingRequest
from gateway.routing.terms import DecisionTerms
from predictor import delays

CHUNK_TOKENS = 8192
"""The engines' prefill chunk (vLLM's `max_num_batched_tokens` for an OpenAI server on a
large GPU, SGLang's `chunked_prefill_size` there): a longer prompt is prefilled a chunk
per step, so it holds up the requests admitted with it by one chunk, not by all of it."""


class CostScorer(Protocol):
    name: str
    weight: float
    """What each of its costs is multiplied by in the sum (0: not computed)."""

    def costs(self, request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        """Per candidate of `terms`, in its order, seconds of cost."""
        ...

    def add(
        self, total: list[float] | None, request: RoutingRequest, terms: DecisionTerms
    ) -> list[float]:
        """`total` (None: nothing yet) plus `weight` × `costs`, per candidate: the same
        floats, in one pass (what the picker sums by; `total` is not changed)."""
        ...


def weighted(total: list[float] | None, weight: float, costs: list[float]) -> list[float]:
    """`total` + `weight` × `costs` (`total` None: `weight` × `costs`; `costs` itself at
    weight 1, not to be changed)."""
    if total is None:
        return costs if weight == 1.0 else [weight * cost for cost in costs]
    return [t + weight * cost for t, cost in zip(total, costs, strict=True)]


class TtftCost:
    """The predicted time to first byte (as if the shared prefix were held, for a first
    turn's placement)."""

    name = "ttft-cost"
    weight = 1.0

    def costs(self, request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        return terms.base

    def add(
        self, total: list[float] | None, request: RoutingRequest, terms: DecisionTerms
    ) -> list[float]:
        return weighted(total, self.weight, terms.base)


class DelayCost:
    """What the request's prefill adds to the TTFTs of the requests waiting for the pod's
    next step: they are admitted with it, and each waits out its prefill (one chunk of it
    at most: `CHUNK_TOKENS`)."""

    name = "delay-cost"

    def __init__(self, weight: float) -> None:
        self.weight = weight

    def costs(self, request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        return delays(self._delaying(request, terms), terms.ranking.waits)

    def add(
        self, total: list[float] | None, request: RoutingRequest, terms: DecisionTerms
    ) -> list[float]:
        delaying, weight = self._delaying(request, terms), self.weight
        if total is None:
            return weighted(None, weight, delays(delaying, terms.ranking.waits))
        return [  # `weighted(total, weight, self.costs(…))` in one pass
            t + weight * (wait * prefill)
            for t, wait, prefill in zip(total, terms.ranking.waits, delaying, strict=True)
        ]

    @staticmethod
    def _delaying(request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        """Per candidate, the prefill that holds up those admitted with it."""
        chunk, tokens = float(CHUNK_TOKENS), float(request.prompt_tokens)
        if tokens <= chunk:  # (a pod's own uncached tokens are at most the prompt's)
            return terms.prefills
        return [
            prefill * min(1.0, chunk / own) if (own := tokens - held) > 0 else prefill
            for prefill, held in zip(terms.prefills, terms.cached, strict=True)
        ]


class ArrivalCost:
    """What the request's prefill costs the requests its cache binds to the pod that arrive
    while it runs (at their recent rate, each waiting out half of it, λ·P²/2): quadratic in
    the prefill, so it weighs on moving a long history."""

    name = "arrival-cost"

    def __init__(self, weight: float, window_s: float) -> None:
        self.weight = weight / 2.0  # each arrival waits out half the prefill, on average
        self._window_s = window_s

    def costs(self, request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        return terms.ranking.arrivals(terms.prefills, terms.now, self._window_s)

    def add(
        self, total: list[float] | None, request: RoutingRequest, terms: DecisionTerms
    ) -> list[float]:
        if total is None:
            return weighted(None, self.weight, self.costs(request, terms))
        return terms.ranking.add_arrivals(
            total, self.weight, terms.prefills, terms.now, self._window_s
        )
