"""Cost-model routing: predicted time to first byte per pod, and the SLO-aware picker."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gateway.errors import SloUnreachable
from gateway.registry import PodState
from gateway.routing.cost import CostModel, Prediction
from gateway.routing.request import RoutingRequest
from indexer import Tier


def predict_all(
    cost: CostModel,
    block_size: int,
    request: RoutingRequest,
    pods: Sequence[PodState],
) -> dict[str, Prediction]:
    """Each candidate's predicted TTFT for this request (computed once per decision)."""
    predictions = request.state.predictions
    missing = [pod for pod in pods if pod.pod.name not in predictions] if predictions else pods
    if not missing:
        return predictions
    match = request.match
    block = float(block_size)
    if match is None:
        candidates = [(pod.pod.name, 0.0, pod.scraped_at, pod.running, pod.waiting)
                      for pod in missing]  # fmt: skip
    elif not match.off_gpu:  # every matched block on GPU: the lengths are the whole answer
        lengths = match.lengths()
        candidates = [
            (pod.pod.name, lengths.get(pod.pod.name, 0) * block, pod.scraped_at, pod.running,
             pod.waiting)
            for pod in missing
        ]  # fmt: skip
    else:
        candidates = []
        for pod in missing:
            name = pod.pod.name
            if not match.tiered(name):
                cached = match.matched(name) * block
            else:
                counts = match.tier_counts(name)
                cached = cost.cached_tokens(
                    counts[Tier.GPU], counts[Tier.CPU], counts[Tier.STORAGE],
                    counts[Tier.EXPECTED], block_size,
                )  # fmt: skip
            candidates.append((name, cached, pod.scraped_at, pod.running, pod.waiting))
    for prediction in cost.predict_many(candidates, request.prompt_tokens):
        predictions[prediction.pod] = prediction
    return predictions


class PredictedTtftScorer:
    """Scores 1 for the pod with the lowest predicted TTFT, less in proportion elsewhere
    (best / predicted); the predictions stay in the cycle state for the picker."""

    name = "predicted-ttft"
    uses_prefix = True

    def __init__(self, cost: CostModel, block_size: int) -> None:
        self._cost = cost
        self._block_size = block_size

    def score(self, request: RoutingRequest, pods: Sequence[PodState]) -> dict[str, float]:
        predictions = predict_all(self._cost, self._block_size, request, pods)
        best = min((predictions[pod.name].ttft_s for pod in pods), default=0.0)
        return {
            pod.name: (best / t if (t := predictions[pod.name].ttft_s) > 0 else 1.0) for pod in pods
        }


class MinPredictedTtftPicker:
    """Lowest predicted TTFT first; pods within `tie_tolerance` of the best are ordered by
    cache affinity (more matched blocks first), then at random.

    `prefill_weight` charges the request's own prefill on a pod that much again: the
    compute a cache miss burns is capacity every later request loses, which this request's
    own TTFT does not see (0: pure TTFT).

    A conversation's first turn is a placement: its later turns follow it to its pod, so
    it goes where the conversation will be served fastest, not where this one request is —
    ranked as if every pod held the best-matched shared prefix (a system prompt is
    prefilled once per pod, then serves every conversation placed there), and among pods
    within `placement_tolerance` of the best, to the least active one (fewest requests
    lately): the instantaneous queue misses conversations between their turns. Without
    this, every new conversation follows its system prompt to one pod and stays there.
    A first turn whose whole prompt a pod already holds (a retry, a regenerated answer) is
    no placement.

    With an SLO (`x-slo-ttft-ms`): the pods predicted to meet it come first, best cache
    affinity first (keeping the cache warm costs nothing the client asked for); if none
    can, the lowest predicted TTFT — or, with `shed`, a 429 + Retry-After.
    """

    name = "min-predicted-ttft"
    uses_prefix = True

    def __init__(
        self,
        cost: CostModel,
        block_size: int,
        rng: random.Random,
        *,
        tie_tolerance: float = 0.05,
        prefill_weight: float = 0.0,
        probe_rate: float = 0.02,
        placement_tolerance: float = 0.25,
        shed: bool = False,
    ) -> None:
        self._cost = cost
        self._block_size = block_size
        self._rng = rng
        self.tie_tolerance = tie_tolerance
        self.prefill_weight = prefill_weight
        self.probe_rate = probe_rate
        self.placement_tolerance = placement_tolerance
        self.shed = shed

    def rank(
        self,
        request: RoutingRequest,
        pods: Sequence[PodState],
        scores: Mapping[str, float],
    ) -> list[PodState]:
        if not pods:
            return []
        predictions = predict_all(self._cost, self._block_size, request, pods)
        match = request.match
        lengths: Mapping[str, int] = match.lengths() if match is not None else {}
        names = [pod.pod.name for pod in pods]
        ttfts = [predictions[name].ttft_s for name in names]
        slo = request.slo_ttft_s
        if slo is not None:
            meeting = [i for i, ttft in enumerate(ttfts) if ttft <= slo]
            if meeting:
                meeting.sort(key=lambda i: (-lengths.get(names[i], 0), ttfts[i]))
                rest = [i for i, ttft in enumerate(ttfts) if ttft > slo]
                rest.sort(key=ttfts.__getitem__)
                return [pods[i] for i in meeting + rest]
            if self.shed:
                best = min(ttfts)
                raise SloUnreachable(
                    f"no pod is predicted to answer within the {slo * 1e3:.0f} ms TTFT "
                    f"objective (best: {best * 1e3:.0f} ms)",
                    retry_after_s=max(1, round(best - slo + 0.5)),
                )
        # A first turn whose whole prompt some pod already holds is a repeat (a retry, a
        # regenerated answer), not a new conversation: it goes where it is cached.
        repeat = 0 < request.prompt_blocks <= max(lengths.values(), default=0)
        placing = request.opens_conversation and self.placement_tolerance >= 0.0 and not repeat
        if placing:
            least = min(predictions[name].own_tokens for name in names)
            costs = [predictions[name].with_own_tokens(least) for name in names]
        elif self.prefill_weight:
            weight = self.prefill_weight
            costs = [
                ttft + weight * predictions[name].own_prefill_s()
                for name, ttft in zip(names, ttfts, strict=True)
            ]
        else:
            costs = ttfts
        order = sorted(range(len(pods)), key=costs.__getitem__)
        ranking = [pods[i] for i in order]
        if self.probe_rate and self._rng.random() < self.probe_rate:
            # Now and then a stale pod goes first: a pod one unlucky answer made look slow
            # gets measured again instead of starving; a pod in use is never probed.
            stale = [pod for pod in ranking[1:] if self._cost.stale(pod.pod.name)]
            if stale:  # the most avoided of them
                ranking.remove(stale[-1])
                ranking.insert(0, stale[-1])
                return ranking
        tolerance = self.placement_tolerance if placing else self.tie_tolerance
        limit = costs[order[0]] * (1.0 + tolerance)
        ties = 1
        while ties < len(order) and costs[order[ties]] <= limit:
            ties += 1
        if ties == 1:
            return ranking
        head = ranking[:ties]
        if placing:
            activity = self._cost.activity
            self._rng.shuffle(head)  # equals in activity and match: no pod favoured by place
            head.sort(
                key=lambda pod: (round(activity(pod.pod.name), 1), -lengths.get(pod.pod.name, 0))
            )
        else:
            # Near-equal predictions: keep the cache warm where it already is; among pods
            # that hold as much, a random one (no pod is favoured by its place in the list).
            head.sort(key=lambda pod: -lengths.get(pod.pod.name, 0))
            most = lengths.get(head[0].pod.name, 0)
            equal = 1
            while equal < len(head) and lengths.get(head[equal].pod.name, 0) == most:
                equal += 1
            if equal > 1:
                head.insert(0, head.pop(self._rng.randrange(equal)))
        ranking[:ties] = head
        return ranking
