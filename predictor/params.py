"""The predictor's parameters: its priors and learning rates (`CostParams`)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from predictor.features import STEP_TERM

# Prior, in seconds per feature unit (SIM-CALIBRATION: Qwen3-14B-FP8 on one GPU): 20 ms
# overhead, 111 µs per prompt token to prefill, 20 ms per ten queued requests, 5 ms per ten
# decoding sequences, 25 ms for the decode step a busy engine runs with every prefill, the
# current step's remaining time as it is, in-step tokens at half their prefill cost.
DEFAULT_PRIOR = (0.020, 0.111, 0.020, 0.005, 0.025, 1.0, 0.05)
# A prompt token's prefill grows by this share per token of context before it (the
# attention over it), on the same calibration: 0.00475 µs/token² against 111 µs/token.
# Roughly 4 × layers × hidden size / (2 × parameters) for other dense models: ~3e-5 for an
# 8B, ~2e-5 for a 70B (`KVGATE_COST_CONTEXT_SHARE`).
CALIBRATED_CONTEXT_SHARE = 4.3e-5
MAX_TRACE_FACTOR = 10.0
"""The covariance's trace is kept within this many times its start (`TtftModel`)."""


@dataclass(frozen=True, slots=True)
class CostParams:
    """How the predictor learns: its priors, rates and robust weighting."""

    forgetting: float = 0.995
    """Weight of the past per observation (≈ the last 200 observations count)."""
    prior_strength: float = 4.0
    """Initial covariance scale of the model: larger lets it leave the prior faster."""
    huber_k: float = 1.5
    """Residuals beyond k × the running residual scale are down-weighted. At 3, about one
    run in five of the chat benchmark drifted into predictions 10–14 % high for its whole
    length (the pods' speeds falling while θ rose to meet them); at 1.5 the same recorded
    answers, replayed, stay centred."""
    context_share: float = 0.0
    """How much more a prompt token costs to prefill per token of context before it (the
    attention over it): a request with C tokens cached and N to compute does the work of
    N + context_share · ((C + N)² − C²) tokens (`CostModel.work_of`). 0 here, a pure
    linear model; a gateway runs with `CALIBRATED_CONTEXT_SHARE` unless told otherwise."""
    cpu_load_fraction: float = 0.05
    """A CPU-tier block costs this share of a block's prefill to load back."""
    storage_load_fraction: float = 0.2
    prior: tuple[float, ...] = DEFAULT_PRIOR
    prior_scale: float = 1.0
    """How many times slower than the prior's calibration the fleet is taken to be (the
    TPOT model's prior is scaled by it too)."""
    activity_window_s: float = 10.0
    """Time constant of each pod's decayed count of requests routed to it (its activity)."""
    speed_rate: float = 0.05
    """How far one answer moves a pod's speed toward what it showed, once it has a few."""
    max_speed_step: float = 0.5
    """Bound on one answer's pull on a pod's log-speed (a stall moves it little)."""

    def with_prior_scale(self, scale: float) -> CostParams:
        """These parameters for a fleet `scale` times slower than the prior's: every
        coefficient that is time per unit is scaled; the step term is not (it weighs a
        time measured on the pod itself)."""
        prior = tuple(v if i == STEP_TERM else v * scale for i, v in enumerate(self.prior))
        return replace(self, prior=prior, prior_scale=self.prior_scale * scale)
