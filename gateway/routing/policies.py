"""A gateway's routing policies: the built-in profiles with its routing config laid over
them, built with the collaborators every plugin of the gateway shares."""

from __future__ import annotations

import random

from gateway.routing.affinity import Affinity
from gateway.routing.config import configured_profiles
from gateway.routing.load import LoadEstimator
from gateway.routing.plugins import PluginContext
from gateway.routing.profile import PluginTimer, RoutingProfile
from gateway.settings import Settings
from predictor import Predictor


def build_policies(
    settings: Settings,
    rng: random.Random,
    *,
    cost: Predictor | None = None,
    affinity: Affinity | None = None,
    timer: PluginTimer | None = None,
) -> dict[str, RoutingProfile]:
    """The built-in policies with `settings.routing_config` laid over them."""
    context = plugin_context(settings, rng, cost or Predictor(), affinity)
    return configured_profiles(settings.routing_config, settings.default_policy, context, timer)


def plugin_context(
    settings: Settings, rng: random.Random, cost: Predictor, affinity: Affinity | None
) -> PluginContext:
    """What every routing plugin of one gateway shares, with defaults from `settings`."""
    return PluginContext(
        rng=rng,
        load=LoadEstimator(),
        cost=cost,
        affinity=affinity,
        block_size=settings.index.block_size,
        hot_spot_margin=settings.hot_spot_margin,
        tier_weights=settings.tier_weights,
        slo_shed=settings.slo_shed,
    )
