"""The clients' latency objectives (`x-slo-ttft-ms`, `x-slo-tpot-ms`): the pods predicted
to meet a TTFT objective go first, best cache affinity first (keeping the cache warm costs
nothing the client asked for), the others after them as retry targets; if none can, the
ranking without it — or, with `shed`, a 429 + Retry-After. A TPOT objective is counted,
and with `shed` a stream no pod is predicted to decode within it is refused."""

from __future__ import annotations

from collections.abc import Sequence

from gateway.control.registry import PodState
from gateway.errors import SloUnreachable
from gateway.routing.predicted import predict_all
from gateway.routing.request import RoutingRequest
from gateway.routing.terms import decision_terms
from predictor import Predictor

TPOT_TOLERANCE = 0.5
"""A pod predicted within this share above a TPOT objective counts as meeting it: a
stream's TPOT moves with the prompts that reach its pod while it decodes, and moving
streams off their cache for a closer prediction costs prefills that lengthen every
stream's steps."""


class SloFeasibleFilter:
    """With a TTFT objective, keeps the pods predicted to meet it, best cache affinity
    first (the others follow them in the ranking, as retry targets); when none can, all of
    them, or a 429 with `shed`. With `shed`, the picker then refuses a stream no ranked pod
    is predicted to decode within its TPOT objective (`check_tpot`)."""

    name = "slo-feasible"

    def __init__(self, cost: Predictor, block_size: int, *, shed: bool) -> None:
        self._cost = cost
        self._block_size = block_size
        self.shed = shed

    def filter(self, request: RoutingRequest, pods: Sequence[PodState]) -> Sequence[PodState]:
        if self.shed and request.streamed and request.slo_tpot_s is not None:
            request.state.tpot_bar = request.slo_tpot_s * (1.0 + TPOT_TOLERANCE)
        slo = request.slo_ttft_s
        if slo is None or not pods:
            return pods
        terms = decision_terms(self._cost, self._block_size, request, pods)
        ttfts, cached = terms.ttfts, terms.cached
        meeting = [i for i, ttft in enumerate(ttfts) if ttft <= slo]
        if not meeting:
            if self.shed:
                raise unreachable(slo, ttfts, None, [])
            return pods
        meeting.sort(key=lambda i: (-cached[i], ttfts[i]))
        rest = [i for i, ttft in enumerate(ttfts) if not ttft <= slo]
        rest.sort(key=ttfts.__getitem__)
        request.state.decided = True
        request.state.fallback = [pods[i] for i in rest]
        return [pods[i] for i in meeting]


def check_tpot(
    cost: Predictor, block_size: int, request: RoutingRequest, ranking: Sequence[PodState]
) -> None:
    """Refuses (`SloUnreachable`) a stream no pod of `ranking` is predicted to decode
    within its TPOT objective, when the filter asked for it."""
    bar = request.state.tpot_bar
    if bar is None or not ranking:
        return
    predictions = predict_all(cost, block_size, request, ranking)
    tpots = [cost.predict_tpot(predictions[pod.pod.name]).tpot_s for pod in ranking]
    if not any(tpot <= bar for tpot in tpots):
        raise unreachable(None, [], bar, tpots)


def unreachable(
    slo: float | None, ttfts: list[float], slo_tpot: float | None, tpots: list[float]
) -> SloUnreachable:
    """The 429 of a request no pod is predicted to serve within its objectives."""
    wanted: list[str] = []
    best: list[str] = []
    late = 0.0
    if slo is not None:
        wanted.append(f"TTFT {slo * 1e3:.0f} ms")
        best.append(f"TTFT {min(ttfts) * 1e3:.0f} ms")
        late = min(ttfts) - slo
    if slo_tpot is not None:
        wanted.append(f"TPOT {slo_tpot * 1e3:.1f} ms with tpot_tolerance")
        best.append(f"TPOT {min(tpots) * 1e3:.1f} ms")
    return SloUnreachable(
        f"no pod is predicted to answer within the objectives ({', '.join(wanted)}; "
        f"best predicted: {', '.join(best)})",
        retry_after_s=max(1, round(late + 0.5)),
    )
