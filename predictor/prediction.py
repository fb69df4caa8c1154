"""What the predictor hands out: a pod's predicted TTFT for a request with its terms
(`Prediction`), and a request's record from decision to last byte (`Ticket`)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from predictor.features import FEATURES, SEQ_UNIT, TOKEN_UNIT, pod_coefficients
from predictor.tpot import TpotPrediction


class ScrapedPod(Protocol):
    """A candidate as a decision sees it: its name and the engine's counts at its last
    scrape (every gateway replica's requests)."""

    @property
    def name(self) -> str: ...
    @property
    def scraped_at(self) -> float | None: ...
    @property
    def running(self) -> float: ...
    @property
    def waiting(self) -> float: ...


class Prediction(NamedTuple):
    """One pod's predicted TTFT for one request, with its inputs (a tuple: one is made per
    candidate per decision, and a tuple is the cheapest object to make)."""

    pod: str
    ttft_s: float
    own_tokens: float
    queued_tokens: float
    """Prefill tokens pending ahead of it (the next step's), ours and other replicas'."""
    queued_requests: float
    decoding: float
    coefficients: tuple[float, ...]
    """The fleet's θ at the decision."""
    busy: float = 0.0
    step_remaining_s: float = 0.0
    in_step_tokens: float = 0.0
    speed: float = 1.0

    def features(self) -> tuple[float, ...]:
        """What the fleet's model learns this answer from (`speed` divided out of the
        current step's remainder, which is measured on the pod itself)."""
        return (
            1.0,
            (self.own_tokens + self.queued_tokens) / TOKEN_UNIT,
            self.queued_requests / SEQ_UNIT,
            self.decoding / SEQ_UNIT,
            self.busy,
            self.step_remaining_s / self.speed,
            self.in_step_tokens / TOKEN_UNIT,
        )

    def terms(self) -> dict[str, float]:
        """Each term's share of the predicted TTFT, in seconds (for /admin/match)."""
        scale = self.speed
        return {
            name: c * x * scale
            for name, c, x in zip(FEATURES, self.coefficients, self.features(), strict=True)
        }

    def pod_coefficients(self) -> tuple[float, ...]:
        """θ as it applies to this pod (its speed folded in)."""
        return pod_coefficients(self.coefficients, self.speed)

    def delay_to_queued_s(self) -> float:
        """What this request adds to the TTFTs of the requests queued on the pod for its
        next step (`costs.delays`): its own prefill, once for each of them."""
        return self.queued_requests * self.own_prefill_s()

    def own_prefill_s(self) -> float:
        """The predicted time of this request's own prefill on the pod."""
        return self.speed * self.coefficients[1] * self.own_tokens / TOKEN_UNIT


@dataclass(eq=False, slots=True)
class Ticket:
    """One request's work on the pod it was sent to, from decision to last byte."""

    pod: str
    prediction: Prediction
    started: float
    streamed: bool
    learn: bool = True
    """Its observed TTFT may train the model (the prompt was tokenized: features known)."""
    phase: str = "prefill"
    """prefill → decode → done."""
    number: int = 0
    """Unique within this gateway (names it to the other replicas)."""
    remote: bool = False
    """Another replica's request, known from its decision: load only, nothing to learn."""
    step: int = 0
    """Its pod's `steps` when it was sent: it is in every step begun after."""
    tpot: TpotPrediction | None = None
    """Its predicted time per output token there, when it is streamed."""
    answered_at: float = math.nan
    """When its streamed first byte came back."""
