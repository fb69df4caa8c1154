"""Routing plugins by name: what a routing config may use, and how each is built.

Every plugin is built from its parameters (validated here: an unknown parameter or a
value of the wrong type stops start-up naming the plugin and the parameter) and the
gateway-wide collaborators in `PluginContext` (one load estimator, one cost model, one
pin lookup per gateway, shared by every profile).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gateway.errors import ConfigError
from gateway.routing.affinity import Affinity, PinAffinityPreference
from gateway.routing.charges import ArrivalCost, CostScorer, DelayCost, TtftCost
from gateway.routing.filters import Filter, HotSpotFilter, RoutableFilter
from gateway.routing.load import LoadEstimator
from gateway.routing.min_cost import MinCostPicker
from gateway.routing.objectives import SloFeasibleFilter
from gateway.routing.pickers import (
    MaxScorePicker,
    Picker,
    RandomPicker,
    RoundRobinPicker,
    SessionPicker,
)
from gateway.routing.placement import FirstTurnPlacement
from gateway.routing.predicted import PredictedTtftScorer
from gateway.routing.profile import Preference
from gateway.routing.scorers import KVUsageScorer, LoadScorer, PrefixScorer, Scorer
from indexer import Tier
from predictor import Predictor

MAX_WEIGHT = 1000.0
"""A scorer's weight is at most this: a profile's total (weight × a score in [0, 1], summed
over its scorers) stays a small finite number whatever the config says."""
WEIGHT_MEANING = "the scorer's weight in the profile's sum"
"""Every scorer's `weight` (read by the profile, not the scorer)."""
MAX_INTEGER = 2**31 - 1
"""Every integer parameter's bound (as the settings')."""
DEFAULT_DELAY_WEIGHT = 2.0
DEFAULT_ARRIVAL_WEIGHT = 2.0
DEFAULT_LOAD_TOLERANCE = 0.25


@dataclass(frozen=True, slots=True)
class PluginContext:
    rng: random.Random
    load: LoadEstimator
    cost: Predictor
    affinity: Affinity | None
    """The pin manager's lease lookup (the `pin-affinity` preference); None: no pins."""
    block_size: int
    hot_spot_margin: int = 16
    """Default of the hot-spot guard's `margin` (KVGATE_HOT_SPOT_MARGIN)."""
    tier_weights: Mapping[Tier, float] | None = None
    """Default of the prefix scorer's tier weights (KVGATE_TIER_WEIGHTS)."""
    slo_shed: bool = False
    """Default of the SLO filter's `shed` (KVGATE_SLO_SHED)."""
    costs: tuple[CostScorer, ...] = ()
    """The profile's cost scorers (what the `min-cost` picker sums)."""
    placement: FirstTurnPlacement | None = None
    """The profile's placement of first turns (the `min-cost` picker's near-ties)."""


@dataclass(frozen=True, slots=True)
class Parameter:
    """One parameter a plugin declares: what `kvgate routing plugins` lists."""

    name: str
    kind: str
    """number, integer, flag or choice"""
    default: str
    allowed: str
    meaning: str
    setting: str = ""
    """The KVGATE_* setting its default comes from, if any."""


class Params:
    """A plugin's parameters, read once each; `done()` refuses any left unread. Each read
    declares the parameter (`declared`): its type, default, range and meaning.
    `default_from` names the setting a default comes from."""

    def __init__(self, where: str, given: Mapping[str, Any]) -> None:
        self.where = where
        self._given = dict(given)
        self.declared: list[Parameter] = []

    def number(
        self,
        name: str,
        default: float,
        *,
        low: float = 0.0,
        high: float,
        meaning: str,
        default_from: str = "",
    ) -> float:
        """A finite number in [low, high] (nan, inf and 1e308 beyond `high` refused)."""
        shown = f"{default:g}" + (f" ({default_from})" if default_from else "")
        allowed = f"[{low:g}, {high:g}]"
        self.declared.append(Parameter(name, "number", shown, allowed, meaning, default_from))
        value = self._given.pop(name, default)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or not low <= value <= high:  # nan too; exact for ints of any size
            raise ConfigError(f"{self.where}.{name}", value, f"a number in {allowed}")
        return float(value)

    def integer(
        self,
        name: str,
        default: int,
        *,
        low: int = 0,
        high: int = MAX_INTEGER,
        meaning: str,
        default_from: str = "",
    ) -> int:
        shown = f"{default} ({default_from})" if default_from else str(default)
        allowed = f"{low}..{high}"
        self.declared.append(Parameter(name, "integer", shown, allowed, meaning, default_from))
        value = self._given.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{self.where}.{name}", value, f"an integer in {allowed}")
        return value

    def flag(self, name: str, default: bool, *, meaning: str, default_from: str = "") -> bool:
        shown = str(default).lower() + (f" ({default_from})" if default_from else "")
        self.declared.append(Parameter(name, "flag", shown, "true, false", meaning, default_from))
        value = self._given.pop(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self.where}.{name}", value, "true or false")
        return value

    def choice(self, name: str, default: str, choices: tuple[str, ...], *, meaning: str) -> str:
        self.declared.append(Parameter(name, "choice", default, ", ".join(choices), meaning))
        value = self._given.pop(name, default)
        if value not in choices:
            raise ConfigError(f"{self.where}.{name}", value, "one of " + ", ".join(choices))
        return str(value)

    def done(self) -> None:
        if self._given:
            unknown = ", ".join(sorted(self._given))
            raise ConfigError(self.where, unknown, "no parameter named " + unknown)


FilterFactory = Callable[[Params, PluginContext], Filter]
ScorerFactory = Callable[[Params, PluginContext], Scorer]
PickerFactory = Callable[[Params, PluginContext], Picker]
PreferenceFactory = Callable[[Params, PluginContext], Preference]
CostFactory = Callable[[Params, PluginContext], CostScorer]
PlacementFactory = Callable[[Params, PluginContext], FirstTurnPlacement]


def _routable(params: Params, ctx: PluginContext) -> Filter:
    """Ready per discovery and healthy per the metrics scraper."""
    return RoutableFilter()


def _hot_spot(params: Params, ctx: PluginContext) -> Filter:
    """Keeps only the pods within `margin` requests of the least loaded."""
    margin = params.integer(
        "margin", ctx.hot_spot_margin, low=1, default_from="KVGATE_HOT_SPOT_MARGIN",
        meaning="requests in flight a pod may carry beyond the least loaded one",
    )  # fmt: skip
    return HotSpotFilter(margin, ctx.load)


def _prefix(params: Params, ctx: PluginContext) -> Scorer:
    """The share of the prompt's blocks a pod holds from the start, weighted by tier."""
    defaults = dict(ctx.tier_weights or {})
    weights = {
        tier: params.number(
            f"{tier.name.lower()}_weight",
            defaults.get(tier, 0.0),
            high=1.0,
            default_from="KVGATE_TIER_WEIGHTS",
            meaning=f"what a block held in the {tier.name} tier counts for",
        )
        for tier in Tier
    }
    return PrefixScorer(weights)


def _load(params: Params, ctx: PluginContext) -> Scorer:
    """Fewer requests in flight or queued scores higher: `1 / (1 + load / scale)`."""
    scale = params.number(
        "scale", 2.0, low=1e-9, high=1e9, meaning="the load at which the score is halved"
    )
    return LoadScorer(scale, ctx.load)


def _kv_usage(params: Params, ctx: PluginContext) -> Scorer:
    """`1 − KV cache usage` (scraped): an emptier cache evicts less."""
    return KVUsageScorer()


def _predicted_ttft(params: Params, ctx: PluginContext) -> Scorer:
    """`best predicted TTFT / this pod's`, from the cost model."""
    return PredictedTtftScorer(ctx.cost, ctx.block_size)


def _max_score(params: Params, ctx: PluginContext) -> Picker:
    """The highest weighted score; ties at random."""
    return MaxScorePicker(ctx.rng)


def _random(params: Params, ctx: PluginContext) -> Picker:
    """A pod at random."""
    return RandomPicker(ctx.rng)


def _round_robin(params: Params, ctx: PluginContext) -> Picker:
    """Each model's pods in turn."""
    return RoundRobinPicker()


def _session(params: Params, ctx: PluginContext) -> Picker:
    """Sticky by session (`KVGATE_SESSION_HEADER`); a new or moved session goes where
    `fallback` says."""
    fallback = params.choice(
        "fallback", "max-score", ("max-score", "min-cost"),
        meaning="the picker of a new session, or of one whose pod is gone",
    )  # fmt: skip
    inner: Picker = MaxScorePicker(ctx.rng)
    if fallback == "min-cost":
        placement = FirstTurnPlacement(ctx.cost, ctx.rng, load_tolerance=DEFAULT_LOAD_TOLERANCE)
        inner = MinCostPicker(ctx.cost, ctx.block_size, ctx.rng, default_costs(ctx), placement)
    sessions = params.integer(
        "max_sessions", 100_000, low=1, high=10_000_000,
        meaning="sessions remembered (the least recently used forgotten beyond)",
    )  # fmt: skip
    return SessionPicker(inner, max_sessions=sessions)


def _slo_feasible(params: Params, ctx: PluginContext) -> Filter:
    """With a TTFT objective (`x-slo-ttft-ms`), the pods predicted to meet it, best cache
    affinity first (the others after them as retry targets); none: every pod, or a 429."""
    shed = params.flag(
        "shed", ctx.slo_shed, default_from="KVGATE_SLO_SHED",
        meaning="a request no pod is predicted to serve within its objectives (TTFT, or a "
        "stream's TPOT) gets a 429 with Retry-After",
    )  # fmt: skip
    return SloFeasibleFilter(ctx.cost, ctx.block_size, shed=shed)


def _min_cost(params: Params, ctx: PluginContext) -> Picker:
    """The lowest weighted sum of the profile's `costs`; near-ties (5 %) by cache affinity,
    a first turn placed by `placement`; 2 % of decisions probe an idle pod unanswered for
    10 s."""
    if not ctx.costs:
        raise ConfigError(params.where, "min-cost", "a profile with `costs`")
    return MinCostPicker(ctx.cost, ctx.block_size, ctx.rng, ctx.costs, ctx.placement)


def _ttft_cost(params: Params, ctx: PluginContext) -> CostScorer:
    """The predicted time to first byte (the unit the other costs are weighed in)."""
    return TtftCost()


def _delay_cost(params: Params, ctx: PluginContext) -> CostScorer:
    """What the request's prefill adds to the requests waiting for the pod's next step (a
    prompt beyond the engines' 8,192-token chunk: one chunk of it)."""
    weight = params.number(
        "weight", DEFAULT_DELAY_WEIGHT, high=100.0, meaning="× the delay it adds to those waiting"
    )
    return DelayCost(weight)


def _arrival_cost(params: Params, ctx: PluginContext) -> CostScorer:
    """What the request's prefill costs the requests its cache binds to the pod that arrive
    while it runs (λ·P²/2)."""
    weight = params.number(
        "weight", DEFAULT_ARRIVAL_WEIGHT, high=100.0,
        meaning="× the delay it adds to the requests arriving while it runs",
    )  # fmt: skip
    return ArrivalCost(weight, ctx.cost.params.activity_window_s)


def _first_turn(params: Params, ctx: PluginContext) -> FirstTurnPlacement:
    """A conversation's first turn is placed by load among the pods whose cost, as if each
    held its shared prefix, is within 25 % of the best (docs/routing.md#placement)."""
    tolerance = params.number(
        "load_tolerance", DEFAULT_LOAD_TOLERANCE, high=10.0,
        meaning="loads within this share (plus one request) of the least count as equal, "
        "holders of the shared prefix first",
    )  # fmt: skip
    return FirstTurnPlacement(ctx.cost, ctx.rng, load_tolerance=tolerance)


def default_costs(ctx: PluginContext) -> tuple[CostScorer, ...]:
    """The default profile's costs, at their defaults (the `session` picker's fallback)."""
    window = ctx.cost.params.activity_window_s
    return (
        TtftCost(),
        DelayCost(DEFAULT_DELAY_WEIGHT),
        ArrivalCost(DEFAULT_ARRIVAL_WEIGHT, window),
    )


def _pin_affinity(params: Params, ctx: PluginContext) -> Preference:
    """A pinned conversation's pod goes first (the others stay as retry targets)."""
    return PinAffinityPreference(ctx.affinity)


FILTERS: dict[str, FilterFactory] = {
    "routable": _routable,
    "hot-spot-guard": _hot_spot,
    "slo-feasible": _slo_feasible,
}
SCORERS: dict[str, ScorerFactory] = {
    "prefix": _prefix,
    "load": _load,
    "kv-usage": _kv_usage,
    "predicted-ttft": _predicted_ttft,
}
PICKERS: dict[str, PickerFactory] = {
    "max-score": _max_score,
    "random": _random,
    "round-robin": _round_robin,
    "session": _session,
    "min-cost": _min_cost,
}
COSTS: dict[str, CostFactory] = {
    "ttft-cost": _ttft_cost,
    "delay-cost": _delay_cost,
    "arrival-cost": _arrival_cost,
}
PLACEMENTS: dict[str, PlacementFactory] = {"first-turn": _first_turn}
PREFERENCES: dict[str, PreferenceFactory] = {"pin-affinity": _pin_affinity}
