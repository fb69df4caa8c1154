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
from typing import TYPE_CHECKING, Any

from predictor.features import MAX_COEFFICIENT, MAX_LOG_SPEED, MAX_SECONDS
from predictor.params import MAX_TRACE_FACTOR, CostParams

if TYPE_CHECKING:
    from predictor.state import FleetState


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
        self._max_trace = MAX_TRACE_FACTOR * n * params.prior_strength
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
        """Continue from another gateway's `state()`, checked (`state.check_export`)."""
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
        if not 0.0 < observed <= MAX_SECONDS:  # nan too
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
        px, gain = _gain(self._p, x, [True] * len(x), lam / weight)
        self._fit(x, residual, gain, lam / weight)
        self.coefficients = tuple(self.theta)
        self._update_covariance(px, gain, lam)
        # The scale follows |residual| within the bound; an outlier only widens it by 5 %, so
        # rare stalls cannot inflate it, while a lasting change widens it within ~20 answers.
        if abs(residual) <= bound:
            self.residual_scale = min(MAX_SECONDS, 0.95 * scale + 0.05 * abs(residual))
        else:
            self.residual_scale = min(MAX_SECONDS, 1.05 * scale)
        self.observations += 1

    def _fit(self, x: tuple[float, ...], residual: float, gain: list[float], noise: float) -> None:
        """θ moved by one answer's `residual` along `gain`, every coefficient kept >= 0:
        more work never costs less."""
        theta = self.theta
        n = len(x)
        clipped = [min(MAX_COEFFICIENT, max(0.0, theta[i] + gain[i] * residual))
                   for i in range(n)]  # fmt: skip
        moved = sum((clipped[i] - theta[i]) * x[i] for i in range(n))
        if moved * residual >= 0.0:
            theta[:] = clipped
            return
        # Clipping kept the raises of the coefficients it did not clip, and this answer's
        # prediction moved away from what was observed: under a burst that fed on itself
        # the model ran away. Instead, each coefficient the update takes below 0 is set to
        # 0 and the rest fitted again without it (the covariance restricted to them).
        free = [True] * n
        error = residual
        step = gain
        while held := [i for i in range(n) if free[i] and theta[i] + step[i] * error < 0.0]:
            for i in held:
                free[i] = False
                error += theta[i] * x[i]  # its part of the prediction goes
                theta[i] = 0.0
            _, step = _gain(self._p, x, free, noise)
        for i in range(n):
            theta[i] = min(MAX_COEFFICIENT, theta[i] + step[i] * error)

    def _update_covariance(self, px: list[float], gain: list[float], lam: float) -> None:
        p = self._p
        n = len(px)
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
