"""What a cost-ranked decision's plugins share: each candidate's tokens held, predicted
TTFT and own prefill for this request (`DecisionTerms`), computed once per decision."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gateway.control.registry import PodState
from indexer import MatchResult, Tier
from predictor import Predictor, Ranking
from predictor.costs import affine_costs

if TYPE_CHECKING:
    from gateway.routing.request import RoutingRequest


def cached_tokens(
    cost: Predictor, block_size: int, match: MatchResult | None, names: list[str] | tuple[str, ...]
) -> list[float]:
    """The prompt tokens each of `names` need not prefill, from the match (GPU and expected
    blocks free, CPU and STORAGE blocks at their load cost)."""
    if match is None:
        return [0.0] * len(names)
    block = float(block_size)
    if not match.offloaded:  # on GPU or expected there: the lengths are the whole answer
        return match.held_tokens(names, block)
    cached = []
    for name in names:
        if not match.offloaded_for(name):
            cached.append(match.matched(name) * block)
        else:
            counts = match.tier_counts(name)
            gpu, cpu, storage = counts[Tier.GPU], counts[Tier.CPU], counts[Tier.STORAGE]
            cached.append(cost.cached_tokens(gpu, cpu, storage, counts[Tier.EXPECTED], block_size))
    return cached


@dataclass(slots=True)
class DecisionTerms:
    """Per candidate (in the order of `pods`), what the cost plugins rank by."""

    pods: Sequence[PodState]
    names: list[str] | tuple[str, ...]
    cached: list[float]
    """Prompt tokens held (CPU and STORAGE blocks at their load cost)."""
    ttfts: list[float]
    """Predicted TTFT (s)."""
    prefills: list[float]
    """Of it, this request's own prefill (s)."""
    ranking: Ranking
    """The predictor's estimate terms of these candidates."""
    now: float
    base: list[float]
    """The TTFT each is costed at: `ttfts`, or for a placement as if each held the
    conversation's shared prefix (`FirstTurnPlacement`)."""


def decision_terms(
    cost: Predictor, block_size: int, request: RoutingRequest, pods: Sequence[PodState]
) -> DecisionTerms:
    """This decision's terms for `pods` (made once, kept in the request's cycle state)."""
    terms = request.state.terms
    if terms is not None and terms.pods is pods:
        return terms
    names = request.routable_names if pods is request.routable else [pod.pod.name for pod in pods]
    cached = cached_tokens(cost, block_size, request.match, names)
    ranking, now = cost.candidates(pods, names)
    held, prompt = cost.work_of(cached, request.prompt_tokens)
    ttfts, prefills = affine_costs(ranking.bases, ranking.units, ranking.ends, held, prompt,
                                   cost.step_term, now)  # fmt: skip
    terms = DecisionTerms(pods, names, cached, ttfts, prefills, ranking, now, ttfts)
    request.state.terms = terms
    return terms
