"""Routing: filters, scorers, pickers and the named profiles, over a real prefix index."""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import pytest

from gateway.control.discovery import Pod
from gateway.control.registry import PodState
from gateway.routing import (
    HotSpotFilter,
    KVUsageScorer,
    LoadScorer,
    MaxScorePicker,
    PrefixScorer,
    RandomPicker,
    RoundRobinPicker,
    RoutableFilter,
    RoutingProfile,
    RoutingRequest,
    SessionPicker,
    Weighted,
)
from gateway.routing.router import build_policies, preamble_share
from gateway.settings import DEFAULT_TIER_WEIGHTS, POLICIES, Settings
from indexer import IndexConfig, MatchResult, ModelContext, SyncPrefixHashTable, Tier

MODEL = "m"
CONTEXT = ModelContext(MODEL)
BLOCK = 4
PROMPT = list(range(100, 100 + 2 * BLOCK))  # two full blocks


@dataclass(frozen=True, slots=True)
class Stored:
    """A BlockStored event with vLLM's field names (what the subscriber's decoder yields)."""

    block_hashes: Sequence[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: Sequence[int]
    block_size: int = BLOCK
    lora_id: int | None = None
    lora_name: str | None = None
    medium: str | None = "GPU"


def pod(name: str, *, model: str = MODEL, ready: bool = True, **observed: float) -> PodState:
    state = PodState(Pod(name=name, url=f"http://{name}:8000", model=model, ready=ready))
    for key, value in observed.items():
        setattr(state, key, value)
    return state


def new_table(*pods: str) -> SyncPrefixHashTable:
    table = SyncPrefixHashTable(IndexConfig(block_size=BLOCK), clock=lambda: 1000.0)
    for name in pods:
        table.register_pod(name, MODEL, publishes_events=True)
    return table


def store(
    table: SyncPrefixHashTable, pod: str, medium: str | None, blocks: int = 2, base: int = 1
) -> None:
    """`pod` stores the first `blocks` blocks of PROMPT in `medium` (engine hashes base+i)."""
    parent: int | None = None
    for i in range(blocks):
        tokens = PROMPT[i * BLOCK : (i + 1) * BLOCK]
        applied = table.apply_stored(pod, Stored([base + i], parent, tokens, medium=medium))
        assert applied == 1
        parent = base + i


def request_for(
    table: SyncPrefixHashTable,
    pods: Sequence[PodState],
    *,
    prompt: Sequence[int] = PROMPT,
    session: str | None = None,
    model: str = MODEL,
) -> RoutingRequest:
    hashes = table.prefix_hashes(prompt)
    match = table.match(CONTEXT, hashes, [state.name for state in pods])
    return RoutingRequest(model, CONTEXT, len(hashes), match, session)


def bare_request(model: str = MODEL, session: str | None = None) -> RoutingRequest:
    return RoutingRequest(model, ModelContext(model), 0, None, session)


# -- scorers --------------------------------------------------------------------------------


def test_prefix_scorer_weights_each_tier() -> None:
    table = new_table("gpu", "cpu", "storage", "expected", "half", "none")
    store(table, "gpu", "GPU")
    store(table, "cpu", "CPU")
    store(table, "storage", "DISK")
    table.add_prefix("expected", CONTEXT, table.prefix_hashes(PROMPT))
    store(table, "half", None, blocks=1)  # no medium: GPU (vLLM's default)
    pods = [pod(name) for name in ("gpu", "cpu", "storage", "expected", "half", "none")]
    request = request_for(table, pods)
    assert request.prompt_blocks == 2
    assert isinstance(request.match, MatchResult)
    scores = PrefixScorer(DEFAULT_TIER_WEIGHTS).score(request, pods)
    assert scores == pytest.approx(
        {"gpu": 1.0, "cpu": 0.8, "storage": 0.25, "expected": 0.9, "half": 0.5, "none": 0.0}
    )


def test_prefix_scorer_mixes_tiers_within_a_pod() -> None:
    table = new_table("p")
    table.apply_stored("p", Stored([1], None, PROMPT[:BLOCK], medium="GPU"))
    table.apply_stored("p", Stored([2], 1, PROMPT[BLOCK:], medium="CPU"))
    pods = [pod("p")]
    request = request_for(table, pods)
    assert request.match is not None
    assert request.match.tiers("p") == [Tier.GPU, Tier.CPU]
    assert PrefixScorer(DEFAULT_TIER_WEIGHTS).score(request, pods)["p"] == pytest.approx(0.9)


def test_prefix_scorer_uses_the_configured_weights() -> None:
    settings = Settings.load({"KVGATE_TIER_WEIGHTS": "CPU=0.5,EXPECTED=0"})
    table = new_table("cpu", "expected")
    store(table, "cpu", "CPU")
    table.add_prefix("expected", CONTEXT, table.prefix_hashes(PROMPT))
    pods = [pod("cpu"), pod("expected")]
    scores = PrefixScorer(settings.tier_weights).score(request_for(table, pods), pods)
    assert scores == pytest.approx({"cpu": 0.5, "expected": 0.0})


def test_prefix_scorer_counts_only_the_leading_blocks() -> None:
    table = new_table("p")
    store(table, "p", "GPU")
    pods = [pod("p")]
    # The same two blocks, then two more the pod does not hold: half of the prompt.
    longer = [*PROMPT, *range(500, 500 + 2 * BLOCK)]
    assert PrefixScorer(DEFAULT_TIER_WEIGHTS).score(
        request_for(table, pods, prompt=longer), pods
    ) == pytest.approx({"p": 0.5})
    # Another first block: nothing matches, even though the second block's tokens agree.
    other = [*range(900, 900 + BLOCK), *PROMPT[BLOCK:]]
    assert PrefixScorer(DEFAULT_TIER_WEIGHTS).score(
        request_for(table, pods, prompt=other), pods
    ) == {"p": 0.0}


def test_prefix_scorer_without_a_match_scores_zero() -> None:
    pods = [pod("a"), pod("b")]
    scorer = PrefixScorer(DEFAULT_TIER_WEIGHTS)
    assert scorer.score(bare_request(), pods) == {"a": 0.0, "b": 0.0}
    table = new_table("a", "b")
    store(table, "a", "GPU")
    short = request_for(table, pods, prompt=PROMPT[: BLOCK - 1])  # no full block
    assert short.prompt_blocks == 0
    assert scorer.score(short, pods) == {"a": 0.0, "b": 0.0}


def test_load_scorer_is_monotonic() -> None:
    loads = [0, 1, 2, 3, 5, 8, 16, 64, 1000]
    pods = [pod(f"p{load}", inflight=load) for load in loads]
    scores = LoadScorer().score(bare_request(), pods)
    values = [scores[f"p{load}"] for load in loads]
    assert values[0] == 1.0
    assert all(0.0 < value <= 1.0 for value in values)
    assert values == sorted(values, reverse=True)
    assert len(set(values)) == len(values)  # strictly decreasing
    # Queued requests count like running ones.
    same = LoadScorer().score(bare_request(), [pod("r", running=4.0), pod("w", waiting=4.0)])
    assert same["r"] == same["w"] < 1.0


def test_kv_usage_scorer_prefers_an_emptier_cache() -> None:
    pods = [pod("empty"), pod("half", kv_usage=0.5), pod("full", kv_usage=1.0)]
    pods.append(pod("over", kv_usage=1.5))
    scores = KVUsageScorer().score(bare_request(), pods)
    assert scores == pytest.approx({"empty": 1.0, "half": 0.5, "full": 0.0, "over": 0.0})


# -- filters --------------------------------------------------------------------------------


def test_routable_filter_drops_unready_and_unhealthy_pods() -> None:
    pods = [pod("ok"), pod("draining", ready=False), pod("sick", healthy=False)]
    pods.append(pod("both", ready=False, healthy=False))
    assert [p.name for p in RoutableFilter().filter(bare_request(), pods)] == ["ok"]


def test_the_routable_filter_takes_the_registrys_answer_only_for_the_router_candidates() -> None:
    pods = [pod("ok"), pod("sick", healthy=False), pod("busy", inflight=30)]
    cached = (pods[0], pods[2])  # what the registry computed for these candidates
    request = RoutingRequest(MODEL, CONTEXT, 0, None, candidates=pods, routable=cached,
                             routable_names=("ok", "busy"))  # fmt: skip
    assert RoutableFilter().filter(request, pods) is cached
    # after another filter (a profile may list them in any order): its choice, then scanned
    profile = RoutingProfile(
        "hot-first", filters=[HotSpotFilter(margin=4), RoutableFilter()], scorers=[],
        picker=RoundRobinPicker(),
    )  # fmt: skip
    assert [p.name for p in profile.decide(request, pods).ranking] == ["ok"]


def test_hot_spot_filter_keeps_pods_within_the_margin_of_the_least_loaded() -> None:
    pods = [pod("a", inflight=2), pod("b", inflight=5), pod("c", inflight=6)]
    pods += [pod("d", running=9.0), pod("e", inflight=2, waiting=20.0)]
    kept = HotSpotFilter(margin=4).filter(bare_request(), pods)
    # least = 2: loads 2 and 5 are within 4; 6 (exactly the margin more) and beyond are not.
    assert [p.name for p in kept] == ["a", "b"]
    assert HotSpotFilter(margin=100).filter(bare_request(), pods) == pods


def test_hot_spot_filter_leaves_a_lone_pod_alone() -> None:
    lone = [pod("a", inflight=1000)]
    assert HotSpotFilter(margin=1).filter(bare_request(), lone) == lone
    assert HotSpotFilter(margin=1).filter(bare_request(), []) == []


# -- pickers --------------------------------------------------------------------------------


def test_max_score_picker_orders_by_score() -> None:
    pods = [pod("low"), pod("high"), pod("mid")]
    ranking = MaxScorePicker(random.Random(0)).rank(
        bare_request(), pods, {"low": 0.1, "high": 0.9, "mid": 0.5}
    )
    assert [p.name for p in ranking] == ["high", "mid", "low"]


def test_max_score_picker_breaks_ties_at_random() -> None:
    pods = [pod("a"), pod("b"), pod("c")]
    scores = {"a": 0.7, "b": 0.7, "c": 0.2}
    picker = MaxScorePicker(random.Random(1234))
    firsts = Counter(picker.rank(bare_request(), pods, scores)[0].name for _ in range(200))
    assert set(firsts) == {"a", "b"}
    assert min(firsts.values()) > 40  # both tied pods get a fair share, not just one
    # Seeded: the same seed draws the same sequence.
    again = MaxScorePicker(random.Random(1234))
    other = MaxScorePicker(random.Random(1234))
    first = [again.rank(bare_request(), pods, scores)[0].name for _ in range(20)]
    second = [other.rank(bare_request(), pods, scores)[0].name for _ in range(20)]
    assert first == second


def test_random_picker_reaches_every_pod() -> None:
    pods = [pod(name) for name in "abcd"]
    picker = RandomPicker(random.Random(7))
    rankings = [picker.rank(bare_request(), pods, {}) for _ in range(100)]
    assert all(sorted(p.name for p in ranking) == list("abcd") for ranking in rankings)
    assert {ranking[0].name for ranking in rankings} == set("abcd")


def test_round_robin_takes_turns_per_model() -> None:
    picker = RoundRobinPicker()
    m1 = [pod("b"), pod("c"), pod("a")]
    m2 = [pod("x", model="m2"), pod("y", model="m2")]

    def first(pods: list[PodState], model: str) -> str:
        return picker.rank(bare_request(model), pods, {})[0].name

    assert [first(m1, "m1") for _ in range(4)] == ["a", "b", "c", "a"]
    # Another model has its own turn: it starts at its first pod.
    assert [first(m2, "m2") for _ in range(3)] == ["x", "y", "x"]
    assert first(m1, "m1") == "b"
    # The full ranking is the rotation (the proxy retries down it).
    assert [p.name for p in picker.rank(bare_request("m1"), m1, {})] == ["c", "a", "b"]
    assert picker.rank(bare_request("m3"), [], {}) == []


def test_round_robin_follows_a_new_candidate_tuple() -> None:
    """The order by name is kept for the registry's cached tuple and taken anew when a new
    tuple (a pod came or went) or a list arrives."""
    picker = RoundRobinPicker()
    three = (pod("c"), pod("a"), pod("b"))
    assert [p.name for p in picker.rank(bare_request(), three, {})] == ["a", "b", "c"]
    assert [p.name for p in picker.rank(bare_request(), three, {})] == ["b", "c", "a"]
    four = (pod("d"), *three)
    assert [p.name for p in picker.rank(bare_request(), four, {})] == ["c", "d", "a", "b"]
    assert [p.name for p in picker.rank(bare_request(), [pod("z"), pod("y")], {})] == ["z", "y"]
    assert [p.name for p in picker.rank(bare_request(), three, {})] == ["b", "c", "a"]


def test_session_sticks_to_its_first_pod() -> None:
    picker = SessionPicker(MaxScorePicker(random.Random(0)))
    pods = [pod("a"), pod("b"), pod("c")]
    first = picker.rank(bare_request(session="alice"), pods, {"a": 0.1, "b": 0.9, "c": 0.5})
    assert first[0].name == "b"
    # Scores change: the session stays on b; another session follows the scores.
    later = picker.rank(bare_request(session="alice"), pods, {"a": 0.9, "b": 0.0, "c": 0.5})
    assert [p.name for p in later] == ["b", "a", "c"]
    fresh = picker.rank(bare_request(session="bob"), pods, {"a": 0.9, "b": 0.0, "c": 0.5})
    assert fresh[0].name == "a"
    # No session: the fallback's ranking as is.
    plain = picker.rank(bare_request(), pods, {"a": 0.9, "b": 0.0, "c": 0.5})
    assert plain[0].name == "a"


def test_session_falls_back_when_its_pod_is_gone_and_stays_on_the_new_one() -> None:
    picker = SessionPicker(MaxScorePicker(random.Random(0)))
    a, b, c = pod("a"), pod("b"), pod("c")
    assert picker.rank(bare_request(session="s"), [a, b, c], {"a": 1.0})[0].name == "a"
    moved = picker.rank(bare_request(session="s"), [b, c], {"c": 1.0})
    assert moved[0].name == "c"
    # a is back, and scores favour it: the session stays where it moved.
    back = picker.rank(bare_request(session="s"), [a, b, c], {"a": 1.0})
    assert back[0].name == "c"
    assert picker.rank(bare_request(session="s"), [], {}) == []


def test_session_map_is_bounded() -> None:
    picker = SessionPicker(MaxScorePicker(random.Random(0)), max_sessions=1)
    pods = [pod("a"), pod("b")]
    assert picker.rank(bare_request(session="old"), pods, {"a": 1.0})[0].name == "a"
    assert picker.rank(bare_request(session="new"), pods, {"b": 1.0})[0].name == "b"
    # "old" was forgotten (least recently used): it follows the scores now.
    assert picker.rank(bare_request(session="old"), pods, {"b": 1.0})[0].name == "b"


# -- profiles -------------------------------------------------------------------------------


class Constant:
    """A Scorer that gives each pod a fixed, possibly out-of-range, score."""

    uses_prefix = False

    def __init__(self, name: str, scores: dict[str, float]) -> None:
        self.name = name
        self._scores = scores

    def score(self, request: RoutingRequest, pods: Sequence[PodState]) -> dict[str, float]:
        return {p.name: self._scores[p.name] for p in pods}


def test_profile_sums_weighted_clamped_scores() -> None:
    profile = RoutingProfile(
        "custom",
        filters=[RoutableFilter()],
        scorers=[
            Weighted(Constant("x", {"a": 1.5, "b": 0.5, "c": 0.0}), 2.0),
            Weighted(Constant("y", {"a": -1.0, "b": 0.25, "c": 1.0}), 1.0),
        ],
        picker=MaxScorePicker(random.Random(0)),
    )
    pods = [pod("a"), pod("b"), pod("c"), pod("down", healthy=False)]
    decision = profile.decide(bare_request(), pods)
    assert decision.policy == "custom"
    assert decision.scores == pytest.approx({"a": 2.0, "b": 1.25, "c": 1.0})
    assert decision.components == {
        "a": {"x": 1.0, "y": 0.0},
        "b": {"x": 0.5, "y": 0.25},
        "c": {"x": 0.0, "y": 1.0},
    }
    assert [p.name for p in decision.ranking] == ["a", "b", "c"]
    assert not profile.uses_prefix


def test_profile_with_nothing_routable_decides_nothing() -> None:
    policies = build_policies(Settings(), random.Random(0))
    pods = [pod("a", healthy=False), pod("b", ready=False)]
    for name, profile in policies.items():
        decision = profile.decide(bare_request(session="s"), pods)
        assert decision.ranking == [], name
        assert decision.policy == name


def test_build_policies_builds_every_policy() -> None:
    policies = build_policies(Settings(), random.Random(0))
    assert set(policies) == set(POLICIES)
    assert all(profile.name == name for name, profile in policies.items())
    assert policies["prefix-cache"].uses_prefix
    assert policies["prefix-share"].uses_prefix
    assert policies["predicted-latency"].uses_prefix
    assert policies["session"].uses_prefix
    assert not policies["least-request"].uses_prefix
    assert not policies["round-robin"].uses_prefix
    assert not policies["random"].uses_prefix


@pytest.fixture
def fleet() -> tuple[SyncPrefixHashTable, list[PodState]]:
    """Three pods; only `holder` holds PROMPT (on GPU)."""
    table = new_table("holder", "idle1", "idle2")
    store(table, "holder", "GPU")
    return table, [pod("holder"), pod("idle1"), pod("idle2")]


def test_prefix_share_prefers_the_pod_holding_the_prefix(
    fleet: tuple[SyncPrefixHashTable, list[PodState]],
) -> None:
    table, pods = fleet
    profile = build_policies(Settings(hot_spot_margin=4), random.Random(0))["prefix-share"]
    request = request_for(table, pods)
    for _ in range(20):
        decision = profile.decide(request, pods)
        assert decision.ranking[0].name == "holder"
    assert decision.components["holder"]["prefix"] == 1.0
    assert decision.components["idle1"]["prefix"] == 0.0
    # Busier, but still within the margin: the cache hit wins.
    pods[0].inflight = 3
    assert profile.decide(request, pods).ranking[0].name == "holder"


def test_prefix_share_avoids_a_hot_spot(
    fleet: tuple[SyncPrefixHashTable, list[PodState]],
) -> None:
    table, pods = fleet
    profile = build_policies(Settings(hot_spot_margin=4), random.Random(0))["prefix-share"]
    pods[0].inflight = 4  # the margin more than the idle pods
    decision = profile.decide(request_for(table, pods), pods)
    assert {p.name for p in decision.ranking} == {"idle1", "idle2"}


def test_prefix_share_skips_an_unhealthy_holder(
    fleet: tuple[SyncPrefixHashTable, list[PodState]],
) -> None:
    table, pods = fleet
    profile = build_policies(Settings(), random.Random(0))["prefix-share"]
    pods[0].healthy = False
    decision = profile.decide(request_for(table, pods), pods)
    assert {p.name for p in decision.ranking} == {"idle1", "idle2"}


def test_prefix_share_without_a_match_goes_to_the_least_loaded() -> None:
    profile = build_policies(Settings(), random.Random(0))["prefix-share"]
    pods = [pod("a", inflight=3), pod("b", inflight=1), pod("c", inflight=2)]
    assert [p.name for p in profile.decide(bare_request(), pods).ranking] == ["b", "c", "a"]


def test_prefix_share_prefers_the_emptier_cache_at_equal_load() -> None:
    profile = build_policies(Settings(), random.Random(0))["prefix-share"]
    pods = [pod("full", kv_usage=0.9), pod("empty", kv_usage=0.1)]
    for _ in range(10):
        assert profile.decide(bare_request(), pods).ranking[0].name == "empty"


def test_least_request_ignores_the_cache(
    fleet: tuple[SyncPrefixHashTable, list[PodState]],
) -> None:
    table, pods = fleet
    profile = build_policies(Settings(), random.Random(0))["least-request"]
    pods[0].inflight = 1
    pods[1].inflight = 2
    decision = profile.decide(request_for(table, pods), pods)
    assert [p.name for p in decision.ranking] == ["idle2", "holder", "idle1"]


def test_round_robin_profile_cycles_over_routable_pods() -> None:
    profile = build_policies(Settings(), random.Random(0))["round-robin"]
    pods = [pod("a"), pod("b", healthy=False), pod("c")]
    picks = [profile.decide(bare_request(), pods).ranking[0].name for _ in range(4)]
    assert picks == ["a", "c", "a", "c"]


def test_random_profile_reaches_every_routable_pod() -> None:
    profile = build_policies(Settings(), random.Random(3))["random"]
    pods = [pod("a"), pod("b"), pod("c", ready=False)]
    picks = {profile.decide(bare_request(), pods).ranking[0].name for _ in range(50)}
    assert picks == {"a", "b"}


def test_session_profile_sticks_then_falls_back(
    fleet: tuple[SyncPrefixHashTable, list[PodState]],
) -> None:
    table, pods = fleet
    profile = build_policies(Settings(), random.Random(0))["session"]
    pods[1].inflight = 5  # idle1 is busy; idle2 is the best pod without the prefix
    first = profile.decide(bare_request(session="s"), pods)
    # Without a prompt match, load decides: holder and idle2 tie, either may be chosen.
    bound = first.ranking[0].name
    assert bound in {"holder", "idle2"}
    for _ in range(10):
        assert profile.decide(request_for(table, pods, session="s"), pods).ranking[0].name == (
            bound
        )
    # Its pod becomes unhealthy: the session moves to the best remaining pod.
    next(p for p in pods if p.name == bound).healthy = False
    moved = profile.decide(request_for(table, pods, session="s"), pods).ranking[0].name
    assert moved != bound
    assert moved in {"holder", "idle2"}


def test_a_pod_with_a_nan_load_does_not_empty_the_hot_spot_guard() -> None:
    pods = [pod("broken", waiting=float("nan")), pod("fine")]
    kept = HotSpotFilter(margin=4).filter(bare_request(), pods)
    assert "fine" in [p.name for p in kept]


def test_a_first_turns_preamble_is_its_leading_system_messages() -> None:
    """What a new conversation may share with others: the text of its leading system (or
    developer) messages, as a share of all its text; text parts count as their text."""
    system = {"role": "system", "content": "s" * 30}
    developer = {"role": "developer", "content": [{"type": "text", "text": "d" * 10}]}
    user = {"role": "user", "content": "u" * 60}
    assert preamble_share({"messages": [system, developer, user]}) == pytest.approx(0.4)
    assert preamble_share({"messages": [user, system]}) == 0.0  # not leading
    assert preamble_share({"messages": [user]}) == 0.0
    assert preamble_share({"messages": "not a list"}) == 0.0
    assert preamble_share({"messages": [{"role": "system", "content": ""}]}) == 0.0
