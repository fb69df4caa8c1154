"""The TPOT model and `x-slo-tpot-ms` in the picker: pure, with an injected clock."""

from __future__ import annotations

import random

import pytest

from gateway.errors import SloUnreachable
from gateway.routing import RoutingRequest
from indexer import IndexConfig, ModelContext, SyncPrefixHashTable
from predictor import Predictor, Ticket
from tests.gateway.ranking import Ranker
from tests.gateway.test_cost_model import BLOCK, MODEL, Clock, pod

PREFILL_S = 0.03
"""Every pod's TTFT here: the pods differ only in how fast they decode."""


def true_tpot(decode_speed: float, sequences: float) -> float:
    return decode_speed * (0.012 + 0.0006 * sequences)


def stream(
    cost: Predictor, clock: Clock, name: str, decode_speed: float, running: int, tokens: int
) -> Ticket:
    """One streamed request to `name` while `running` other sequences decode there (the
    engine's count at a scrape just now): answered after `PREFILL_S`, then `tokens` tokens at
    the pod's true TPOT for that batch."""
    prediction = cost.predict(name, 500, 0.0, clock.now, running=float(running))
    ticket = cost.start(prediction, streamed=True)
    clock.now += PREFILL_S
    cost.first_byte(ticket)
    clock.now += true_tpot(decode_speed, running + 1) * (tokens - 1)
    observed = cost.stream_ended(ticket, tokens)
    assert observed == pytest.approx(true_tpot(decode_speed, running + 1))
    cost.finish(ticket)
    return ticket


def trained(clock: Clock, speeds: dict[str, float], answers: int = 200) -> Predictor:
    cost = Predictor(clock=clock)
    rng = random.Random(3)
    for _ in range(answers):
        for name, speed in speeds.items():
            stream(cost, clock, name, speed, rng.randrange(0, 40), rng.randrange(20, 200))
    return cost


def test_the_tpot_model_learns_each_pods_decode_speed_apart_from_its_prefill() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    rng = random.Random(5)
    errors = []
    for i in range(300):
        for name, speed in (("fast", 1.0), ("slow", 2.0)):
            running = rng.randrange(0, 40)
            ticket = stream(cost, clock, name, speed, running, rng.randrange(20, 200))
            assert ticket.tpot is not None
            truth = true_tpot(speed, running + 1)
            if i >= 200:
                errors.append(abs(ticket.tpot.tpot_s - truth) / truth)
    errors.sort()
    assert errors[int(len(errors) * 0.9)] < 0.10
    assert cost.tpot.speed("slow") / cost.tpot.speed("fast") == pytest.approx(2.0, rel=0.1)
    # both pods answered their first bytes alike: as fast as each other at prefill
    assert cost.speed("slow") / cost.speed("fast") == pytest.approx(1.0, rel=0.1)
    # a pod never answered decodes at the fleet's typical speed
    typical = (cost.tpot.speed("fast") * cost.tpot.speed("slow")) ** 0.5
    assert cost.tpot.speed("new") == pytest.approx(typical)
    cost.forget(["fast"])
    assert cost.tpot.answers("slow") == 0 and cost.tpot.answers("fast") == 300


def test_an_answer_without_a_tpot_teaches_nothing() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    unstreamed = cost.start(cost.predict("p", 100, 0.0), streamed=False)
    assert unstreamed.tpot is None and cost.stream_ended(unstreamed, 50) is None
    one_token = cost.start(cost.predict("p", 100, 0.0), streamed=True)
    clock.now += 0.01
    cost.first_byte(one_token)
    assert cost.stream_ended(one_token, 1) is None
    unanswered = cost.start(cost.predict("p", 100, 0.0), streamed=True)
    assert cost.stream_ended(unanswered, 50) is None  # cut before its first byte
    assert cost.tpot.fleet.observations == 0


def test_a_tpot_objective_reorders_nothing_and_sheds_when_no_pod_can_meet_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slow decoder holds the prompt (the TTFT ranking keeps it there): a TPOT
    objective reorders nothing (moving a stream off its cache costs prefills that lengthen
    every stream's steps); one no pod is predicted to meet, within the tolerance, is shed
    when shedding is on — and a request that is not streamed has no TPOT to meet."""
    clock = Clock()
    cost = trained(clock, {"fast": 1.0, "slow": 2.0})
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK), clock=clock)
    for name in ("fast", "slow"):
        table.register_pod(name, MODEL, publishes_events=False)
    prompt = list(range(1, 1 + 64 * BLOCK))
    hashes = table.prefix_hashes(prompt)
    table.add_prefix("slow", ModelContext(MODEL), hashes)
    match = table.match(ModelContext(MODEL), hashes, ["fast", "slow"])
    pods = [pod("fast"), pod("slow")]
    fast = cost.predict_tpot(cost.predict("fast", len(prompt), 0.0)).tpot_s
    slow = cost.predict_tpot(cost.predict("slow", len(prompt), 0.0)).tpot_s
    assert slow > 1.5 * fast

    def routed(slo_s: float | None, *, shed: bool = False, streamed: bool = True) -> str:
        picker = Ranker(cost, random.Random(0), shed=shed)
        req = RoutingRequest(MODEL, ModelContext(MODEL), len(hashes), match,
                             prompt_tokens=len(prompt), slo_tpot_s=slo_s,
                             streamed=streamed)  # fmt: skip
        return picker.rank(req, pods, {})[0].name

    assert routed(None) == "slow"  # its cache saves the prefill
    assert routed((fast + slow) / 2) == "slow"  # counted, not reordered
    # within the tolerance (half again) of the objective is as good as meeting it
    assert routed(fast / 1.2, shed=True) == "slow"
    monkeypatch.setattr("gateway.routing.objectives.TPOT_TOLERANCE", 0.1)
    with pytest.raises(SloUnreachable) as refused:
        routed(fast / 1.2, shed=True)
    assert refused.value.status == 429 and "TPOT" in refused.value.message
    assert routed(fast / 2) == "slow"  # no shedding: ranked as without the objective
    assert routed(fast / 2, shed=True, streamed=False) == "slow"
    queued = [cost.start(cost.predict("slow", 3000, 0.0), streamed=True) for _ in range(3)]
    assert routed(None) == "fast"  # the holder's queue costs more than its cache saves
    for ticket in queued:
        cost.finish(ticket)
