"""Routing decisions: filters -> scorers -> picker -> preferences, as named profiles built
from a routing config (the built-in policies are one: policies.toml)."""

from gateway.routing.affinity import Affinity, PinAffinityPreference
from gateway.routing.config import build_profiles, configured_profiles, load_specs
from gateway.routing.filters import Filter, HotSpotFilter, RoutableFilter
from gateway.routing.load import LoadEstimator
from gateway.routing.pickers import (
    MaxScorePicker,
    Picker,
    RandomPicker,
    RoundRobinPicker,
    SessionPicker,
)
from gateway.routing.plugins import PluginContext
from gateway.routing.predicted import MinPredictedTtftPicker, PredictedTtftScorer, predict_all
from gateway.routing.profile import Decision, Preference, RoutingProfile, Weighted
from gateway.routing.request import CycleState, RoutingRequest
from gateway.routing.scorers import KVUsageScorer, LoadScorer, PrefixScorer, Scorer
from predictor import FEATURES, CostParams, Prediction, Predictor, Ticket, TpotPrediction

__all__ = [
    "FEATURES",
    "Affinity",
    "CostParams",
    "CycleState",
    "Decision",
    "Filter",
    "HotSpotFilter",
    "KVUsageScorer",
    "LoadEstimator",
    "LoadScorer",
    "MaxScorePicker",
    "MinPredictedTtftPicker",
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
    "Ticket",
    "TpotPrediction",
    "Weighted",
    "build_profiles",
    "configured_profiles",
    "load_specs",
    "predict_all",
]
