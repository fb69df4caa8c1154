"""The fleet's TTFT model: one linear shape learned from every pod's answers, fitted by
robust weighted least squares in relative terms, and each pod's speed factor.

Why one shape and a speed per pod: with a full model per pod, seven coefficients are
learned from a pod's own few hundred answers, and they wander (on a mixed fleet the
replayed p90 error reached 81–130 %, docs/decisions/0003); every pod's answers teach
the same physics (a prefill step, a decode batch, a queue), so the shape is learned from
all of them and each pod keeps one number, how much slower or faster it runs than the
fleet. That number still makes a mixed pool (older GPUs, other engine settings) a pool of
pods modelled one by one.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gateway.routing.cost_state import FleetState

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
_MAX_TRACE_FACTOR = 10.0

# The state's physical ranges, kept by learning and checked in a peer's export
# (`cost_state.py`): with them every prediction stays a finite number of seconds.
MAX_COEFFICIENT = 1000.0
"""A coefficient's bound, in seconds per feature unit (the prior's largest is 1: no engine
takes 1000 s per thousand tokens, ten requests or one step)."""
MAX_SECONDS = 1e6
"""Bound of the running typical TTFT and residual scale (s): beyond any wait the gateway
allows (its durations stop at 7 days)."""
MAX_LOG_SPEED = 10.0
"""A pod's log-speed stays within ±10 (22 000 times slower or faster than the fleet)."""
MAX_OBSERVATIONS = 2**53


@dataclass(frozen=True, slots=True)
class CostParams:
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


class TtftModel:
    """The fleet's linear TTFT shape, fitted by weighted recursive least squares.

    Each answer is weighted by the inverse of its TTFT (relative to the running typical
    TTFT): what is scored is the error relative to the observed TTFT, and without the
    weighting the few slow answers of a queue would decide the fit of every short one."""

    __slots__ = (
        "_max_trace", "_p", "_params", "coefficients", "observations", "reference",
        "residual_scale", "theta",
    )  # fmt: skip

    def __init__(self, params: CostParams, theta: Iterable[float] | None = None) -> None:
        self._params = params
        self.theta = list(theta if theta is not None else params.prior)
        self.coefficients = tuple(self.theta)
        """θ as a tuple (what predictions carry; remade after each update)."""
        n = len(self.theta)
        self._p = [[params.prior_strength if i == j else 0.0 for j in range(n)] for i in range(n)]
        self._max_trace = _MAX_TRACE_FACTOR * n * params.prior_strength
        self.residual_scale = 0.0
        self.reference = 0.0
        """Running typical TTFT (s): answers are weighted by reference / their TTFT."""
        self.observations = 0

    def state(self) -> dict[str, Any]:
        """What another gateway needs to continue this model (JSON)."""
        return {
            "theta": list(self.theta),
            "p": [list(row) for row in self._p],
            "residual_scale": self.residual_scale,
            "reference": self.reference,
            "observations": self.observations,
        }

    def adopt(self, state: FleetState) -> None:
        """Continue from another gateway's `state()`, checked (`cost_state.check_export`)."""
        self.theta = list(state.theta)
        self._p = [list(row) for row in state.p]
        self.coefficients = tuple(self.theta)
        self.residual_scale, self.reference = state.residual_scale, state.reference
        self.observations = state.observations

    @property
    def max_trace(self) -> float:
        """The bound learning keeps the covariance's trace to."""
        return self._max_trace

    @property
    def covariance_trace(self) -> float:
        """How far one answer may still move the model (the RLS covariance's trace)."""
        return sum(self._p[i][i] for i in range(len(self._p)))

    def predict(self, x: tuple[float, ...]) -> float:
        return sum(c * v for c, v in zip(self.theta, x, strict=True))

    def learn(self, x: tuple[float, ...], observed: float) -> None:
        if observed <= 0.0:
            return
        if not observed <= MAX_SECONDS:  # nan too
            return
        self.reference = observed if self.reference <= 0.0 else (
            0.98 * self.reference + 0.02 * observed
        )  # fmt: skip
        relative = self.reference / observed
        x = tuple(v * relative for v in x)
        observed *= relative
        predicted = self.predict(x)
        residual = observed - predicted
        scale = self.residual_scale
        if self.observations == 0 or scale <= 0.0:
            # Not the first residual: that may itself be an outlier, and would set the scale.
            scale = 0.25 * max(predicted, 1e-6)
        bound = self._params.huber_k * scale
        # Beyond the bound, influence falls with the residual (a stall 20× the usual TTFT
        # hardly moves the model); a shift that lasts still gets through as the scale grows.
        weight = 1.0 if abs(residual) <= bound else (bound / residual) ** 2
        lam = self._params.forgetting
        p = self._p
        n = len(x)
        theta = self.theta
        free = [True] * n
        px, gain = _gain(p, x, free, lam / weight)
        # More work never costs less: coefficients stay >= 0, each clipped at 0.
        clipped = [min(MAX_COEFFICIENT, max(0.0, theta[i] + gain[i] * residual))
                   for i in range(n)]  # fmt: skip
        moved = sum((clipped[i] - theta[i]) * x[i] for i in range(n))
        if moved * residual >= 0.0:
            theta[:] = clipped
        else:
            # Clipping kept the raises of the coefficients it did not clip, and this
            # answer's prediction moved away from what was observed: under a burst that
            # fed on itself and the model ran away. Instead, each
            # coefficient the update takes below 0 is set to 0 and the rest fitted again
            # without it (the covariance restricted to them).
            error = residual
            step = gain
            while held := [i for i in range(n) if free[i] and theta[i] + step[i] * error < 0.0]:
                for i in held:
                    free[i] = False
                    error += theta[i] * x[i]  # its part of the prediction goes
                    theta[i] = 0.0
                _, step = _gain(p, x, free, lam / weight)
            for i in range(n):
                theta[i] = min(MAX_COEFFICIENT, theta[i] + step[i] * error)
        self.coefficients = tuple(theta)
        for i in range(n):
            gi = gain[i]
            row = p[i]
            for j in range(n):
                row[j] = (row[j] - gi * px[j]) / lam
        # Forgetting inflates the covariance along directions the traffic does not vary
        # (windup); one unusual request would then swing the model. Keep its trace bounded.
        trace = sum(p[i][i] for i in range(n))
        if trace > self._max_trace:
            shrink = self._max_trace / trace
            for row in p:
                for j in range(n):
                    row[j] *= shrink
        # The scale follows |residual| within the bound; an outlier only widens it by 5 %, so
        # rare stalls cannot inflate it, while a lasting change widens it within ~20 answers.
        if abs(residual) <= bound:
            self.residual_scale = min(MAX_SECONDS, 0.95 * scale + 0.05 * abs(residual))
        else:
            self.residual_scale = min(MAX_SECONDS, 1.05 * scale)
        self.observations += 1


def _gain(
    p: list[list[float]], x: tuple[float, ...], free: list[bool], noise: float
) -> tuple[list[float], list[float]]:
    """P·x and the least-squares gain of one answer over the `free` coefficients (the
    covariance restricted to them; the others' entries are 0). `noise`: λ / the answer's
    weight."""
    n = len(x)
    px = [sum(p[i][j] * x[j] for j in range(n) if free[j]) if free[i] else 0.0 for i in range(n)]
    denominator = noise + sum(x[i] * px[i] for i in range(n))
    return px, [v / denominator for v in px]


class PodSpeed:
    """How much slower (> 1) or faster (< 1) one pod runs than the fleet's model says,
    learned in log space from its own answers, starting from the fleet's typical speed: the
    n-th answer moves it 1/(n+1) of the way (its start counts as one answer, so one noisy
    first answer cannot make a pod look twice as fast as its twin), later ones by
    `speed_rate`, each pull bounded so that a stalled request hardly moves it."""

    __slots__ = ("factor", "log", "observations")

    def __init__(self, log: float = 0.0, observations: int = 0) -> None:
        self.log = log
        self.factor = math.exp(log)
        self.observations = observations

    def learn(self, observed: float, fleet_predicted: float, params: CostParams) -> None:
        if observed <= 0.0 or fleet_predicted <= 0.0:
            return
        bound = params.max_speed_step
        pull = min(bound, max(-bound, math.log(observed / fleet_predicted) - self.log))
        self.observations += 1
        self.log += pull * max(params.speed_rate, 1.0 / (self.observations + 1))
        self.log = min(MAX_LOG_SPEED, max(-MAX_LOG_SPEED, self.log))
        self.factor = math.exp(self.log)
