"""Time per output token on each pod: what a stream's later tokens cost there, for the
clients' `x-slo-tpot-ms` objectives.

A decoding sequence gets one token per engine step, and each step decodes the batch and
prefills what the pod admitted (vLLM's and SGLang's chunked prefill), so its TPOT is the
decode step at the batch it runs in, lengthened by the prefills of the requests that reach
the pod while it decodes. Modelled as linear in four features known at decision time:

    tpot ≈ decode speed · (φ0 + φ1·(sequences decoding with it)
                           + φ2·(prefill tokens per second routed to the pod lately)
                           + φ3·(requests per second routed to it lately))

- sequences: the pod's decoding ones (ours, and the engine's `running` beyond ours), the
  requests ahead of it in prefill, and itself;
- the prefill traffic: the pod's recent arrival rate, and that times its mean uncached
  tokens per request (a request's prefill costs a fixed part and a part per token).

The exact relation is not linear (T = n·d + f·T over an answer of n tokens, d the decode
step and f the share of the pod's time prefill takes, so TPOT = d / (1 − f)); a model with
that form, f taken from the TTFT model's prefill cost, predicts no better on
`kvgate bench routing`: f's estimate from a 10-second arrival rate is noisy, and the form
amplifies its errors near saturation where the learned linear terms stay bounded.

φ is the fleet's (one shape learned from every pod's streams, as the TTFT model's θ:
`TtftModel`'s robust, relative least squares) and each pod has its own decode speed — not
its prefill speed: decode is bound by memory bandwidth and prefill by compute, so a pod of
another GPU or other engine settings can be slower at one and not the other. It is learned
from the pod's streamed answers, observed TPOT = (end − first byte) / (completion tokens
− 1); until a pod has answered, it runs at the answered pods' typical speed. Memory is
bounded: one speed per pod, pods forgotten with the cost model's.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from typing import NamedTuple

from predictor.features import MAX_PODS, SEQ_UNIT, TOKEN_UNIT
from predictor.fleet import PodSpeed, TtftModel
from predictor.params import CostParams

__all__ = ["TPOT_FEATURES", "TpotModel", "TpotPrediction"]

TPOT_FEATURES = ("base", "decoding", "prefill_rate", "arrival_rate")
"""Names of the TPOT model's terms, in coefficient order."""
# Prior (SIM-CALIBRATION, as the TTFT prior): a 25 ms decode step, 0.2 ms more per running
# sequence (2 ms per ten); 111 µs of prefill per token and 20 ms per request: at r thousand
# tokens/s a pod spends 0.111·r of its time prefilling, which lengthens a 25 ms step by
# ≈ 2.8 ms per r, and at q requests/s 0.02·q, ≈ 5 ms per ten.
DEFAULT_TPOT_PRIOR = (0.025, 0.002, 0.0028, 0.005)


class TpotPrediction(NamedTuple):
    """One pod's predicted TPOT for one request, with its inputs."""

    pod: str
    tpot_s: float
    sequences: float
    """Sequences that will decode with it (itself included)."""
    prefill_rate: float
    """Prefill tokens per second routed to the pod lately."""
    arrival_rate: float
    """Requests per second routed to the pod lately."""
    speed: float
    coefficients: tuple[float, ...]

    def features(self) -> tuple[float, ...]:
        return (
            1.0, self.sequences / SEQ_UNIT, self.prefill_rate / TOKEN_UNIT,
            self.arrival_rate / SEQ_UNIT,
        )  # fmt: skip

    def terms(self) -> dict[str, float]:
        """Each term's share of the predicted TPOT, in seconds (for /admin/match)."""
        return {
            name: c * x * self.speed
            for name, c, x in zip(TPOT_FEATURES, self.coefficients, self.features(), strict=True)
        }


class TpotModel:
    """The fleet's TPOT shape and each pod's decode speed; one per cost model."""

    def __init__(self, params: CostParams) -> None:
        self._params = params
        prior = tuple(v * params.prior_scale for v in DEFAULT_TPOT_PRIOR)
        self.fleet = TtftModel(replace(params, prior=prior))
        self._speeds: dict[str, PodSpeed] = {}
        self._log_speeds = 0.0
        """Sum of the answered pods' log decode speeds (their mean is a new pod's)."""

    def predict(
        self, pod: str, sequences: float, prefill_rate: float, arrival_rate: float
    ) -> TpotPrediction:
        speed = self.speed(pod)
        theta = self.fleet.coefficients
        tpot = speed * (
            theta[0] + theta[1] * sequences / SEQ_UNIT + theta[2] * prefill_rate / TOKEN_UNIT
            + theta[3] * arrival_rate / SEQ_UNIT
        )  # fmt: skip
        return TpotPrediction(pod, tpot, sequences, prefill_rate, arrival_rate, speed, theta)

    def learn(self, prediction: TpotPrediction, observed_s: float) -> None:
        """A stream predicted by `prediction` ended with `observed_s` per output token."""
        if not observed_s > 0.0 or not math.isfinite(observed_s):
            return
        x = prediction.features()
        speed = self._speeds.get(prediction.pod)
        if speed is None:
            if len(self._speeds) >= MAX_PODS:  # pods come and go: stay bounded
                self.forget(())
            speed = self._speeds[prediction.pod] = PodSpeed(math.log(self.typical_speed()))
            self._log_speeds += speed.log
        before = speed.log
        speed.learn(observed_s, self.fleet.predict(x), self._params)
        self._log_speeds += speed.log - before
        self.fleet.learn(x, observed_s / prediction.speed)

    def speed(self, pod: str) -> float:
        """How much slower (> 1) or faster (< 1) than the fleet's shape the pod decodes."""
        speed = self._speeds.get(pod)
        return self.typical_speed() if speed is None else speed.factor

    def typical_speed(self) -> float:
        """The answered pods' typical decode speed (geometric mean): a new pod's."""
        return math.exp(self._log_speeds / len(self._speeds)) if self._speeds else 1.0

    def answers(self, pod: str) -> int:
        speed = self._speeds.get(pod)
        return 0 if speed is None else speed.observations

    def forget(self, live: Iterable[str]) -> None:
        """Drop the pods that are gone."""
        keep = set(live)
        for name in [name for name in self._speeds if name not in keep]:
            self._log_speeds -= self._speeds.pop(name).log
