"""The cost model and the min-predicted-TTFT picker: pure, with an injected clock."""

from __future__ import annotations

import json
import random
import statistics
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from gateway.control.discovery import Pod
from gateway.control.registry import PodState
from gateway.errors import SloUnreachable
from gateway.routing import (
    FEATURES,
    Prediction,
    Predictor,
    RoutingRequest,
    predict_all,
)
from gateway.routing.terms import cached_tokens
from indexer import IndexConfig, ModelContext, SyncPrefixHashTable
from predictor import (
    CostParams,
    CostStateError,
    Ticket,
    argsort,
    most_cached_first,
    near_ties,
    parse_export,
)
from predictor import delays as charged_delays
from predictor.features import MAX_COEFFICIENT, MAX_LOG_SPEED
from predictor.fleet import PodSpeed
from tests.gateway.ranking import Ranker

MODEL = "m"
BLOCK = 16


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def pod(name: str) -> PodState:
    return PodState(Pod(name=name, url=f"http://{name}:8000", model=MODEL))


def request(tokens: int, *, slo_s: float | None = None) -> RoutingRequest:
    return RoutingRequest(MODEL, ModelContext(MODEL), tokens // BLOCK, None, prompt_tokens=tokens,
                          slo_ttft_s=slo_s)  # fmt: skip


def serve(
    cost: Predictor, clock: Clock, name: str, tokens: int, true_ttft: float, cached: float = 0.0
) -> float:
    """Route one streamed request to `name` (`cached` of its `tokens` held there), answer it
    after `true_ttft`, finish it."""
    prediction = cost.predict(name, tokens, cached)
    ticket = cost.start(prediction, streamed=True, prompt_tokens=tokens)
    clock.now += true_ttft
    observed = cost.first_byte(ticket)
    cost.finish(ticket)
    assert observed == pytest.approx(true_ttft)
    return prediction.ttft_s


@pytest.fixture
def exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """The picker without probes and near-ties: its order is the costs' alone."""
    monkeypatch.setattr("gateway.routing.min_cost.PROBE_RATE", 0.0)
    monkeypatch.setattr("gateway.routing.min_cost.TIE_TOLERANCE", 0.0)


def test_learning_converges_on_a_synthetic_pod_despite_outliers() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    rng = random.Random(7)
    errors = []
    for i in range(400):
        tokens = rng.randrange(50, 4000)
        truth = 0.004 + 0.02 * tokens / 1000  # a pod 5× faster than the prior
        if i % 25 == 0:
            truth *= 20  # a stalled request now and then must not drag the model
        predicted = serve(cost, clock, "p", tokens, truth * rng.uniform(0.95, 1.05))
        if i >= 300 and i % 25:
            errors.append(abs(predicted - truth) / truth)
    errors.sort()
    assert errors[len(errors) // 2] < 0.05
    assert errors[int(len(errors) * 0.9)] < 0.15


def test_a_new_replica_continues_from_a_peers_models_and_refuses_bad_ones() -> None:
    clock = Clock()
    learned = Predictor(clock=clock)
    rng = random.Random(3)
    for _ in range(200):
        tokens = rng.randrange(100, 4000)
        serve(learned, clock, "fast", tokens, 0.004 + 0.02 * tokens / 1000)
        serve(learned, clock, "slow", tokens, 0.004 + 0.08 * tokens / 1000)
    exported = learned.export()
    assert set(exported["speeds"]) == {"fast", "slow"}
    assert learned.speed("slow") > 2 * learned.speed("fast")

    fresh = Predictor(clock=clock)
    assert fresh.adopt(exported) == 3  # the fleet's model and both pods' speeds
    for name in ("fast", "slow", "never-answered"):
        assert fresh.predict(name, 2000, 0.0).ttft_s == learned.predict(name, 2000, 0.0).ttft_s
    assert fresh.adopt(exported) == 0  # what it has learned (or taken) is not overwritten

    n = len(FEATURES)

    def corrupt(**changes: object) -> dict[str, object]:
        return {**exported, "fleet": {**exported["fleet"], **changes}, "speeds": {}}

    def bad_speed(state: object) -> dict[str, object]:
        return {**exported, "speeds": {"p": state}}

    one = {"log": 0.0, "observations": 1}

    for bad, reason in (
        (corrupt(theta=[1.0, 2.0]), "malformed"),  # the wrong size
        (corrupt(theta=[0.1, float("nan")] + [0.0] * (n - 2)), "non_finite"),
        (corrupt(theta=[0.1, -1.0] + [0.0] * (n - 2)), "out_of_range"),
        (corrupt(theta=[0.1, 1e300] + [0.0] * (n - 2)), "out_of_range"),  # no engine is so slow
        (corrupt(theta=[0.1, 10**400] + [0.0] * (n - 2)), "out_of_range"),
        (corrupt(p=[[1e12] * n] * n), "out_of_range"),  # a covariance no model can reach
        (corrupt(p=[[1e-3] * n] * (n - 1)), "malformed"),
        (corrupt(observations="many"), "malformed"),
        (corrupt(observations=1e20), "malformed"),  # a count is an integer
        (corrupt(observations=10**400), "out_of_range"),
        (corrupt(reference=-1.0), "out_of_range"),
        (corrupt(residual_scale=True), "malformed"),
        ({**exported, "fleet": None}, "malformed"),
        (bad_speed({"log": "fast", "observations": 3}), "malformed"),
        (bad_speed({"log": 1e9, "observations": 3}), "out_of_range"),
        (bad_speed({"log": 0.1, "observations": 0}), "out_of_range"),  # nothing learned
        (bad_speed([0.1, 3]), "malformed"),
        ({**exported, "speeds": {"x" * 254: {"log": 0.1, "observations": 3}}}, "malformed"),
        ({**exported, "speeds": dict.fromkeys(map(str, range(4097)), one)}, "too_large"),
        ({**exported, "version": 1}, "unsupported_version"),  # a model per pod: the earlier
        ({**exported, "version": 99}, "unsupported_version"),
        ("not a model", "malformed"),
    ):
        model = Predictor(clock=clock)
        before = model.export()
        with pytest.raises(CostStateError) as caught:
            model.adopt(bad)
        assert caught.value.reason == reason, (bad, caught.value)
        assert model.export() == before  # nothing taken, not even the part that was good


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        (b'{"version": 2, "fleet": {"observations": 1e400}}', "non_finite"),
        (b'{"version": 2, "fleet": {"reference": NaN}}', "non_finite"),
        (b'{"version": 2, "fleet": {"reference": -Infinity}}', "non_finite"),
        (b"[" * 100_000, "malformed"),  # nested beyond the parser's recursion
        (b'{"version": 2, "fleet": {"observations": 1' + b"0" * 5000 + b"}}", "malformed"),
        (b"\xff{}", "malformed"),
        (b"{}" + b" " * (4 * 1024 * 1024), "too_large"),
    ],
)
def test_an_export_s_json_is_refused_with_its_reason(data: bytes, reason: str) -> None:
    with pytest.raises(CostStateError) as caught:
        parse_export(data)
    assert caught.value.reason == reason
    assert "\n" not in str(caught.value)


def test_learning_keeps_the_ranges_a_peer_s_export_is_held_to() -> None:
    """Whatever the answers, the model's state stays where `check_export` accepts it (a
    replica's export is always another's valid bootstrap)."""
    clock = Clock()
    cost = Predictor(clock=clock)
    for tokens, ttft in [(1, 5e5), (100_000, 1e-3), (1, 9e5), (50, 3e5)] * 30:
        ticket = cost.start(cost.predict("p", tokens, 0.0), streamed=True, prompt_tokens=tokens)
        clock.now += ttft
        cost.first_byte(ticket)
        cost.finish(ticket)
    for _ in range(300):  # a base term of 9e5 s: beyond any physical engine's
        cost.fleet.learn((1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), 9e5)
    assert cost.fleet.coefficients[0] == MAX_COEFFICIENT
    exported = json.loads(json.dumps(cost.export(), allow_nan=False))
    assert Predictor(clock=clock).adopt(exported) == 2
    speed = PodSpeed()
    for _ in range(3000):
        speed.learn(1e9, 1e-6, CostParams())
    assert speed.log == MAX_LOG_SPEED


def test_a_new_pod_starts_from_the_fleets_model() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    for _ in range(200):
        serve(cost, clock, "old", 1000, 0.030)
    fresh = cost.predict("new", 1000, 0.0).ttft_s
    assert fresh == pytest.approx(0.030, rel=0.2)


def test_a_prior_scale_starts_the_model_that_many_times_slower() -> None:
    clock = Clock()
    plain = Predictor(clock=clock)
    slower = Predictor(CostParams().with_prior_scale(2.5), clock=clock)
    assert slower.predict("p", 1500, 0.0).ttft_s == pytest.approx(
        2.5 * plain.predict("p", 1500, 0.0).ttft_s
    )
    tpot = slower.predict_tpot(slower.predict("p", 1500, 0.0)).tpot_s  # its decode too
    assert tpot == pytest.approx(2.5 * plain.predict_tpot(plain.predict("p", 1500, 0.0)).tpot_s)
    # the current step's remainder is measured on the pod itself: its weight is not scaled
    step = FEATURES.index("step_remaining")
    assert slower.fleet.theta[step] == plain.fleet.theta[step] == 1.0
    for _ in range(300):  # and it still learns what the pods show
        serve(slower, clock, "p", 1000, 0.030)
    assert slower.predict("p", 1000, 0.0).ttft_s == pytest.approx(0.030, rel=0.1)


def test_coefficients_never_go_negative() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    for tokens in (4000, 10, 3000, 20, 5000):  # bigger prompts answered faster: noise
        serve(cost, clock, "p", tokens, 0.5 if tokens < 100 else 0.001)
    assert all(c >= 0.0 for c in cost.fleet.theta)


def test_queued_work_is_added_at_decision_and_leaves_at_first_byte() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    first = cost.start(cost.predict("p", 2000, 0.0), streamed=True)
    second = cost.start(cost.predict("p", 1000, 500.0), streamed=True)
    assert cost.outstanding("p") == (2500.0, 2, 0)
    # the first, sent to an idle pod, is in its step; the second waits behind it
    queued = cost.predict("p", 100, 0.0)
    assert (queued.in_step_tokens, queued.queued_tokens, queued.queued_requests) == (
        2000.0,
        500.0,
        1.0,
    )
    cost.first_byte(first)
    assert cost.outstanding("p") == (500.0, 1, 1)
    cost.finish(second)  # failed before its first byte
    cost.finish(first)
    assert cost.outstanding("p") == (0.0, 0, 0)


def test_a_request_to_an_idle_pod_begins_a_step_the_next_one_waits_out() -> None:
    """An idle engine starts a prefill as soon as the request arrives: a request sent
    during it waits for what is left of that prefill, not for all of it; the prefill's
    length is no decode step, and once it answers the next step holds the second."""
    clock = Clock()
    cost = Predictor(clock=clock)
    alone = cost.predict("p", 2000, 0.0).ttft_s
    first = cost.start(cost.predict("p", 2000, 0.0), streamed=True)
    behind = cost.predict("p", 500, 0.0)
    assert behind.step_remaining_s == pytest.approx(alone)  # all of the first is left
    clock.now += 0.75 * alone
    later = cost.predict("p", 500, 0.0)
    assert later.step_remaining_s == pytest.approx(0.25 * alone)
    assert later.ttft_s == pytest.approx(behind.ttft_s - 0.75 * alone)
    second = cost.start(later, streamed=True)
    clock.now += 0.25 * alone
    cost.pulse("p")  # the first's first token: the step it began has ended
    cost.first_byte(first)
    assert cost.predict("p", 10, 0.0).in_step_tokens == 500.0  # the second is in this one
    clock.now += 0.05
    cost.pulse("p")
    cost.first_byte(second)
    assert cost.outstanding("p") == (0.0, 0, 2)
    clock.now += 0.02
    cost.pulse("p")  # a decode step: the only length recorded, not the seeded prefill
    assert cost.predict("p", 10, 0.0).step_remaining_s <= 0.02 + 1e-9
    for ticket in (first, second):
        cost.finish(ticket)


def test_unstreamed_prefill_is_taken_as_done_at_its_predicted_time() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    prediction = cost.predict("p", 1000, 0.0)
    ticket = cost.start(prediction, streamed=False)
    assert cost.outstanding("p")[0] == 1000.0
    clock.now += prediction.ttft_s + 0.001
    assert cost.outstanding("p") == (0.0, 0, 1)
    assert cost.first_byte(ticket) is None  # its first byte is its last: not a TTFT
    cost.finish(ticket)
    assert cost.outstanding("p") == (0.0, 0, 0)
    assert cost.fleet.observations == 0 and cost.answers("p") == 0


def test_other_replicas_queue_comes_from_the_scrape() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    for _ in range(20):  # our requests here average ~1000 uncached tokens
        cost.finish(cost.start(cost.predict("p", 1000, 0.0), streamed=True))
    ours = cost.start(cost.predict("p", 1000, 0.0), streamed=True)
    # The engine reports 3 waiting: ours plus 2 from other replicas.
    seen = cost.predict("p", 100, 0.0, 5.0, running=0.0, waiting=3.0)
    mean_tokens = 1000 * (1 - 0.95**21)  # the pod's running mean of uncached tokens
    assert seen.queued_tokens == pytest.approx(1000 + 2 * mean_tokens)
    cost.finish(ours)


def _trained_fleet(clock: Clock, speeds: dict[str, float]) -> Predictor:
    cost = Predictor(clock=clock)
    rng = random.Random(1)
    for _ in range(150):
        for name, slowdown in speeds.items():
            tokens = rng.randrange(100, 3000)
            serve(cost, clock, name, tokens, slowdown * (0.005 + 0.03 * tokens / 1000))
    return cost


def _system_prompt_on_the_holder(
    clock: Clock,
) -> tuple[SyncPrefixHashTable, list[int], Predictor]:
    """Two pods alike, "holder" and "other", trained alike; a 64-block system prompt
    cached on the holder."""
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK), clock=clock)
    for name in ("holder", "other"):
        table.register_pod(name, MODEL, publishes_events=False)
    system = list(range(1, 1 + 64 * BLOCK))
    table.add_prefix("holder", ModelContext(MODEL), table.prefix_hashes(system))
    return table, system, _trained_fleet(clock, {"holder": 1.0, "other": 1.0})


def test_a_slow_pod_gets_less_traffic() -> None:
    clock = Clock()
    cost = _trained_fleet(clock, {"fast": 1.0, "slow": 2.0})
    picker = Ranker(cost, random.Random(0))
    pods = [pod("fast"), pod("slow")]
    chosen: Counter[str] = Counter()
    tickets = []
    for _ in range(60):  # a burst of equal requests, none answered yet
        req = request(1500)
        ranking = picker.rank(req, pods, {})
        prediction = predict_all(cost, BLOCK, req, ranking[:1])[ranking[0].name]
        tickets.append(cost.start(prediction, streamed=True))
        chosen[ranking[0].name] += 1
    assert chosen["slow"] > 0  # queueing on the fast pod eventually costs more
    assert chosen["fast"] >= 1.6 * chosen["slow"]


def test_slo_prefers_cache_affinity_among_pods_that_meet_it() -> None:
    clock = Clock()
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK), clock=clock)
    for name in ("holder", "idle"):
        table.register_pod(name, MODEL, publishes_events=False)
    prompt = list(range(1, 1 + 64 * BLOCK))
    hashes = table.prefix_hashes(prompt)
    table.add_prefix("holder", ModelContext(MODEL), hashes)
    cost = _trained_fleet(clock, {"holder": 1.0, "idle": 1.0})
    pods = [pod("holder"), pod("idle")]
    busy = [cost.start(cost.predict("holder", 3000, 0.0), streamed=True) for _ in range(3)]
    match = table.match(ModelContext(MODEL), hashes, ["holder", "idle"])

    def routed(slo_s: float | None, *, shed: bool = False) -> str:
        picker = Ranker(cost, random.Random(0), shed=shed)
        req = RoutingRequest(MODEL, ModelContext(MODEL), len(hashes), match,
                             prompt_tokens=len(prompt), slo_ttft_s=slo_s)  # fmt: skip
        return picker.rank(req, pods, {})[0].name

    plain = predict_all(cost, BLOCK, request(len(prompt)), pods)
    assert routed(None) == "idle"  # the holder's queue costs more than its cache saves
    generous = 2 * max(p.ttft_s for p in plain.values())
    assert routed(generous) == "holder"  # both meet it: keep the cache warm
    with pytest.raises(SloUnreachable) as refused:
        routed(0.0001, shed=True)
    assert refused.value.status == 429 and refused.value.retry_after_s >= 1
    assert routed(0.0001) == "idle"  # no shedding: the lowest predicted TTFT
    for ticket in busy:
        cost.finish(ticket)


def test_a_scrape_noted_when_it_arrives_adds_no_phantom_queue() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    tickets = [cost.start(cost.predict("p", 1000, 0.0), streamed=True) for _ in range(3)]
    cost.note_scrape("p", 5.0)  # the engine then reported our 3 requests waiting
    for ticket in tickets[:2]:
        cost.first_byte(ticket)  # two of them answered since
    seen = cost.predict("p", 100, 0.0, 5.0, running=0.0, waiting=3.0)
    assert seen.queued_tokens == 1000.0 and seen.queued_requests == 1.0
    assert seen.decoding == 2.0  # ours, not another replica's
    for ticket in tickets:
        cost.finish(ticket)


def test_a_long_quiet_spell_does_not_wind_the_model_up() -> None:
    """Thousands of answers that never vary some features (no queue, nothing decoding):
    forgetting inflates the covariance along them (windup) unless it is bounded, and one
    unusual request would then swing the model."""
    clock = Clock()
    cost = Predictor(clock=clock)
    start = cost.fleet.covariance_trace
    rng = random.Random(3)
    for _ in range(3000):
        tokens = rng.randrange(500, 600)
        serve(cost, clock, "p", tokens, 0.004 + 0.02 * tokens / 1000)
    assert cost.fleet.covariance_trace <= 10 * start + 1e-9


def test_an_untokenized_request_does_not_train_the_model() -> None:
    clock = Clock()
    cost = Predictor(clock=clock)
    ticket = cost.start(cost.predict("p", 5000, 0.0), streamed=True, learn=False)
    clock.now += 0.5
    assert cost.first_byte(ticket) == pytest.approx(0.5)  # still observed (SLO counters)
    cost.finish(ticket)
    assert cost.fleet.observations == 0 and cost.answers("p") == 0
    assert cost.outstanding("p") == (0.0, 0, 0)


def test_a_stale_pod_is_probed_now_and_then_and_a_busy_one_never() -> None:
    """One unlucky early answer must not starve a pod for good: idle and without answers
    for a while, it is put first in a few decisions so that it is measured again."""
    clock = Clock()
    cost = Predictor(clock=clock)
    for _ in range(50):
        serve(cost, clock, "fast", 1000, 0.030)
    for _ in range(5):
        serve(cost, clock, "unlucky", 1000, 0.300)  # a bad start: 10× slower
    picker = Ranker(cost, random.Random(0))
    pods = [pod("fast"), pod("unlucky")]

    def firsts(decisions: int) -> Counter[str]:
        return Counter(picker.rank(request(1000), pods, {})[0].name for _ in range(decisions))

    assert firsts(200)["unlucky"] == 0  # not stale yet: its own model rules it out
    clock.now += 60.0  # a minute without an answer from it, nothing in flight
    probed = firsts(200)["unlucky"]
    assert 5 <= probed <= 40  # about probe_rate of the decisions
    busy = cost.start(cost.predict("unlucky", 1000, 0.0), streamed=True)
    assert firsts(200)["unlucky"] == 0  # in use: never probed
    cost.finish(busy)


def test_pods_never_answered_follow_the_fleets_live_model() -> None:
    """Before its first answer a pod is predicted with the fleet's model as it is now, not
    as it was when the pod was first seen: with a pessimistic prior, the first pod to
    answer would otherwise look faster than every other and take every request."""
    clock = Clock()
    cost = Predictor(clock=clock)
    for name in ("a", "b"):
        cost.predict(name, 1000, 0.0)  # both seen at once, at the prior
    for _ in range(100):
        serve(cost, clock, "a", 1000, 0.030)  # far faster than the prior says
    assert cost.predict("b", 1000, 0.0).ttft_s == pytest.approx(
        cost.predict("a", 1000, 0.0).ttft_s, rel=0.1
    )
    serve(cost, clock, "b", 1000, 0.030)  # its own model then starts from the fleet's
    assert cost.predict("b", 1000, 0.0).ttft_s == pytest.approx(0.030, rel=0.2)


def test_first_turns_are_placed_by_load_despite_a_shared_prefix() -> None:
    """A new conversation does not follow its system prompt to the one pod that holds it
    (where all its later turns would then pile up): pods are ranked as if each held its
    system messages and the least loaded one (by its recent requests and their work),
    within the tolerance, gets it. A later turn, whose conversation the holder alone has,
    stays there; so does a first turn without system messages whose start the holder alone has (a
    conversation's history sent as one message, as replayed traces send it)."""
    clock = Clock()
    names = ("holder", "other")
    table, system, cost = _system_prompt_on_the_holder(clock)
    clock.now += 600.0  # the training traffic has decayed away
    picker = Ranker(cost, random.Random(0))
    pods = [pod(name) for name in names]

    def place(prompt: list[int], *, opens: bool, system_messages: bool = True) -> str:
        hashes = table.prefix_hashes(prompt)
        match = table.match(ModelContext(MODEL), hashes, list(names))
        share = len(system) / len(prompt) if opens and system_messages else 0.0
        req = RoutingRequest(MODEL, ModelContext(MODEL), len(hashes), match,
                             prompt_tokens=len(prompt), opens_conversation=opens,
                             preamble_share=share)  # fmt: skip
        chosen = picker.rank(req, pods, {})[0].name
        prediction = predict_all(cost, BLOCK, req, [pods[names.index(chosen)]])[chosen]
        fleet_own = len(prompt) - match.longest() * BLOCK  # as the router counts it
        cost.finish(cost.start(prediction, streamed=True, fleet_own_tokens=fleet_own))
        clock.now += 0.2
        return chosen

    first_turns = Counter(place(system + [10_000 + i] * 3 * BLOCK, opens=True) for i in range(10))
    assert first_turns["holder"] >= 4 and first_turns["other"] >= 4
    later = Counter(place(system + [20_000 + i] * 3 * BLOCK, opens=False) for i in range(4))
    assert later == {"holder": 4}  # no placement: the cache saving decides
    history = Counter(place(system + [25_000 + i] * 3 * BLOCK, opens=True, system_messages=False)
                      for i in range(4))  # fmt: skip
    assert history == {"holder": 4}  # its holder keeps what it holds
    asked = system + [30_000] * 3 * BLOCK
    table.add_prefix("other", ModelContext(MODEL), table.prefix_hashes(asked))
    for _ in range(4):  # "other" is the more active now, but holds the whole prompt: a repeat
        cost.finish(cost.start(cost.predict("other", 10, 0.0), streamed=True))
    assert Counter(place(asked, opens=True) for _ in range(3)) == {"other": 3}


def test_a_pod_just_seen_is_not_stale_until_it_stays_unanswered() -> None:
    """A new pod is predicted with the fleet's model; probing it before it had a chance to
    answer would send a repeat prompt away from its cache (2 % of a fresh gateway's
    decisions went to never-answered pods)."""
    clock = Clock()
    cost = Predictor(clock=clock)
    cost.predict("new", 1000, 0.0)
    assert not cost.stale("new")
    clock.now += 11.0  # idle and unanswered since it was seen
    assert cost.stale("new")


def test_the_current_step_is_timed_from_the_relayed_chunks() -> None:
    """Chunks leave an engine at the end of its steps: the first after a quiet spell starts
    the next one. A request decided mid-step waits out the rest of it; one sent before the
    step began is in it (admitted, or waiting behind it), one sent after waits for the next."""
    clock = Clock()
    cost = Predictor(clock=clock)
    running = cost.start(cost.predict("p", 500, 0.0), streamed=True)
    for _ in range(6):  # a decode step of 30 ms, each ending in a burst of chunks
        clock.now += 0.0295
        cost.pulse("p")
        clock.now += 0.0005
        cost.pulse("p")  # same burst: no new step
    cost.first_byte(running)
    assert cost.step("p") == (pytest.approx(clock.now - 0.0005), pytest.approx(0.030))

    clock.now += 0.0095  # 10 ms into a step that only decodes
    mid_step = cost.predict("p", 1000, 0.0)
    assert mid_step.busy == 1.0
    assert mid_step.step_remaining_s == pytest.approx(0.020, abs=1e-6)
    assert mid_step.queued_tokens == 0.0 and mid_step.in_step_tokens == 0.0

    early = cost.start(cost.predict("p", 800, 0.0), streamed=True)  # waits for the next step
    assert cost.predict("p", 100, 0.0).queued_tokens == 800.0
    clock.now += 0.020
    cost.pulse("p")  # the step ends: `early` is admitted in the one that begins now
    seen = cost.predict("p", 100, 0.0)
    assert seen.in_step_tokens == 800.0 and seen.queued_tokens == 0.0
    speed, theta = seen.speed, seen.coefficients
    in_step = speed * (theta[1] * 800 / 1000 + theta[0])  # its prefill, at the model's rates
    assert seen.step_remaining_s == pytest.approx(0.030 + in_step)
    cost.first_byte(early)
    assert cost.predict("p", 100, 0.0).in_step_tokens == 0.0
    cost.finish(early)
    cost.finish(running)
    clock.now += 1.0
    idle = cost.predict("p", 100, 0.0)
    assert idle.busy == 0.0 and idle.step_remaining_s == 0.0  # an idle engine starts at once


def test_a_step_that_prefilled_one_of_ours_is_not_taken_for_a_decode_step() -> None:
    """A step at whose end one of our requests sent before it got its first byte admitted
    that request: its length is a prefill step's, not the pod's decode step, even when every
    recent step admitted a prompt (unique prompts at high load). Otherwise the decode step
    grows to 200 ms, every prediction waits out a step that ended long before, and chunks
    20 ms apart no longer begin steps."""
    clock = Clock()
    cost = Predictor(clock=clock)
    decoding = cost.start(cost.predict("p", 500, 0.0), streamed=True)
    clock.now += 0.1
    cost.pulse("p")  # the idle pod's own step (seeded): no decode step either
    cost.first_byte(decoding)
    for _ in range(4):  # pure decode steps of 20 ms
        clock.now += 0.020
        cost.pulse("p")
    assert cost.step("p")[1] == pytest.approx(0.020)
    admitted = None
    for _ in range(12):  # each 200 ms step prefills the prompt sent during the one before
        waiting = cost.start(cost.predict("p", 2000, 0.0), streamed=True)
        clock.now += 0.200
        cost.pulse("p")
        if admitted is not None:
            cost.first_byte(admitted)
        admitted = waiting
    assert cost.step("p")[1] == pytest.approx(0.020)
    assert admitted is not None
    clock.now += 0.200
    cost.pulse("p")
    cost.first_byte(admitted)
    clock.now += 0.020
    cost.pulse("p")  # a decode chunk 20 ms later begins a step
    assert cost.step("p") == (pytest.approx(clock.now), pytest.approx(0.020))
    clock.now += 0.010
    assert cost.predict("p", 100, 0.0).step_remaining_s == pytest.approx(0.010)


def test_each_pod_learns_its_speed_and_a_new_pod_starts_at_the_typical_one() -> None:
    clock = Clock()
    cost = _trained_fleet(clock, {"fast": 1.0, "slow": 2.0, "slower": 4.0})
    fast, slow, slower = (cost.speed(name) for name in ("fast", "slow", "slower"))
    assert slow / fast == pytest.approx(2.0, rel=0.15)
    assert slower / fast == pytest.approx(4.0, rel=0.15)
    assert cost.speed("new") == pytest.approx((fast * slow * slower) ** (1 / 3))
    for name, slowdown in (("fast", 1.0), ("slower", 4.0)):
        truth = slowdown * (0.005 + 0.03 * 2000 / 1000)
        assert cost.predict(name, 2000, 0.0).ttft_s == pytest.approx(truth, rel=0.15)
    cost.forget(["fast", "slow"])  # "slower" is gone: it no longer sets the typical speed
    assert cost.speed("new") == pytest.approx((fast * slow) ** 0.5)


def delay_to_waiting(prediction: Prediction) -> float:
    """What the predicted request adds to the TTFTs of the requests waiting with it for the
    pod's next step: its prefill, for each of them."""
    delay: float = prediction.queued_requests * prediction.own_prefill_s()
    assert prediction.delay_to_queued_s() == delay  # as /admin/match shows it
    return delay


def _one_waiting_on_the_faster_pod() -> tuple[Predictor, list[PodState], tuple[Ticket, Ticket]]:
    """A pod ("fast") whose step runs with one request waiting for the next, and an idle
    one 1.8× as slow ("slow"): the model, the pods, and the two requests' tickets."""
    cost = _trained_fleet(Clock(), {"fast": 1.0, "slow": 1.8})
    seeded = cost.start(cost.predict("fast", 100, 0.0), streamed=True)  # begins a step
    waiting = cost.start(cost.predict("fast", 100, 0.0), streamed=True)  # waits for the next
    return cost, [pod("fast"), pod("slow")], (seeded, waiting)


@pytest.mark.usefixtures("exact")
def test_delay_weight_charges_what_a_request_adds_to_those_waiting() -> None:
    """A faster pod where a request waits for the next step, or a slower idle one: by its
    own TTFT the new request goes to the faster; charged its prefill again for the request
    it would delay there (`delay_weight`), to the idle one."""
    cost, pods, (seeded, waiting) = _one_waiting_on_the_faster_pod()
    req = request(2000)
    predictions = predict_all(cost, BLOCK, req, pods)
    assert predictions["fast"].queued_requests == 1.0 and predictions["slow"].queued_requests == 0
    assert predictions["fast"].ttft_s < predictions["slow"].ttft_s
    ranked = {}
    for weight in (0.0, 1.0):
        picker = Ranker(cost, random.Random(0), delay_weight=weight)
        ranked[weight] = [state.name for state in picker.rank(req, pods, {})]
    assert ranked == {0.0: ["fast", "slow"], 1.0: ["slow", "fast"]}
    for ticket in (seeded, waiting):
        cost.finish(ticket)


@pytest.mark.usefixtures("exact")
def test_a_prompt_beyond_the_engines_chunk_delays_those_waiting_by_a_chunk_at_most(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An engine prefills a prompt longer than its chunk a chunk per step, after the
    requests waiting there: those admitted with it wait out one chunk of it, not all of it.
    So the delay charge of a long prompt is its prefill × chunk / its uncached tokens: with
    a chunk of the prompt's size it goes to the idle pod as above; with a chunk a quarter
    of it, to the faster pod again (its charge a quarter, no longer worth the slow pod)."""
    cost, pods, (seeded, waiting) = _one_waiting_on_the_faster_pod()
    req = request(2000)
    ttfts, prefills = cost.rank_costs(pods, [0.0, 0.0], 2000)
    ranked = {}
    for chunk in (2000, 500):
        monkeypatch.setattr("gateway.routing.charges.CHUNK_TOKENS", chunk)
        picker = Ranker(cost, random.Random(0), delay_weight=1.0)
        ranked[chunk] = [state.name for state in picker.rank(req, pods, {})]
        share = min(1.0, chunk / 2000)
        waits = (1.0, 0.0)
        charged = [
            ttft + wait * prefill * share
            for ttft, wait, prefill in zip(ttfts, waits, prefills, strict=True)
        ]
        assert ranked[chunk] == [pods[i].name for i in sorted(range(2), key=charged.__getitem__)]
    assert ranked == {2000: ["slow", "fast"], 500: ["fast", "slow"]}
    for ticket in (seeded, waiting):
        cost.finish(ticket)


def _ranking(
    cost: Predictor, req: RoutingRequest, pods: list[PodState], **weights: float
) -> list[str]:
    """The picker's order of `pods` for `req` with `weights`: no probe, no near-ties."""
    picker = Ranker(cost, random.Random(0), **weights)
    return [state.name for state in picker.rank(req, pods, {})]


@pytest.mark.usefixtures("exact")
def test_arrival_weight_charges_what_a_prefill_costs_the_requests_bound_to_the_pod() -> None:
    """Two pods as fast as each other: one with a request waiting, one idle that was just
    sent a burst. By its own TTFT a long prompt goes to the idle one; charged for the
    requests that reach that pod while its prefill runs (`arrival_weight`: their recent
    rate × the prefill × half of it, each waiting out the rest), to the one with less
    traffic — when the burst is bound to its pod by what the pod holds (turns of the
    conversations it serves). A burst that found nothing cached there (one-shot prompts)
    keeps no such rate: those requests go elsewhere while the prefill runs, at no cost of
    theirs, and the long prompt takes the idle pod."""
    names = ("quiet", "busy")
    pods = [pod("quiet"), pod("busy")]
    req = request(6000)
    for held, expected in ((180.0, ["quiet", "busy"]), (0.0, ["busy", "quiet"])):
        clock = Clock()
        cost = _trained_fleet(clock, {"quiet": 1.0, "busy": 1.0})
        clock.now += 200.0  # the training's traffic is forgotten
        for _ in range(40):
            answered = cost.predict("busy", 200, held).ttft_s  # as predicted: speed unchanged
            serve(cost, clock, "busy", 200, answered, cached=held)
        waiting = cost.start(cost.predict("quiet", 300, 0.0), streamed=True, prompt_tokens=300)
        ttfts, prefills = cost.rank_costs(pods, [0.0, 0.0], 6000)
        assert ttfts[1] < ttfts[0]
        rates = [cost.bound_rate(name) for name in names]
        bound = 1.0 - cost.predict("busy", 200, held).own_tokens / cost.work_of((), 200)[1]
        assert cost.activity("busy") == pytest.approx(40, rel=0.05)
        assert rates[1] == pytest.approx(40 * bound / cost.params.activity_window_s, rel=0.05)
        assert rates[0] == 0.0  # the one waiting there found nothing cached
        ranked = {}
        for weight in (0.0, 1.0):
            ranked[weight] = _ranking(cost, req, pods, arrival_weight=weight)
            charged = {
                name: ttft + weight / 2 * rate * prefill**2
                for name, ttft, rate, prefill in zip(names, ttfts, rates, prefills, strict=True)
            }
            assert ranked[weight] == sorted(charged, key=charged.__getitem__)
        assert ranked == {0.0: ["busy", "quiet"], 1.0: expected}
        cost.finish(waiting)


@pytest.mark.usefixtures("exact")
def test_the_pickers_costs_are_the_predictions_themselves() -> None:
    """The picker ranks by `rank_costs` (no Prediction per pod); the chosen pod's
    Prediction, made at dispatch, must say the same, whatever the pods' state."""
    clock = Clock()
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK), clock=clock)
    names = ("idle", "busy", "scraped", "holder")
    for name in names:
        table.register_pod(name, MODEL, publishes_events=False)
    prompt = list(range(1, 1 + 40 * BLOCK))
    hashes = table.prefix_hashes(prompt)
    table.add_prefix("holder", ModelContext(MODEL), hashes[:30])
    cost = _trained_fleet(clock, dict.fromkeys(names, 1.0) | {"busy": 2.0})
    running = cost.start(cost.predict("busy", 3000, 0.0), streamed=True)
    cost.pulse("busy")
    clock.now += 0.02
    cost.pulse("busy")
    queued = cost.start(cost.predict("busy", 1500, 0.0), streamed=True)
    clock.now += 0.005
    pods = [pod(name) for name in names]
    pods[2].scraped_at, pods[2].running, pods[2].waiting = 3.0, 5.0, 2.0
    match = table.match(ModelContext(MODEL), hashes, list(names))
    req = RoutingRequest(MODEL, ModelContext(MODEL), len(hashes), match, prompt_tokens=len(prompt))
    cached = cached_tokens(cost, BLOCK, match, list(names))
    ttfts, prefills = cost.rank_costs(pods, cached, len(prompt))
    predictions = predict_all(cost, BLOCK, req, pods)
    for name, ttft, prefill in zip(names, ttfts, prefills, strict=True):
        assert ttft == pytest.approx(predictions[name].ttft_s), name
        assert prefill == pytest.approx(predictions[name].own_prefill_s()), name
    assert predictions["busy"].step_remaining_s > 0 and predictions["scraped"].busy == 1.0
    assert predictions["holder"].own_tokens == 10 * BLOCK
    # With `delay_weight`, a pod also costs what its prefill adds to the requests waiting
    # there for the next step: "busy" has one (queued after its step began), "scraped" the
    # engine's waiting beyond ours.
    assert predictions["busy"].queued_requests == 1.0
    assert predictions["scraped"].queued_requests == 2.0
    for weight in (0.0, 1.0, 3.0):
        picker = Ranker(cost, random.Random(0), delay_weight=weight)
        charged = {name: p.ttft_s + weight * delay_to_waiting(p) for name, p in predictions.items()}
        ranked = [state.name for state in picker.rank(req, pods, {})]
        assert ranked == sorted(names, key=charged.__getitem__), weight
    for ticket in (running, queued):
        cost.finish(ticket)


@pytest.mark.parametrize(
    ("log_size", "context_share"),
    [(4096, 0.0), (16, 0.0), (4096, 4e-5)],
    ids=["plain", "short-change-log", "context"],
)
def test_rank_costs_follow_every_change_of_the_pods(
    log_size: int, context_share: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rank_costs` keeps each candidate list's estimates between decisions and
    re-estimates only the pods whose work changed: after any sequence of requests sent,
    answered (streamed or not), finished, step boundaries, scrapes, learning and time
    passing, its costs are the predictions made from scratch (also when the log of changes
    fills up between decisions, and when the context's attention counts)."""
    monkeypatch.setattr("predictor.pods.MAX_CHANGES", log_size)
    clock = Clock()
    params = CostParams(context_share=context_share)
    cost = Predictor(params, clock=clock)
    rng = random.Random(3)
    names = [f"pod-{i}" for i in range(6)]
    pods = [pod(name) for name in names]
    live: list = []
    for step in range(600):
        action = rng.randrange(7)
        target = rng.choice(pods)
        if action == 0 or not live:
            streamed = rng.random() < 0.7
            prediction = cost.predict(target.name, rng.randrange(10, 4000), rng.randrange(0, 500))
            live.append(cost.start(prediction, streamed=streamed))
        elif action == 1:
            cost.first_byte(rng.choice(live))
        elif action == 2:
            cost.finish(live.pop(rng.randrange(len(live))))
        elif action == 3:
            cost.pulse(target.name)
        elif action == 4:
            target.scraped_at = clock.now
            target.running, target.waiting = float(rng.randrange(6)), float(rng.randrange(4))
            if rng.random() < 0.8:  # the scraper tells the model; a test may not
                cost.note_scrape(target.name, clock.now)
        clock.now += rng.choice((0.0, 0.001, 0.01, 0.2))
        candidates = rng.sample(pods, k=rng.randrange(1, len(pods) + 1)) if step % 5 else pods
        prompt = rng.randrange(1, 3000)
        cached = [float(rng.randrange(0, prompt + 1)) for _ in candidates]
        ttfts, prefills = cost.rank_costs(candidates, cached, prompt)
        fresh = Predictor.predict_many(cost, [
            (p.name, held, p.scraped_at, p.running, p.waiting)
            for p, held in zip(candidates, cached, strict=True)
        ], prompt)  # fmt: skip
        ranking, now = cost.candidates(candidates)
        delays = charged_delays(prefills, ranking.waits)
        arriving = ranking.arrivals(prefills, now, cost.params.activity_window_s)
        for ttft, prefill, delay, arrivals, candidate, prediction in zip(
            ttfts, prefills, delays, arriving, candidates, fresh, strict=True
        ):
            assert ttft == pytest.approx(prediction.ttft_s, rel=1e-12, abs=1e-15), step
            assert prefill == pytest.approx(prediction.own_prefill_s(), rel=1e-9), step
            assert delay == pytest.approx(delay_to_waiting(prediction), rel=1e-9), step
            rate = cost.bound_rate(candidate.name)  # from the pod's work, now
            assert arrivals == pytest.approx(rate * prefill**2, rel=1e-9, abs=1e-15), step
        # the one-pass ranking: the pods within 5 % of the best first, most cached first
        # (how many hold as much as the first: `equal`), then the rest by TTFT
        order = argsort(ttfts)
        ties = near_ties(order, ttfts, 0.05)
        equal = most_cached_first(order, ties, cached)
        near = {i for i, ttft in enumerate(ttfts) if ttft <= min(ttfts) * 1.05}
        assert sorted(order) == list(range(len(candidates))) and set(order[:ties]) == near
        head = [cached[i] for i in order[:ties]]
        assert head == sorted(head, reverse=True) and equal == head.count(head[0])
        rest = [ttfts[i] for i in order[ties:]]
        assert rest == sorted(rest), step


def test_a_prompt_costs_its_attention_over_the_context_before_it() -> None:
    """With `context_share`, a request with C tokens cached and N to compute does the
    work of N + share · ((C + N)² − C²) tokens, as an engine's prefill attends over the
    whole context: the same 300 new tokens cost more after 4,000 cached than alone, the
    pod holding more of the prompt still costs less, and the picker's one-pass order and
    costs are the predictions' own."""
    clock = Clock()
    share = 4e-5
    cost = Predictor(CostParams(context_share=share), clock=clock)
    alone = cost.predict("cold", 300, 0.0)
    after_context = cost.predict("holder", 4300, 4000.0)
    assert alone.own_tokens == pytest.approx(300 + share * 300**2)
    assert after_context.own_tokens == pytest.approx(300 + share * (4300**2 - 4000**2))
    assert after_context.ttft_s > alone.ttft_s
    without = Predictor(clock=clock).predict("holder", 4300, 4000.0)
    assert without.own_tokens == 300.0
    pods = [pod("cold"), pod("holder")]
    ttfts, prefills = cost.rank_costs(pods, [0.0, 4000.0], 4300)
    predictions = [cost.predict("cold", 4300, 0.0), after_context]
    for ttft, prefill, prediction in zip(ttfts, prefills, predictions, strict=True):
        assert ttft == pytest.approx(prediction.ttft_s)
        assert prefill == pytest.approx(prediction.own_prefill_s())
    assert ttfts[1] < ttfts[0]
    assert argsort(ttfts) == [1, 0]


def test_first_turns_go_where_their_prefix_is_among_pods_loaded_alike() -> None:
    """`load_tolerance`: among the placement's near-ties, pods whose load (the
    dominant share of the recent requests or prefill work) is within the tolerance of the
    least (or within one request like this one of it) count as equally loaded, and
    the one holding the conversation's system prompt goes first (no cold prefill for a
    balance not needed); a holder loaded beyond it is passed over."""
    clock = Clock()
    names = ("holder", "other")
    table, system, cost = _system_prompt_on_the_holder(clock)
    clock.now += 600.0  # the training traffic has decayed away
    pods = [pod(name) for name in names]
    opening = system + [10_000] * 3 * BLOCK
    hashes = table.prefix_hashes(opening)
    match = table.match(ModelContext(MODEL), hashes, list(names))
    first_turn = RoutingRequest(MODEL, ModelContext(MODEL), len(hashes), match,
                                prompt_tokens=len(opening), opens_conversation=True,
                                preamble_share=len(system) / len(opening))  # fmt: skip

    def load(name: str, requests: int) -> None:
        for _ in range(requests):
            cost.finish(cost.start(cost.predict(name, 2 * BLOCK, 0.0), streamed=True))

    def placed(tolerance: float) -> str:
        picker = Ranker(cost, random.Random(0), load_tolerance=tolerance)
        return picker.rank(first_turn, pods, {})[0].name

    load("holder", 1)  # one request smaller than this one lately: loaded like an idle pod
    assert placed(0.25) == "holder"
    clock.now += 600.0
    load("holder", 11)
    load("other", 10)  # the holder carries 10 % more
    assert cost.busy("holder") > cost.busy("other")
    assert placed(0.25) == "holder"  # loaded alike: where its system prompt is
    load("holder", 4)  # now 50 % more
    assert placed(0.25) == "other"


def _replay(run: list[list[Any]], params: CostParams | None = None) -> list[float]:
    """Each recorded request predicted at its send time from its recorded inputs, with the
    fleet's θ and the pod's speed as the model has them then, and learned from at its first
    byte: the relative errors (observed − predicted) / observed, in answer order."""
    clock = Clock()
    cost = Predictor(params, clock=clock)
    sends = [(row[0], 0, i) for i, row in enumerate(run)]
    answers = [(row[0] + row[1], 1, i) for i, row in enumerate(run)]
    sent: dict[int, tuple[Ticket, float]] = {}
    errors: list[float] = []
    for at, answered, i in sorted(sends + answers):
        clock.now = 1000.0 + at
        _, ttft, name, tokens, queued, decoding, busy, remaining, in_step = run[i]
        if not answered:
            prediction = Prediction(name, 0.0, tokens, 0.0, queued, decoding,
                                    cost.fleet.coefficients, busy, remaining, in_step,
                                    cost.speed(name))  # fmt: skip
            predicted = sum(prediction.terms().values())
            sent[i] = (cost.start(prediction._replace(ttft_s=predicted), streamed=True), predicted)
        else:
            ticket, predicted = sent.pop(i)
            cost.first_byte(ticket)
            cost.finish(ticket)
            errors.append((ttft - predicted) / ttft)
    return errors


@pytest.mark.parametrize("run", ["a", "b"])
def test_predictions_stay_unbiased_on_recorded_runs_that_drifted(run: str) -> None:
    """Two recorded chat runs on 8 simulated engines in which the predictions came out
    10-14 % high throughout (|error| p90 38-43 % where other runs of the same workload had
    17-23 %): the pods' speeds fell while θ rose to meet them. Replayed through the model's
    learning as it is now, they stay centred and within the routing issue's 25 % target."""
    path = Path(__file__).parent / "data" / "cost_model_chat_runs.json"
    recorded = json.loads(path.read_text())
    errors = _replay(recorded["runs"][run])
    assert len(errors) == 800
    magnitudes = sorted(abs(e) for e in errors)
    assert magnitudes[int(0.9 * len(magnitudes))] <= 0.25
    assert abs(statistics.median(errors)) <= 0.03


def test_predictions_recover_after_a_burst_of_first_turns() -> None:
    """A recorded closed-loop chat run whose users all sent their first turn within 2.1
    model seconds: clipping each coefficient at 0 kept the raises of the others, so an
    over-prediction raised the next one, and the model ran away (a median error of −160 %
    over these 800 answers). Replayed through the model as it is now, it stays centred."""
    path = Path(__file__).parent / "data" / "cost_model_burst_run.json"
    recorded = json.loads(path.read_text())
    errors = _replay(recorded["run"], CostParams().with_prior_scale(recorded["prior_scale"]))
    assert len(errors) == 800
    magnitudes = sorted(abs(e) for e in errors)
    assert abs(statistics.median(errors)) <= 0.05
    assert magnitudes[len(magnitudes) // 2] <= 0.25
    assert magnitudes[int(0.9 * len(magnitudes))] <= 0.75


def test_a_placement_weighs_a_pod_by_its_larger_share_of_requests_or_of_work() -> None:
    """Three pods alike: one served many short turns it had cached (little prefill work,
    many requests), one a single long prompt (one request, much work), one a few medium
    prompts. A new conversation goes to the third: by requests alone the long prompt's
    pod looks free, by work alone the warm one does."""
    clock = Clock()
    names = ("warm", "long", "medium")
    cost = _trained_fleet(clock, dict.fromkeys(names, 1.0))
    clock.now += 600.0  # the training traffic has decayed away
    pods = [pod(name) for name in names]

    def routed(name: str, tokens: int, held: float, times: int) -> None:
        for _ in range(times):
            prediction = cost.predict(name, tokens, held)
            cost.finish(cost.start(prediction, streamed=True, prompt_tokens=tokens,
                                   fleet_own_tokens=tokens - held))  # fmt: skip

    routed("warm", 2000, 1950.0, 12)
    routed("long", 30_000, 0.0, 1)
    routed("medium", 3000, 0.0, 3)
    assert cost.busy("warm") < cost.busy("medium") < cost.busy("long")
    assert cost.activity("long") < cost.activity("medium") < cost.activity("warm")
    first_turn = RoutingRequest(MODEL, ModelContext(MODEL), 0, None, prompt_tokens=1000,
                                opens_conversation=True)  # fmt: skip
    for seed in range(5):
        picker = Ranker(cost, random.Random(seed))
        assert picker.rank(first_turn, pods, {})[0].name == "medium"
