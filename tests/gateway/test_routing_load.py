"""How routing sees a pod's load: our live in-flight count plus other replicas' share."""

from __future__ import annotations

import math

from gateway.control.discovery import Pod
from gateway.control.registry import PodState
from gateway.routing import HotSpotFilter, LoadEstimator, LoadScorer, RoutingRequest
from indexer import ModelContext


def pod(name: str, **observed: float) -> PodState:
    state = PodState(Pod(name=name, url=f"http://{name}:8000", model="m", ready=True))
    for key, value in observed.items():
        setattr(state, key, value)
    return state


def test_our_requests_count_once_and_live() -> None:
    estimator = LoadEstimator()
    busy = pod("a", inflight=5, running=3.0, waiting=2.0, scraped_at=1.0)
    assert estimator.load(busy) == 5  # the engine's 3 + 2 are our 5, not 5 more
    busy.inflight = 0  # all answered since the scrape: idle now, not busy until the next one
    assert estimator.load(busy) == 0


def test_other_replicas_share_is_what_the_engine_reported_beyond_ours() -> None:
    estimator = LoadEstimator()
    shared = pod("a", inflight=2, running=6.0, waiting=1.0, scraped_at=1.0)
    assert estimator.load(shared) == 7  # ours 2 + others 5
    shared.inflight = 4  # we sent 2 more since: the others' share stays 5
    assert estimator.load(shared) == 9
    shared.running, shared.waiting, shared.scraped_at = 4.0, 0.0, 2.0  # next scrape
    assert estimator.load(shared) == 4  # all of it ours now


def test_an_unknowable_load_is_infinite() -> None:
    assert math.isinf(LoadEstimator().load(pod("a", waiting=float("nan"), scraped_at=1.0)))


def test_scorer_and_guard_share_the_estimate() -> None:
    estimator = LoadEstimator()
    request = RoutingRequest("m", ModelContext("m"), 0, None)
    drained = pod("drained", inflight=6, waiting=6.0, scraped_at=1.0)
    other = pod("other", inflight=1, scraped_at=1.0)
    guard = HotSpotFilter(margin=4, estimator=estimator)
    assert guard.filter(request, [drained, other]) == [other]
    drained.inflight = 0  # its queue drained before the next scrape
    assert guard.filter(request, [drained, other]) == [drained, other]
    scores = LoadScorer(estimator=estimator).score(request, [drained, other])
    assert scores["drained"] == 1.0 > scores["other"]
