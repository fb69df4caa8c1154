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
from gateway.routing.filters import Filter, HotSpotFilter, RoutableFilter
from gateway.routing.load import LoadEstimator
from gateway.routing.pickers import (
    MaxScorePicker,
    Picker,
    RandomPicker,
    RoundRobinPicker,
    SessionPicker,
)
from gateway.routing.predicted import (
    DEFAULT_CHUNK_TOKENS,
    MinPredictedTtftPicker,
    PredictedTtftScorer,
)
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
    """Default of the SLO picker's `shed` (KVGATE_SLO_SHED)."""


@dataclass(frozen=True, slots=True)
class Parameter:
    """One parameter a plugin declares: what `kvgate routing plugins` lists."""

    name: str
    kind: str
    """number, integer, flag or choice"""
    default: str
    allowed: str
    meaning: str


class Params:
    """A plugin's parameters, read once each; `done()` refuses any left unread. Each read
    declares the parameter (`declared`): its type, default, range and meaning.
    `default_from` names the setting a default comes from."""

    def __init__(self, where: str, given: Mapping[str, Any]) -> None:
        self._where = where
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
        self.declared.append(Parameter(name, "number", shown, allowed, meaning))
        value = self._given.pop(name, default)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or not low <= value <= high:  # nan too; exact for ints of any size
            raise ConfigError(f"{self._where}.{name}", value, f"a number in {allowed}")
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
        self.declared.append(Parameter(name, "integer", shown, allowed, meaning))
        value = self._given.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{self._where}.{name}", value, f"an integer in {allowed}")
        return value

    def flag(self, name: str, default: bool, *, meaning: str, default_from: str = "") -> bool:
        shown = str(default).lower() + (f" ({default_from})" if default_from else "")
        self.declared.append(Parameter(name, "flag", shown, "true, false", meaning))
        value = self._given.pop(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self._where}.{name}", value, "true or false")
        return value

    def choice(self, name: str, default: str, choices: tuple[str, ...], *, meaning: str) -> str:
        self.declared.append(Parameter(name, "choice", default, ", ".join(choices), meaning))
        value = self._given.pop(name, default)
        if value not in choices:
            raise ConfigError(f"{self._where}.{name}", value, "one of " + ", ".join(choices))
        return str(value)

    def done(self) -> None:
        if self._given:
            unknown = ", ".join(sorted(self._given))
            raise ConfigError(self._where, unknown, "no parameter named " + unknown)


FilterFactory = Callable[[Params, PluginContext], Filter]
ScorerFactory = Callable[[Params, PluginContext], Scorer]
PickerFactory = Callable[[Params, PluginContext], Picker]
PreferenceFactory = Callable[[Params, PluginContext], Preference]


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
        "fallback", "max-score", ("max-score", "min-predicted-ttft"),
        meaning="the picker of a new session, or of one whose pod is gone",
    )  # fmt: skip
    inner: Picker = (
        MaxScorePicker(ctx.rng)
        if fallback == "max-score"
        else MinPredictedTtftPicker(ctx.cost, ctx.block_size, ctx.rng, shed=ctx.slo_shed)
    )
    sessions = params.integer(
        "max_sessions", 100_000, low=1, high=10_000_000,
        meaning="sessions remembered (the least recently used forgotten beyond)",
    )  # fmt: skip
    return SessionPicker(inner, max_sessions=sessions)


def _min_predicted_ttft(params: Params, ctx: PluginContext) -> Picker:
    """The lowest cost: the cost model's predicted TTFT plus the charges below; a
    conversation's first turn is placed (docs/routing.md#the-cost-model)."""
    number, flag = params.number, params.flag
    return MinPredictedTtftPicker(
        ctx.cost,
        ctx.block_size,
        ctx.rng,
        tie_tolerance=number(
            "tie_tolerance", 0.05, high=10.0,
            meaning="pods within this share of the best cost go by cache affinity",
        ),
        affinity_tolerance=number(
            "affinity_tolerance", 0.0, high=10.0,
            meaning="a later turn stays on the pod holding most of its conversation unless "
            "another costs less by more than this share (0: off)",
        ),
        prefill_weight=number(
            "prefill_weight", 0.0, high=100.0,
            meaning="charges the request's own prefill on a pod this many times again",
        ),
        delay_weight=number(
            "delay_weight", 0.0, high=100.0,
            meaning="× the delay its prefill adds to the requests waiting for the pod's "
            "next step",
        ),
        arrival_weight=number(
            "arrival_weight", 0.0, high=100.0,
            meaning="× the delay its prefill adds to the requests bound to the pod that "
            "arrive while it runs (λ·P²/2)",
        ),
        probe_rate=number(
            "probe_rate", 0.02, high=1.0,
            meaning="share of decisions putting first an idle pod unanswered for 10 s",
        ),
        placement_tolerance=(
            number(
                "placement_tolerance", 0.25, high=10.0,
                meaning="a first turn's candidates: the pods whose cost, as if each held "
                "its shared prefix, is within this share of the best",
            )
            if flag(
                "placement", True,
                meaning="a conversation's first turn is placed by load among pods ranked "
                "as if each held its shared prefix (false: ranked like any request)",
            )
            else -1.0
        ),
        chunk_tokens=params.integer(
            "chunk_tokens", DEFAULT_CHUNK_TOKENS, low=1,
            meaning="the engines' prefill chunk: a longer prompt delays those admitted "
            "with it by one chunk at most",
        ),
        placement_load_tolerance=number(
            "placement_load_tolerance", 0.0, high=10.0,
            meaning="among a first turn's candidates, loads within this share (plus one "
            "request) of the least count as equal, holders of the shared prefix first "
            "(0: the least loaded first)",
        ),
        tpot_tolerance=number(
            "tpot_tolerance", 0.5, high=10.0,
            meaning="a pod predicted within this share above a TPOT objective meets it",
        ),
        tpot_ranking=flag(
            "tpot_ranking", False,
            meaning="a TPOT objective puts the pods predicted to meet it first (false: "
            "counted, and shed with `shed`)",
        ),
        shed=flag(
            "shed", ctx.slo_shed, default_from="KVGATE_SLO_SHED",
            meaning="a request no pod is predicted to serve within its objectives gets a "
            "429 with Retry-After",
        ),
    )  # fmt: skip


def _pin_affinity(params: Params, ctx: PluginContext) -> Preference:
    """A pinned conversation's pod goes first (the others stay as retry targets)."""
    return PinAffinityPreference(ctx.affinity)


FILTERS: dict[str, FilterFactory] = {"routable": _routable, "hot-spot-guard": _hot_spot}
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
    "min-predicted-ttft": _min_predicted_ttft,
}
PREFERENCES: dict[str, PreferenceFactory] = {"pin-affinity": _pin_affinity}
