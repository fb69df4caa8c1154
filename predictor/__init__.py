"""The predictor: what a request costs on each pod (its predicted time to first byte, and
per output token), learned from the answers. Pure and synchronous, on an injected clock;
no I/O, no import of the gateway. Routing, replica sync, snapshots and metrics use it
through `Predictor`."""

from predictor.costs import argsort, delays, most_cached_first, near_ties
from predictor.features import FEATURES, STEP_TERM
from predictor.model import STALE_S, Candidate, Predictor
from predictor.params import CALIBRATED_CONTEXT_SHARE, CostParams
from predictor.prediction import Prediction, ScrapedPod, Ticket
from predictor.rankings import Ranking
from predictor.state import MAX_EXPORT_BYTES, REASONS, CostStateError, parse_export
from predictor.tpot import TPOT_FEATURES, TpotPrediction

__all__ = [
    "CALIBRATED_CONTEXT_SHARE",
    "FEATURES",
    "MAX_EXPORT_BYTES",
    "REASONS",
    "STALE_S",
    "STEP_TERM",
    "TPOT_FEATURES",
    "Candidate",
    "CostParams",
    "CostStateError",
    "Prediction",
    "Predictor",
    "Ranking",
    "ScrapedPod",
    "Ticket",
    "TpotPrediction",
    "argsort",
    "delays",
    "most_cached_first",
    "near_ties",
    "parse_export",
]
