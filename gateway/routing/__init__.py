"""Routing decisions: filters -> scorers -> picker -> preferences, as named profiles built
from a routing config (the built-in policies are one: policies.toml)."""

from gateway.routing.affinity import Affinity, PinAffinityPreference
from gateway.routing.charges import ArrivalCost, CostScorer, DelayCost, TtftCost
from gateway.routing.config import build_profiles, configured_profiles, load_specs
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
from gateway.routing.plugins import PluginContext
from gateway.routing.predicted import PredictedTtftScorer, predict_all
from gateway.routing.profile import Decision, Preference, RoutingProfile, Weighted
from gateway.routing.request import CycleState, RoutingRequest
from gateway.routing.scorers import KVUsageScorer, LoadScorer, PrefixScorer, Scorer
from predictor import FEATURES, CostParams, Prediction, Predictor, Ticket, TpotPrediction

__all__ = [
    "FEATURES",
    "Affinity",
    "ArrivalCost",
    "CostParams",
    "CostScorer",
    "CycleState",
    "Decision",
    "DelayCost",
    "Filter",
    "FirstTurnPlacement",
    "HotSpotFilter",
    "KVUsageScorer",
    "LoadEstimator",
    "LoadScorer",
    "MaxScorePicker",
    "MinCostPicker",
    "Picker",
    "PinAffinityPreference",
    "PluginContext",
    "PredictedTtftScorer",
    "Prediction",
    "Predictor",
    "Preference",
    "PrefixScorer",
    "RandomPicker",
    "RoundRobinPicker",
    "RoutableFilter",
    "RoutingProfile",
    "RoutingRequest",
    "Scorer",
    "SessionPicker",
    "SloFeasibleFilter",
    "Ticket",
    "TpotPrediction",
    "TtftCost",
    "Weighted",
    "build_profiles",
    "configured_profiles",
    "load_specs",
    "predict_all",
]
