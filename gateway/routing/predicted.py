"""Each candidate's predicted TTFT as a `Prediction` (with its terms), and the
`predicted-ttft` scorer."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.control.registry import PodState
from gateway.routing.request import RoutingRequest
from gateway.routing.terms import cached_tokens
from predictor import Prediction, Predictor


def predict_all(
    cost: Predictor,
    block_size: int,
    request: RoutingRequest,
    pods: Sequence[PodState],
) -> dict[str, Prediction]:
    """Each candidate's predicted TTFT for this request, with its terms (computed once per
    decision and pod)."""
    predictions = request.state.predictions
    missing = [pod for pod in pods if pod.pod.name not in predictions] if predictions else pods
    if not missing:
        return predictions
    names = [pod.pod.name for pod in missing]
    cached = cached_tokens(cost, block_size, request.match, names)
    candidates = [
        (name, held, pod.scraped_at, pod.running, pod.waiting)
        for name, held, pod in zip(names, cached, missing, strict=True)
    ]
    for prediction in cost.predict_many(candidates, request.prompt_tokens):
        predictions[prediction.pod] = prediction
    return predictions


class PredictedTtftScorer:
    """Scores 1 for the pod with the lowest predicted TTFT, less in proportion elsewhere
    (best / predicted); the predictions stay in the cycle state for the picker."""

    name = "predicted-ttft"
    uses_prefix = True

    def __init__(self, cost: Predictor, block_size: int) -> None:
        self._cost = cost
        self._block_size = block_size

    def score(self, request: RoutingRequest, pods: Sequence[PodState]) -> dict[str, float]:
        predictions = predict_all(self._cost, self._block_size, request, pods)
        best = min((predictions[pod.name].ttft_s for pod in pods), default=0.0)
        return {
            pod.name: (best / t if (t := predictions[pod.name].ttft_s) > 0 else 1.0) for pod in pods
        }
