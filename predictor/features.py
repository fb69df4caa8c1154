"""The TTFT model's terms, their units, and the physical ranges its state keeps to."""

from __future__ import annotations

FEATURES = (
    "base",
    "prefill_tokens",
    "queued_requests",
    "decoding",
    "busy",
    "step_remaining",
    "in_step_tokens",
)
"""Names of the model's terms, in coefficient order (for /admin/match, metrics, docs)."""
STEP_TERM = FEATURES.index("step_remaining")
"""The one term a pod's speed does not scale: it is measured on the pod itself."""

TOKEN_UNIT = 1000.0
"""Features in thousands of tokens and tens of sequences keep the least-squares state well
conditioned at float precision."""
SEQ_UNIT = 10.0

# The state's physical ranges, kept by learning and checked in a peer's export
# (`state.py`): with them every prediction stays a finite number of seconds.
MAX_COEFFICIENT = 1000.0
"""A coefficient's bound, in seconds per feature unit (the prior's largest is 1: no engine
takes 1000 s per thousand tokens, ten requests or one step)."""
MAX_SECONDS = 1e6
"""Bound of the running typical TTFT and residual scale (s): beyond any wait the gateway
allows (its durations stop at 7 days)."""
MAX_LOG_SPEED = 10.0
"""A pod's log-speed stays within ±10 (22 000 times slower or faster than the fleet)."""
MAX_OBSERVATIONS = 2**53
MAX_PODS = 4096
"""Pods a predictor keeps at once, and so at most in an export."""


def pod_coefficients(theta: tuple[float, ...], speed: float) -> tuple[float, ...]:
    """θ as it applies to a pod of `speed` (every term but the step's scaled by it)."""
    return tuple(c if i == STEP_TERM else c * speed for i, c in enumerate(theta))
