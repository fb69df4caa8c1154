"""What a request costs on each pod: predicted time to first byte, learned per pod.

A pod's TTFT for a new request is modelled as linear in four features, all known at
decision time:

    ttft ≈ θ0 + θ1·(prefill tokens: its own uncached ones + those queued ahead of it)
              + θ2·(requests queued ahead of it) + θ3·(sequences decoding on the pod)

- its own uncached tokens: the prompt minus the blocks the pod holds from the start (GPU
  blocks free, CPU and STORAGE blocks at a fraction of a token's prefill: their load cost);
- queued prefill: for every request this gateway sent to the pod whose first byte has not
  come back, its uncached tokens at its decision time; plus what other gateway replicas
  have queued there, estimated from the engine's scraped `waiting` gauge beyond our own
  count at that scrape, at this pod's mean uncached tokens per request. The queue ahead
  runs on the same GPU at the same rate as the request's own prefill, so both share θ1
  (which a pod then learns from every answer, queued or not); θ2 is each queued request's
  fixed cost (scheduling, a step's overhead);
- decoding: our requests past their first byte, plus the engine's scraped `running` beyond
  ours (decode steps share the engine with prefill: a busy batch slows every prefill step).

θ is learned online per pod by recursive least squares (exponential forgetting) from the
TTFT the gateway observes — the first body byte of a streamed answer after the request was
sent — so a pool of mixed GPUs or engine settings is modelled pod by pod. Until its first
answer a pod is predicted with the fleet's model as it is now (learned from every pod's
observations, from a prior in the range of a 14B model on one GPU), and its own model
starts from that: a new pod is usable at once, and a pod not yet answered never looks
slower (or faster) than the answered ones only because the prior was off. Updates are Huber-weighted
against a running residual scale (one stalled request cannot drag the model), coefficients
are kept non-negative (more work never predicts less time), and each model is a fixed
4×4 state: memory per pod is bounded, whatever the traffic.

The new request's work is added to its pod when it is routed, so the next decision of a
burst already sees it: a burst spreads as soon as queueing costs more than the cache saves.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

FEATURES = ("base", "prefill_tokens", "queued_requests", "decoding")
"""Names of the model's terms, in coefficient order (for /admin/match and the docs)."""
_EXPORT_VERSION = 1
_TOKEN_UNIT = 1000.0  # features in thousands of tokens and tens of sequences keep the
_SEQ_UNIT = 10.0  # least-squares state well conditioned at float precision
_MAX_PODS = 4096
_STALE_S = 10.0
"""An idle pod with no answer for this long is `stale`: the picker probes it now and then."""
_MAX_TRACE_FACTOR = 10.0

# Prior, in seconds per feature unit: 20 ms overhead, 111 µs per prompt token to prefill,
# 20 ms per ten queued requests, 5 ms per ten decoding sequences (SIM-CALIBRATION:
# Qwen3-14B-FP8 on one GPU).
DEFAULT_PRIOR = (0.020, 0.111, 0.020, 0.005)


@dataclass(frozen=True, slots=True)
class CostParams:
    forgetting: float = 0.995
    """Weight of the past per observation (≈ the last 200 observations count)."""
    prior_strength: float = 4.0
    """Initial covariance scale of a new pod's model: larger lets it leave the prior faster."""
    huber_k: float = 3.0
    """Residuals beyond k × the running residual scale are down-weighted."""
    cpu_load_fraction: float = 0.05
    """A CPU-tier block costs this share of a block's prefill to load back."""
    storage_load_fraction: float = 0.2
    prior: tuple[float, float, float, float] = DEFAULT_PRIOR
    activity_window_s: float = 10.0
    """Time constant of each pod's decayed count of requests routed to it (its activity)."""


class Prediction(NamedTuple):
    """One pod's predicted TTFT for one request, with its inputs (a tuple: one is made per
    candidate per decision, and a tuple is the cheapest object to make)."""

    pod: str
    ttft_s: float
    own_tokens: float
    queued_tokens: float
    queued_requests: float
    decoding: float
    coefficients: tuple[float, ...]

    def terms(self) -> dict[str, float]:
        """Each term's share of the predicted TTFT, in seconds (for /admin/match)."""
        values = self.features()
        return {name: c * x for name, c, x in zip(FEATURES, self.coefficients, values, strict=True)}

    def with_own_tokens(self, own_tokens: float) -> float:
        """The predicted TTFT had the request `own_tokens` uncached tokens on this pod."""
        return self.ttft_s - self.coefficients[1] * (self.own_tokens - own_tokens) / _TOKEN_UNIT

    def own_prefill_s(self) -> float:
        """The predicted time of this request's own prefill on the pod."""
        return self.coefficients[1] * self.own_tokens / _TOKEN_UNIT

    def features(self) -> tuple[float, float, float, float]:
        return (
            1.0,
            (self.own_tokens + self.queued_tokens) / _TOKEN_UNIT,
            self.queued_requests / _SEQ_UNIT,
            self.decoding / _SEQ_UNIT,
        )


class TtftModel:
    """One pod's (or the fleet's) linear TTFT model, fitted by weighted RLS."""

    __slots__ = (
        "_max_trace", "_p", "_params", "coefficients", "observations", "residual_scale", "theta"
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
        self.observations = 0

    def state(self) -> dict[str, Any]:
        """What another gateway needs to continue this model (JSON)."""
        return {
            "theta": list(self.theta),
            "p": [list(row) for row in self._p],
            "residual_scale": self.residual_scale,
            "observations": self.observations,
        }

    def adopt(self, state: Any) -> bool:
        """Continue from another gateway's `state()`; False (nothing changed) for anything
        malformed: a peer's answer is checked, never trusted."""
        n = len(self.theta)
        try:
            theta = [float(v) for v in state["theta"]]
            p = [[float(v) for v in row] for row in state["p"]]
            scale = float(state["residual_scale"])
            observations = int(state["observations"])
        except (TypeError, KeyError, ValueError):
            return False
        values = [*theta, *(v for row in p for v in row), scale]
        if (
            len(theta) != n
            or len(p) != n
            or any(len(row) != n for row in p)
            or not all(math.isfinite(v) for v in values)
            or min(theta) < 0.0
            or scale < 0.0
            or observations < 0
            or sum(p[i][i] for i in range(n)) > self._max_trace
        ):
            return False
        self.theta, self._p = theta, p
        self.coefficients = tuple(theta)
        self.residual_scale, self.observations = scale, observations
        return True

    @property
    def covariance_trace(self) -> float:
        """How far one answer may still move the model (the RLS covariance's trace)."""
        return sum(self._p[i][i] for i in range(len(self._p)))

    def predict(self, x: tuple[float, ...]) -> float:
        t = self.theta
        return t[0] * x[0] + t[1] * x[1] + t[2] * x[2] + t[3] * x[3]

    def learn(self, x: tuple[float, ...], observed: float) -> None:
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
        px = [sum(p[i][j] * x[j] for j in range(n)) for i in range(n)]
        denominator = lam / weight + sum(x[i] * px[i] for i in range(n))
        gain = [v / denominator for v in px]
        theta = self.theta
        for i in range(n):
            theta[i] = max(0.0, theta[i] + gain[i] * residual)  # more work never costs less
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
            self.residual_scale = 0.95 * scale + 0.05 * abs(residual)
        else:
            self.residual_scale = 1.05 * scale
        self.observations += 1


@dataclass(slots=True)
class _PodWork:
    """What this gateway has outstanding on one pod."""

    model: TtftModel
    prefill_tokens: float = 0.0
    prefilling: int = 0
    decoding: int = 0
    answered_at: float = -math.inf
    """When its last streamed first byte was observed."""
    seen_at: float = -math.inf
    """When this model first heard of the pod (a pod just seen is not stale: it is predicted
    with the fleet's model until it answers)."""
    mean_tokens: float = 0.0
    """Running mean of uncached tokens per request routed here (sizes other replicas' queue)."""
    activity: float = 0.0
    """Requests routed here, each decaying with `activity_window_s` (as of `activity_at`)."""
    activity_at: float = 0.0
    at_scrape: tuple[float | None, int, int] = (None, 0, 0)
    """(scrape time, our prefilling, our decoding) when that scrape's answer arrived."""
    unobserved: list[tuple[float, int, Ticket]] = field(default_factory=list)
    """Heap of (expected first byte, id, ticket) for answers whose first byte is not their
    TTFT (non-streamed): their prefill is taken as done at the predicted time."""


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


class CostModel:
    """Outstanding work and TTFT models for every pod; one per gateway, on the event loop."""

    def __init__(
        self, params: CostParams | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.params = params or CostParams()
        self._clock = clock or time.perf_counter
        self._pods: dict[str, _PodWork] = {}
        self.fleet = TtftModel(self.params)
        self._tickets = 0

    # -- decisions ------------------------------------------------------------------------

    def predict(
        self,
        pod: str,
        prompt_tokens: int,
        cached_tokens: float,
        scraped_at: float | None = None,
        running: float = 0.0,
        waiting: float = 0.0,
        *,
        now: float | None = None,
    ) -> Prediction:
        """Predicted TTFT of a new request on `pod` given how much of its prompt the pod
        holds (`cached_tokens`, already weighted by tier load cost), and the engine's own
        running and waiting counts at its last scrape (every gateway replica's requests).
        `now`: the decision's time, when it predicts many pods at once."""
        candidate = (pod, cached_tokens, scraped_at, running, waiting)
        return self.predict_many([candidate], prompt_tokens, now=now)[0]

    def predict_many(
        self,
        candidates: Sequence[tuple[str, float, float | None, float, float]],
        prompt_tokens: int,
        *,
        now: float | None = None,
    ) -> list[Prediction]:
        """`predict` for each (pod, cached tokens, scraped at, running, waiting): one
        decision's candidates in one loop (a decision predicts every pod of the model)."""
        if now is None:
            now = self._clock()
        pods, work_for = self._pods, self._work
        fleet_theta = self.fleet.coefficients
        make = tuple.__new__  # Prediction(...) runs namedtuple's Python-level __new__
        predictions: list[Prediction] = []
        append = predictions.append
        for pod, cached_tokens, scraped_at, running, waiting in candidates:
            work = pods.get(pod) or work_for(pod)
            if work.unobserved:
                self._expire(work, now)
            queued = work.prefill_tokens
            prefilling = work.prefilling
            queued_requests = float(prefilling)
            decoding = float(work.decoding)
            if scraped_at is not None:
                at_scrape = work.at_scrape
                if at_scrape[0] != scraped_at:  # not noted by the scraper: first sight
                    at_scrape = work.at_scrape = (scraped_at, prefilling, work.decoding)
                ours_prefilling = at_scrape[1]
                # The engine counts every replica's requests; ours in prefill may be running
                # or waiting there, so only what exceeds all of ours is another replica's.
                others = running + waiting - ours_prefilling - at_scrape[2]
                if others > 0.0 and others != math.inf:  # (NaN fails the first test)
                    others_waiting = waiting - ours_prefilling
                    if others_waiting > others:
                        others_waiting = others
                    elif others_waiting < 0.0:
                        others_waiting = 0.0
                    queued += others_waiting * work.mean_tokens
                    queued_requests += others_waiting
                    decoding += others - others_waiting
            own = prompt_tokens - cached_tokens
            if own < 0.0:
                own = 0.0
            model = work.model
            theta = model.coefficients if model.observations else fleet_theta
            ttft = (
                theta[0]
                + theta[1] * (own + queued) / _TOKEN_UNIT
                + theta[2] * queued_requests / _SEQ_UNIT
                + theta[3] * decoding / _SEQ_UNIT
            )
            append(make(Prediction, (pod, ttft, own, queued, queued_requests, decoding, theta)))
        return predictions

    def export(self) -> dict[str, Any]:
        """The learned models, the fleet's and each answered pod's (`/admin/cost-model`),
        for a new replica to start from (`KVGATE_BOOTSTRAP_PEER`)."""
        return {
            "version": _EXPORT_VERSION,
            "fleet": self.fleet.state(),
            "pods": {
                name: work.model.state()
                for name, work in self._pods.items()
                if work.model.observations
            },
        }

    def adopt(self, exported: Any) -> int:
        """Start from another gateway's `export()`: the fleet's model, and each pod's for
        the pods this one has not learned yet; returns how many models were taken."""
        if not isinstance(exported, dict) or exported.get("version") != _EXPORT_VERSION:
            return 0
        pods = exported.get("pods")
        taken = int(not self.fleet.observations and self.fleet.adopt(exported.get("fleet")))
        if isinstance(pods, dict):
            for name, state in list(pods.items())[:_MAX_PODS]:
                if not isinstance(name, str) or not 0 < len(name) <= 512:
                    continue
                model = self._work(name).model
                if not model.observations and model.adopt(state):
                    taken += 1
        return taken

    def now(self) -> float:
        """The model's clock."""
        return self._clock()

    def cached_tokens(self, gpu: int, cpu: int, storage: int, expected: int, block: int) -> float:
        """Tokens a pod need not prefill, from its matched blocks per tier."""
        params = self.params
        return block * (
            gpu
            + expected
            + cpu * (1.0 - params.cpu_load_fraction)
            + storage * (1.0 - params.storage_load_fraction)
        )

    def note_scrape(self, pod: str, at: float) -> None:
        """The engine's counts scraped at `at` include ours as they are now: note them, so
        that only what exceeds them is taken for other replicas' work."""
        work = self._pods.get(pod)
        if work is not None:
            if work.unobserved:
                self._expire(work, self._clock())
            work.at_scrape = (at, work.prefilling, work.decoding)

    # -- a request's life -----------------------------------------------------------------

    def start(self, prediction: Prediction, *, streamed: bool, learn: bool = True) -> Ticket:
        """The request goes to `prediction.pod` now: its prefill joins that pod's queue.
        `learn`: its observed TTFT may train the pod's model (its features were known)."""
        work = self._work(prediction.pod)
        now = self._clock()
        self._tickets += 1
        ticket = Ticket(prediction.pod, prediction, now, streamed, learn, number=self._tickets)
        work.activity = self._decayed_activity(work, now) + 1.0
        work.activity_at = now
        work.prefill_tokens += prediction.own_tokens
        work.prefilling += 1
        work.mean_tokens += (prediction.own_tokens - work.mean_tokens) * 0.05
        if not streamed:
            expected = ticket.started + prediction.ttft_s
            heapq.heappush(work.unobserved, (expected, ticket.number, ticket))
        return ticket

    def start_remote(self, pod: str, own_tokens: float) -> Ticket:
        """Another replica sent a request with `own_tokens` uncached tokens to `pod`: its
        prefill queues there like ours (until that replica reports its first byte)."""
        coefficients = self.coefficients(pod)
        prediction = Prediction(pod, 0.0, own_tokens, 0.0, 0.0, 0.0, coefficients)
        ticket = self.start(prediction, streamed=True, learn=False)
        ticket.remote = True
        return ticket

    def first_byte(self, ticket: Ticket) -> float | None:
        """The pod answered: its prefill is done. Returns the observed TTFT (s) when it is
        one (a streamed answer), after learning from it (when its features were known)."""
        if ticket.phase != "prefill":
            return None
        work = self._pods.get(ticket.pod)
        self._leave_prefill(ticket, work)
        ticket.phase = "decode"
        if work is not None:
            work.decoding += 1
        if not ticket.streamed:
            return None
        now = self._clock()
        observed = now - ticket.started
        if ticket.remote:
            return None
        if work is not None:
            work.answered_at = now
        if ticket.learn:
            x = ticket.prediction.features()
            if work is not None:
                if not work.model.observations:
                    work.model.theta = list(self.fleet.theta)
                    work.model.coefficients = self.fleet.coefficients
                work.model.learn(x, observed)
            self.fleet.learn(x, observed)
        return observed

    def finish(self, ticket: Ticket) -> None:
        """The exchange ended (answered, failed, cut or abandoned)."""
        work = self._pods.get(ticket.pod)
        if ticket.phase == "prefill":
            self._leave_prefill(ticket, work)
        elif ticket.phase == "decode" and work is not None:
            work.decoding -= 1
        ticket.phase = "done"

    # -- pods -----------------------------------------------------------------------------

    def forget(self, live: Iterable[str]) -> None:
        """Drop pods that are gone (called with the registry's pods)."""
        keep = set(live)
        for name in [name for name in self._pods if name not in keep]:
            del self._pods[name]

    def stale(self, pod: str) -> bool:
        """Idle and without an answer for a while: the picker may have stopped choosing it
        on one unlucky early answer, and only a new answer can correct its model."""
        work = self._pods.get(pod)
        if work is None or work.prefilling or work.decoding:
            return False
        return self._clock() - max(work.answered_at, work.seen_at) > _STALE_S

    def activity(self, pod: str) -> float:
        """Requests routed to `pod` lately (decayed): how much of the traffic it carries,
        beyond what is in flight at this instant — a conversation's turns come in bursts."""
        work = self._pods.get(pod)
        return 0.0 if work is None else self._decayed_activity(work, self._clock())

    def _decayed_activity(self, work: _PodWork, now: float) -> float:
        if not work.activity:
            return 0.0
        return work.activity * math.exp(-(now - work.activity_at) / self.params.activity_window_s)

    def model(self, pod: str) -> TtftModel:
        return self._work(pod).model

    def coefficients(self, pod: str) -> tuple[float, ...]:
        """The pod's learned coefficients (the fleet's for a pod not routed to yet)."""
        work = self._pods.get(pod)
        answered = work is not None and work.model.observations
        return (work.model if answered and work is not None else self.fleet).coefficients

    def outstanding(self, pod: str) -> tuple[float, int, int]:
        """(queued prefill tokens, requests prefilling, requests decoding) of ours on `pod`."""
        work = self._pods.get(pod)
        if work is None:
            return (0.0, 0, 0)
        if work.unobserved:
            self._expire(work, self._clock())
        return (work.prefill_tokens, work.prefilling, work.decoding)

    def _work(self, pod: str) -> _PodWork:
        work = self._pods.get(pod)
        if work is None:
            if len(self._pods) >= _MAX_PODS:  # pods come and go: stay bounded
                self._pods.clear()
            work = self._pods[pod] = _PodWork(
                TtftModel(self.params, self.fleet.theta), seen_at=self._clock()
            )
        return work

    def _leave_prefill(self, ticket: Ticket, work: _PodWork | None) -> None:
        if work is None:
            return
        work.prefill_tokens = max(0.0, work.prefill_tokens - ticket.prediction.own_tokens)
        work.prefilling = max(0, work.prefilling - 1)
        if work.prefilling == 0:
            work.prefill_tokens = 0.0  # no float drift when the queue drains

    def _expire(self, work: _PodWork, now: float) -> None:
        heap = work.unobserved
        while heap and heap[0][0] <= now:
            _, _, ticket = heapq.heappop(heap)
            if ticket.phase == "prefill":
                self._leave_prefill(ticket, work)
                ticket.phase = "decode"
                work.decoding += 1
