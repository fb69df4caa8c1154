"""Routing decisions: filters -> scorers -> picker, as named profiles."""

from gateway.routing.filters import Filter, HotSpotFilter, RoutableFilter
from gateway.routing.load import LoadEstimator
from gateway.routing.pickers import (
    MaxScorePicker,
    Picker,
    RandomPicker,
    RoundRobinPicker,
    SessionPicker,
)
from gateway.routing.profile import Decision, RoutingProfile, Weighted, build_policies
from gateway.routing.request import RoutingRequest
from gateway.routing.scorers import KVUsageScorer, LoadScorer, PrefixScorer, Scorer

__all__ = [
    "Decision",
    "Filter",
    "HotSpotFilter",
    "KVUsageScorer",
    "LoadEstimator",
    "LoadScorer",
    "MaxScorePicker",
    "Picker",
    "PrefixScorer",
    "RandomPicker",
    "RoundRobinPicker",
    "RoutableFilter",
    "RoutingProfile",
    "RoutingRequest",
    "Scorer",
    "SessionPicker",
    "Weighted",
    "build_policies",
]
