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
from gateway.routing.cost import CostModel
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

MAX_WEIGHT = 1000.0
"""A scorer's weight is at most this: a profile's total (weight × a score in [0, 1], summed
over its scorers) stays a small finite number whatever the config says."""
MAX_INTEGER = 2**31 - 1
"""Every integer parameter's bound (as the settings')."""


@dataclass(frozen=True, slots=True)
class PluginContext:
    rng: random.Random
    load: LoadEstimator
    cost: CostModel
    affinity: Affinity | None
    """The pin manager's lease lookup (the `pin-affinity` preference); None: no pins."""
    block_size: int
    hot_spot_margin: int = 16
    """Default of the hot-spot guard's `margin` (KVGATE_HOT_SPOT_MARGIN)."""
    tier_weights: Mapping[Tier, float] | None = None
    """Default of the prefix scorer's tier weights (KVGATE_TIER_WEIGHTS)."""
    slo_shed: bool = False
    """Default of the SLO picker's `shed` (KVGATE_SLO_SHED)."""


class Params:
    """A plugin's parameters, read once each; `done()` refuses any left unread."""

    def __init__(self, where: str, given: Mapping[str, Any]) -> None:
        self._where = where
        self._given = dict(given)

    def number(self, name: str, default: float, *, low: float = 0.0, high: float) -> float:
        """A finite number in [low, high] (nan, inf and 1e308 beyond `high` refused)."""
        value = self._given.pop(name, default)
        numeric = isinstance(value, int | float) and not isinstance(value, bool)
        if not numeric or not low <= value <= high:  # nan too; exact for ints of any size
            raise ConfigError(f"{self._where}.{name}", value, f"a number in [{low:g}, {high:g}]")
        return float(value)

    def integer(self, name: str, default: int, *, low: int = 0, high: int = MAX_INTEGER) -> int:
        value = self._given.pop(name, default)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ConfigError(f"{self._where}.{name}", value, f"an integer in {low}..{high}")
        return value

    def flag(self, name: str, default: bool) -> bool:
        value = self._given.pop(name, default)
        if not isinstance(value, bool):
            raise ConfigError(f"{self._where}.{name}", value, "true or false")
        return value

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
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
    return RoutableFilter()


def _hot_spot(params: Params, ctx: PluginContext) -> Filter:
    return HotSpotFilter(params.integer("margin", ctx.hot_spot_margin, low=1), ctx.load)


def _prefix(params: Params, ctx: PluginContext) -> Scorer:
    defaults = dict(ctx.tier_weights or {})
    weights = {
        tier: params.number(f"{tier.name.lower()}_weight", defaults.get(tier, 0.0), high=1.0)
        for tier in Tier
    }
    return PrefixScorer(weights)


def _load(params: Params, ctx: PluginContext) -> Scorer:
    return LoadScorer(params.number("scale", 2.0, low=1e-9, high=1e9), ctx.load)


def _kv_usage(params: Params, ctx: PluginContext) -> Scorer:
    return KVUsageScorer()


def _predicted_ttft(params: Params, ctx: PluginContext) -> Scorer:
    return PredictedTtftScorer(ctx.cost, ctx.block_size)


def _max_score(params: Params, ctx: PluginContext) -> Picker:
    return MaxScorePicker(ctx.rng)


def _random(params: Params, ctx: PluginContext) -> Picker:
    return RandomPicker(ctx.rng)


def _round_robin(params: Params, ctx: PluginContext) -> Picker:
    return RoundRobinPicker()


def _session(params: Params, ctx: PluginContext) -> Picker:
    fallback = params.choice("fallback", "max-score", ("max-score", "min-predicted-ttft"))
    inner: Picker = (
        MaxScorePicker(ctx.rng)
        if fallback == "max-score"
        else MinPredictedTtftPicker(ctx.cost, ctx.block_size, ctx.rng, shed=ctx.slo_shed)
    )
    sessions = params.integer("max_sessions", 100_000, low=1, high=10_000_000)
    return SessionPicker(inner, max_sessions=sessions)


def _min_predicted_ttft(params: Params, ctx: PluginContext) -> Picker:
    return MinPredictedTtftPicker(
        ctx.cost,
        ctx.block_size,
        ctx.rng,
        tie_tolerance=params.number("tie_tolerance", 0.05, high=10.0),
        affinity_tolerance=params.number("affinity_tolerance", 0.0, high=10.0),
        prefill_weight=params.number("prefill_weight", 0.0, high=100.0),
        delay_weight=params.number("delay_weight", 0.0, high=100.0),
        arrival_weight=params.number("arrival_weight", 0.0, high=100.0),
        probe_rate=params.number("probe_rate", 0.02, high=1.0),
        placement_tolerance=(
            params.number("placement_tolerance", 0.25, high=10.0)
            if params.flag("placement", True)
            else -1.0
        ),
        chunk_tokens=params.integer("chunk_tokens", DEFAULT_CHUNK_TOKENS, low=1),
        placement_load_tolerance=params.number("placement_load_tolerance", 0.0, high=10.0),
        tpot_tolerance=params.number("tpot_tolerance", 0.5, high=10.0),
        tpot_ranking=params.flag("tpot_ranking", False),
        shed=params.flag("shed", ctx.slo_shed),
    )


def _pin_affinity(params: Params, ctx: PluginContext) -> Preference:
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
