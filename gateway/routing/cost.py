"""What a request costs on each pod: predicted time to first byte.

An engine runs in steps: each step prefills the requests it admitted at its start (first
come, first served) and decodes one token for every running sequence; a request's first
token leaves at the end of the step that prefilled it. So a new request's TTFT is the rest
of the step running now (if the engine is busy) plus the step that will take it, and it is
modelled as linear in seven features, all known at decision time:

    ttft ≈ speed · (θ0 + θ1·(own uncached tokens + prefill tokens pending)
                    + θ2·(requests pending) + θ3·(sequences decoding) + θ4·busy
                    + θ6·(tokens in the current step))
           + θ5·(time left in the current step)

- own uncached tokens: the prompt minus the blocks the pod holds from the start (GPU
  blocks free, CPU and STORAGE blocks at a fraction of a token's prefill: their load cost);
- pending: every request this gateway sent to the pod since its current step began and
  whose first byte has not come back (it waits for the next step, as this one will), with
  its uncached tokens at its decision time; plus what other gateway replicas have queued
  there, estimated from the engine's scraped `waiting` gauge beyond our own count at that
  scrape, at this pod's mean uncached tokens per request;
- decoding: our requests past their first byte, plus the engine's `running` beyond ours;
  busy: 1 when anything runs or waits there (the next step then decodes a batch too);
- the current step: its start is seen, not guessed — every chunk the gateway relays from
  a pod leaves at the end of one of its steps, so the first chunk after a quiet spell is a
  step boundary (`pulse`). Its length is the pod's pure decode step (the shortest of its
  recent steps that prefilled none of ours) plus the prefill of the requests it admitted
  (ours sent before it began),
  at the model's own rates; what is left of it is waited out before anything new starts.
  Requests admitted in it also count as tokens in the step (θ6): their prefill can run on
  when the estimate of its length falls short.

θ is the fleet's (one shape, learned from every pod's streamed first bytes: TTFT observed
at the gateway) and `speed` is the pod's own factor (`ttft_model.py`): a mixed pool is
modelled pod by pod from its first answers. Until its first answer a pod runs at the
fleet's typical speed as it is now. Updates are robust (Huber-weighted residuals), weighted
in relative terms, coefficients stay non-negative (more work never predicts less time), and
the state is fixed-size: memory per pod is bounded, whatever the traffic.

The new request's work is added to its pod when it is routed, so the next decision of a
burst already sees it: a burst spreads as soon as queueing costs more than the cache saves.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, Protocol

from gateway.routing.cost_state import EXPORT_VERSION, MAX_PODS, check_export
from gateway.routing.kernels import SEQ_UNIT as _SEQ_UNIT
from gateway.routing.kernels import TOKEN_UNIT as _TOKEN_UNIT
from gateway.routing.kernels import affine_costs, affine_order, arrivals, delays, pod_estimate
from gateway.routing.tpot import TpotModel, TpotPrediction
from gateway.routing.ttft_model import FEATURES, STEP_TERM, CostParams, PodSpeed, TtftModel

__all__ = ["FEATURES", "CostModel", "CostParams", "Prediction", "Ticket"]

_STALE_S = 10.0
"""An idle pod with no answer for this long is `stale`: the picker probes it now and then."""
_STEP_GAP_S = 0.002
"""Chunks closer than this (or a quarter of the pod's decode step) belong to one step."""
_MAX_STEP_S = 5.0
"""A gap between step boundaries longer than this was idle time, not a step."""
_STEP_HISTORY = 8
"""Recent steps whose shortest is the pod's pure decode step."""
_MAX_RANKINGS = 64
"""Candidate lists whose estimates are kept (one per model and set of routable pods)."""
_MAX_CHANGES = 4096
"""Pod changes logged before the rankings are rebuilt from scratch (once)."""
_FRESH_THETA_ANSWERS = 200
"""Until the model has learned from this many answers, every decision uses its latest θ."""
_THETA_REFRESH_S = 0.05
"""Afterwards decisions take a new θ at most this often (it moves a little per answer)."""


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
            (self.own_tokens + self.queued_tokens) / _TOKEN_UNIT,
            self.queued_requests / _SEQ_UNIT,
            self.decoding / _SEQ_UNIT,
            self.busy,
            self.step_remaining_s / self.speed,
            self.in_step_tokens / _TOKEN_UNIT,
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
        return _pod_coefficients(self.coefficients, self.speed)

    def delay_to_queued_s(self) -> float:
        """What this request adds to the TTFTs of the requests queued on the pod for its
        next step (`kernels.delays`): its own prefill, once for each of them."""
        return self.queued_requests * self.own_prefill_s()

    def own_prefill_s(self) -> float:
        """The predicted time of this request's own prefill on the pod."""
        return self.speed * self.coefficients[1] * self.own_tokens / _TOKEN_UNIT


def _pod_coefficients(theta: tuple[float, ...], speed: float) -> tuple[float, ...]:
    return tuple(c if i == STEP_TERM else c * speed for i, c in enumerate(theta))


class _Estimate(NamedTuple):
    """A pod's TTFT for any prompt, as of its work `version`, the decisions' θ and its last
    scrape: `base_s + unit_s · own tokens + θ5 · max(0, step_end − now)` (a tuple: one is
    made whenever a pod's work changes, on every step boundary of every busy pod)."""

    version: int
    theta_version: int
    scraped_at: float | None
    base_s: float
    unit_s: float
    step_end: float
    pending: float
    pending_requests: float
    decoding: float
    busy: float
    in_step: float
    speed: float


class _Ranking:
    """One candidate list's estimate terms, in its order: what `rank_costs` multiplies out.
    Valid for the θ and the scrapes it was built with, and for the pods' work up to
    `position` in the model's change log of `epoch`."""

    __slots__ = ("active_at", "bases", "bounds", "ends", "epoch", "index", "pods", "position",
                 "scraped", "theta_version", "units", "waits")  # fmt: skip

    def __init__(
        self,
        pods: tuple[ScrapedPod, ...],
        scraped: list[float | None],
        estimates: list[_Estimate],
        works: list[_PodWork],
        epoch: int,
        theta_version: int,
        position: int,
    ) -> None:
        self.pods = pods
        self.scraped = scraped
        self.index = {pod.name: at for at, pod in enumerate(pods)}
        self.bases = [e.base_s for e in estimates]
        self.units = [e.unit_s for e in estimates]
        self.ends = [e.step_end for e in estimates]
        self.waits = [e.pending_requests for e in estimates]
        """Requests waiting there for the next step (a new request would join them)."""
        self.bounds = [work.bound for work in works]
        self.active_at = [work.activity_at for work in works]
        """When each pod's bound activity was last set (it decays from then)."""
        self.epoch = epoch
        self.theta_version = theta_version
        self.position = position


@dataclass(slots=True)
class _PodWork:
    """What this gateway has outstanding on one pod, and what it has seen of its steps."""

    name: str
    speed: PodSpeed | None = None
    """Its own speed, from its first answer on (before: the fleet's typical speed)."""
    prefill_tokens: float = 0.0
    prefilling: int = 0
    in_step_tokens: float = 0.0
    in_step_requests: int = 0
    """Of `prefill_tokens` / `prefilling`: sent before the current step began (admitted in
    it, or still waiting behind it)."""
    decoding: int = 0
    answered_at: float = -math.inf
    """When its last streamed first byte was observed."""
    seen_at: float = -math.inf
    """When this model first heard of the pod (a pod just seen is not stale: it is predicted
    with the fleet's model until it answers)."""
    last_chunk: float = -math.inf
    step_start: float = -math.inf
    """When its current step began: the first chunk after a quiet spell (the end of the
    last), or a request sent to it while idle."""
    steps: int = 0
    """Steps begun so far: a request sent before the current one began is in it."""
    step_seeded: bool = False
    """The current step was begun by a request sent while idle, not seen in chunks: its
    length is that prefill's, not a decode step's."""
    step_lengths: list[float] = field(default_factory=list)
    decode_step_s: float = 0.0
    """The shortest of its recent decode steps: its pure decode step at about the current
    batch."""
    sampled_step: int = -1
    """The step whose begin recorded the last of `step_lengths` (the length of the step
    before it), until a first byte at that boundary shows the step before prefilled."""
    mean_tokens: float = 0.0
    """Running mean of uncached tokens per request routed here (sizes other replicas' queue)."""
    activity: float = 0.0
    """Requests routed here, each decaying with `activity_window_s` (as of `activity_at`)."""
    bound: float = 0.0
    """Of `activity`: each request weighted by the share of its prompt the pod held — the
    traffic its cache binds to it (decaying likewise, as of `activity_at`)."""
    busy_s: float = 0.0
    """The predicted prefill seconds of the requests routed here (decaying likewise)."""
    activity_at: float = 0.0
    at_scrape: tuple[float | None, int, int] = (None, 0, 0)
    """(scrape time, our prefilling, our decoding) when that scrape's answer arrived."""
    unobserved: list[tuple[float, int, Ticket]] = field(default_factory=list)
    """Heap of (expected first byte, id, ticket) for answers whose first byte is not their
    TTFT (non-streamed): their prefill is taken as done at the predicted time."""
    version: int = 0
    """Bumped whenever anything above changes (`CostModel._changed`: it invalidates
    `estimate`)."""
    estimate: _Estimate | None = None


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


class CostModel:
    """Outstanding work, step timing and the TTFT model for every pod; one per gateway, on
    the event loop."""

    def __init__(
        self,
        params: CostParams | None = None,
        *,
        clock: Callable[[], float] | None = None,
    ) -> None:
        self.params = params or CostParams()
        self._clock = clock or time.perf_counter
        self._pods: dict[str, _PodWork] = {}
        self.fleet = TtftModel(self.params)
        self.tpot = TpotModel(self.params)
        """Time per output token: the fleet's shape and each pod's decode speed."""
        self._log_speeds = 0.0
        """Sum of the answered pods' log-speeds (their mean is a new pod's speed)."""
        self._answered = 0
        self._tickets = 0
        self._theta = self.fleet.coefficients
        """θ as decisions use it (`_refresh_theta`), with the typical speed of that moment."""
        self._typical_speed = 1.0
        self._theta_observations = 0
        self._theta_at = -math.inf
        self._theta_version = 0
        self._changes: list[_PodWork] = []
        """Pods whose work changed, in order, since the rankings' `epoch` began."""
        self._epoch = 0
        self._rankings: dict[tuple[str, ...], _Ranking] = {}
        self._due: list[tuple[float, int, _PodWork]] = []
        """Heap of (predicted first byte, ticket number, pod) of non-streamed answers."""

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

    def predict_tpot(self, prediction: Prediction) -> TpotPrediction:
        """The predicted time per output token of the request `prediction` is for: it will
        decode with the sequences decoding there now and those ahead of it in prefill."""
        pod = prediction.pod
        work = self._pods.get(pod)
        arrivals = tokens = 0.0
        if work is not None:  # `arrival_rate` without looking the pod up again
            window = self.params.activity_window_s
            arrivals = self._decayed_activity(work, self._clock()) / window
            tokens = arrivals * work.mean_tokens
        sequences = prediction.decoding + prediction.queued_requests + 1.0
        return self.tpot.predict(pod, sequences, tokens, arrivals)

    def stream_ended(self, ticket: Ticket, completion_tokens: int) -> float | None:
        """A streamed answer ended whole with `completion_tokens`: learn its observed time
        per output token (after the first), and return it (None when there is none: not
        streamed, no first byte, fewer than two tokens)."""
        prediction = ticket.tpot
        if prediction is None or completion_tokens < 2 or math.isnan(ticket.answered_at):
            return None
        observed = (self._clock() - ticket.answered_at) / (completion_tokens - 1)
        self.tpot.learn(prediction, observed)  # its features do not depend on the prompt
        return observed

    def work_of(self, cached: Sequence[float], prompt_tokens: float) -> tuple[list[float], float]:
        """The candidates' cached tokens and the prompt in prefill work, T + share · T²
        (`CostParams.context_share`: each token's attention over the tokens before it):
        the prompt's less a pod's is what the pod computes, N + share · ((C + N)² − C²)
        for C cached and N new. Unchanged when the context is free."""
        share = self.params.context_share
        if not share:
            return list(cached), prompt_tokens
        prompt = prompt_tokens + share * prompt_tokens * prompt_tokens
        return [c + share * c * c for c in cached], prompt

    def predict_many(
        self,
        candidates: Sequence[tuple[str, float, float | None, float, float]],
        prompt_tokens: int,
        *,
        now: float | None = None,
    ) -> list[Prediction]:
        """`predict` for each (pod, cached tokens, scraped at, running, waiting): one
        decision's candidates in one loop (a decision predicts every pod of the model)."""
        now = self._clock() if now is None else now
        estimates = self._estimates([(c[0], c[2], c[3], c[4]) for c in candidates], now)
        theta = self._theta
        t5 = theta[STEP_TERM]
        make = tuple.__new__  # Prediction(...) runs namedtuple's Python-level __new__
        predictions: list[Prediction] = []
        held, prompt = self.work_of([c[1] for c in candidates], prompt_tokens)
        for (pod, *_), cached_tokens, e in zip(candidates, held, estimates, strict=True):
            own = prompt - cached_tokens
            if own < 0.0:
                own = 0.0
            remaining = e.step_end - now
            if remaining < 0.0:
                remaining = 0.0
            values = (pod, e.base_s + e.unit_s * own + t5 * remaining, own, e.pending,
                      e.pending_requests, e.decoding, theta, e.busy, remaining, e.in_step,
                      e.speed)  # fmt: skip
            predictions.append(make(Prediction, values))
        return predictions

    def rank_costs(
        self,
        pods: Sequence[ScrapedPod],
        cached: Sequence[float],
        prompt_tokens: int,
        names: Sequence[str] | None = None,
    ) -> tuple[list[float], list[float]]:
        """Each pod's predicted TTFT and, within it, this request's own prefill (s), in the
        order of `pods` (`cached`: the tokens each holds; `names`: the pods' names, when
        the caller has them): what a picker ranks by, without a `Prediction` per pod (the
        chosen pod's is made when the request is dispatched)."""
        ranking, now = self._current_ranking(pods, names)
        held, prompt = self.work_of(cached, prompt_tokens)
        return affine_costs(
            ranking.bases, ranking.units, ranking.ends, held, prompt, self._theta[STEP_TERM],
            now,
        )  # fmt: skip

    def rank_delays(
        self, pods: Sequence[ScrapedPod], names: Sequence[str] | None, prefills: list[float]
    ) -> list[float]:
        """Per pod (in the order of `pods`), what a request whose own prefill there is
        `prefills[i]` adds to the TTFTs of the requests waiting there for the next step
        (`kernels.delays`)."""
        return delays(prefills, self._current_ranking(pods, names)[0].waits)

    def rank_order(
        self,
        pods: Sequence[ScrapedPod],
        cached: list[float],
        prompt_tokens: int,
        names: Sequence[str] | None,
        tolerance: float,
        delay_weight: float = 0.0,
        arrival_weight: float = 0.0,
        prefill_weight: float = 0.0,
    ) -> tuple[list[int], int, int]:
        """`rank_costs`' TTFTs, each charged `prefill_weight` times its own prefill,
        `delay_weight` times `rank_delays` and `arrival_weight` times `rank_arrivals`,
        ranked in one pass (`kernels.affine_order`):
        (the pods' indices, fastest first but those within `tolerance` of the fastest by
        cached tokens; how many are within it; how many of those hold as much as the
        first)."""
        ranking, now = self._current_ranking(pods, names)
        rates = self._rates(ranking, now) if arrival_weight else []
        held, prompt = self.work_of(cached, prompt_tokens)
        return affine_order(
            ranking.bases, ranking.units, ranking.ends, held, prompt,
            self._theta[STEP_TERM], now, tolerance, ranking.waits, delay_weight, rates,
            arrival_weight, prefill_weight,
        )  # fmt: skip

    def rank_arrivals(
        self, pods: Sequence[ScrapedPod], names: Sequence[str] | None, prefills: list[float]
    ) -> list[float]:
        """Per pod (in the order of `pods`), the requests its cache binds to it that reach
        it while a prefill of `prefills[i]` runs there, times that prefill
        (`kernels.arrivals`): half of it is the time they wait out between them."""
        ranking, now = self._current_ranking(pods, names)
        return arrivals(prefills, self._rates(ranking, now))

    def _rates(self, ranking: _Ranking, now: float) -> list[float]:
        """Each candidate's `bound_rate` as of `now`, from the ranking's terms."""
        window = self.params.activity_window_s
        return [
            _decayed(bound, now - at, window) / window
            for bound, at in zip(ranking.bounds, ranking.active_at, strict=True)
        ]

    def _current_ranking(
        self, pods: Sequence[ScrapedPod], names: Sequence[str] | None
    ) -> tuple[_Ranking, float]:
        """The candidates' estimate terms as of now.

        It runs per decision over every candidate, so it reads them from a `_Ranking` kept
        per candidate list, which re-estimates only the pods whose work changed since the
        last decision (`_changed`)."""
        now = self._clock()
        self._theta_for(now)
        self._expire_due(now)
        key = tuple(pod.name for pod in pods) if names is None else tuple(names)
        ranking = self._rankings.get(key)
        scraped = [pod.scraped_at for pod in pods]
        if (
            ranking is None
            or ranking.epoch != self._epoch
            or ranking.theta_version != self._theta_version
            or ranking.scraped != scraped
            or (ranking.pods is not pods and ranking.pods != tuple(pods))
        ):
            # kept as a tuple: the registry's cached candidates are one, compared by identity
            ranking = self._ranking(key, tuple(pods), scraped, now)
        elif ranking.position < len(self._changes):
            self._refresh(ranking, pods)
        return ranking, now

    def _refresh(self, ranking: _Ranking, pods: Sequence[ScrapedPod]) -> None:
        """`ranking`'s terms of the pods whose work changed since it was last refreshed."""
        changes = self._changes
        index, works, work_for = ranking.index, self._pods, self._work
        bases, units, ends, waits = ranking.bases, ranking.units, ranking.ends, ranking.waits
        bounds, active_at = ranking.bounds, ranking.active_at
        current = self._current_estimate
        for changed in changes[ranking.position :]:
            name = changed.name
            at = index.get(name)
            if at is None:
                continue
            pod = pods[at]
            work = works.get(name) or work_for(name)
            e = current(work, pod.scraped_at, pod.running, pod.waiting)
            # (the fields by index: a NamedTuple's names are Python properties)
            bases[at], units[at], ends[at], waits[at] = e[3], e[4], e[5], e[7]
            bounds[at] = work.bound
            active_at[at] = work.activity_at
        ranking.position = len(changes)

    def _ranking(
        self,
        key: tuple[str, ...],
        pods: tuple[ScrapedPod, ...],
        scraped: list[float | None],
        now: float,
    ) -> _Ranking:
        if len(self._rankings) >= _MAX_RANKINGS:  # candidate lists are few; stay bounded
            self._rankings.clear()
        candidates = [
            (name, pod.scraped_at, pod.running, pod.waiting)
            for name, pod in zip(key, pods, strict=True)
        ]
        estimates = self._estimates(candidates, now)
        works = [self._pods.get(name) or self._work(name) for name in key]
        ranking = self._rankings[key] = _Ranking(
            pods, scraped, estimates, works, self._epoch, self._theta_version,
            len(self._changes),
        )  # fmt: skip
        return ranking

    def _changed(self, work: _PodWork) -> None:
        """Anything `_current_estimate` reads of `work` changed."""
        work.version += 1
        changes = self._changes
        if len(changes) >= _MAX_CHANGES:  # bounded, whether or not anything ranks
            changes.clear()
            self._epoch += 1  # every ranking is rebuilt once
        changes.append(work)

    def _expire_due(self, now: float) -> None:
        """Non-streamed answers whose predicted first byte is past: their prefill is done."""
        due = self._due
        while due and due[0][0] <= now:
            work = heapq.heappop(due)[2]
            if self._pods.get(work.name) is work:
                self._expire(work, now)

    def _estimates(
        self, pods: Iterable[tuple[str, float | None, float, float]], now: float
    ) -> list[_Estimate]:
        """Each (pod, scraped at, running, waiting)'s estimate as of `now`: what does not
        depend on the request is kept per pod until the pod's work, its scrape or the
        decisions' θ changes, so a decision mostly costs a multiply-add per pod."""
        self._theta_for(now)
        self._expire_due(now)
        works, work_for, current = self._pods, self._work, self._current_estimate
        return [
            current(works.get(name) or work_for(name), scraped_at, running, waiting)
            for name, scraped_at, running, waiting in pods
        ]

    def _theta_for(self, now: float) -> None:
        """Takes the fleet's latest θ for the decisions of `now` when it is due."""
        fleet = self.fleet
        if fleet.observations != self._theta_observations and (
            fleet.observations < _FRESH_THETA_ANSWERS or now - self._theta_at >= _THETA_REFRESH_S
        ):
            self._refresh_theta(now)

    def _refresh_theta(self, now: float) -> None:
        """Decisions use θ as of their last refresh: every answer moves it a little, and
        refreshing at most every `_THETA_REFRESH_S` (once it has settled) keeps the pods'
        estimates valid across a burst of decisions."""
        self._theta = self.fleet.coefficients
        self._typical_speed = self.typical_speed()
        self._theta_observations = self.fleet.observations
        self._theta_at = now
        self._theta_version += 1

    def _current_estimate(
        self, work: _PodWork, scraped_at: float | None, running: float, waiting: float
    ) -> _Estimate:
        """What the pod's TTFT is made of, whatever the request's prompt: the estimate kept
        on its work while its work, its scrape and the decisions' θ are those it was made
        with (a pod changed twice, or estimated by another decision since, is not estimated
        again), else a new one (`kernels.pod_estimate`)."""
        e = work.estimate
        version = self._theta_version
        if e is None or e[0] != work.version or e[1] != version or e[2] != scraped_at:
            e = pod_estimate(work, self._theta, self._typical_speed, version, scraped_at,
                             running, waiting, _Estimate)  # fmt: skip
        return e

    def typical_speed(self) -> float:
        """The answered pods' typical speed (geometric mean): a new pod's until it answers."""
        return math.exp(self._log_speeds / self._answered) if self._answered else 1.0

    def export(self) -> dict[str, Any]:
        """The learned model and each answered pod's speed (`/admin/cost-model`), for a new
        replica to start from (`KVGATE_BOOTSTRAP_PEER`)."""
        return {
            "version": EXPORT_VERSION,
            "fleet": self.fleet.state(),
            "speeds": {
                name: {"log": work.speed.log, "observations": work.speed.observations}
                for name, work in self._pods.items()
                if work.speed is not None
            },
        }

    def adopt(self, exported: Any) -> int:
        """Start from another gateway's `export()` (parsed JSON): the fleet's model (unless
        this one has learned its own), and the speed of each pod this one has not heard
        from yet; returns how many were taken. A peer's answer is checked, never trusted:
        anything malformed or out of range raises `CostStateError` and nothing is taken."""
        checked = check_export(exported, features=len(FEATURES), max_trace=self.fleet.max_trace)
        taken = 0
        if not self.fleet.observations:
            self.fleet.adopt(checked.fleet)
            taken += 1
        for name, (log, observations) in checked.speeds.items():
            work = self._work(name)
            if work.speed is None:
                self._set_speed(work, PodSpeed(log, observations))
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
            self._changed(work)

    def pulse(self, pod: str) -> None:
        """A chunk of `pod`'s answer (any answer) arrived now: one of its steps just ended.
        The first chunk after a quiet spell starts the next step: every request sent before
        it and not answered yet was admitted in it or waits behind it."""
        work = self._pods.get(pod)
        if work is None:
            return
        now = self._clock()
        quiet = 0.25 * work.decode_step_s
        if now - work.last_chunk > (quiet if quiet > _STEP_GAP_S else _STEP_GAP_S):
            length = now - work.step_start
            sampled = length < _MAX_STEP_S and not work.step_seeded
            if sampled:
                lengths = work.step_lengths
                lengths.append(length)
                if len(lengths) > _STEP_HISTORY:
                    del lengths[0]
                work.decode_step_s = min(lengths)
            self._begin_step(work, now, seeded=False)
            work.sampled_step = work.steps if sampled else -1
        work.last_chunk = now

    def _unsample_prefill_step(self, work: _PodWork) -> None:
        """A request sent before the current step began got its first byte at its boundary
        (the burst of chunks that began it): the step before prefilled it, so its length
        is no decode step. Without this, on a pod that admits a prompt at almost every step
        (unique prompts at high load) the shortest of the recent "decode" steps became a
        prefill step of 100-250 ms: every prediction there waited out a step that had
        ended long before, and chunks 20 ms apart no longer told steps apart."""
        work.step_lengths.pop()
        work.decode_step_s = min(work.step_lengths, default=0.0)
        work.sampled_step = -1

    def _begin_step(self, work: _PodWork, now: float, *, seeded: bool) -> None:
        """The pod's next step begins now: every request in prefill is admitted in it or
        waits behind it."""
        work.step_start = now
        work.steps += 1
        work.step_seeded = seeded
        work.in_step_tokens = work.prefill_tokens
        work.in_step_requests = work.prefilling
        self._changed(work)

    # -- a request's life -----------------------------------------------------------------

    def start(
        self,
        prediction: Prediction,
        *,
        streamed: bool,
        learn: bool = True,
        prompt_tokens: float = 0.0,
        fleet_own_tokens: float | None = None,
    ) -> Ticket:
        """The request goes to `prediction.pod` now: its prefill joins that pod's queue.
        `learn`: its observed TTFT may train the model (its features were known);
        `prompt_tokens`: its prompt's, of which the pod held all but `own_tokens`;
        `fleet_own_tokens`: the fewest any pod had to prefill (for `busy`)."""
        work = self._work(prediction.pod)
        now = self._clock()
        self._tickets += 1
        # as a decision predicted it, before this request counts in the pod's traffic
        tpot = self.predict_tpot(prediction) if streamed else None
        ticket = Ticket(prediction.pod, prediction, now, streamed, learn, number=self._tickets,
                        step=work.steps, tpot=tpot)  # fmt: skip
        idle = not work.prefilling and not work.decoding
        decay = _decayed(1.0, now - work.activity_at, self.params.activity_window_s)
        prompt = self.work_of((), prompt_tokens)[1]
        held = 1.0 - prediction.own_tokens / prompt if prompt > prediction.own_tokens else 0.0
        work.activity = work.activity * decay + 1.0
        work.bound = work.bound * decay + held
        own = prediction.own_prefill_s()
        if fleet_own_tokens is not None and prediction.own_tokens > fleet_own_tokens:
            own *= fleet_own_tokens / prediction.own_tokens
        work.busy_s = work.busy_s * decay + own
        work.activity_at = now
        work.prefill_tokens += prediction.own_tokens
        work.prefilling += 1
        work.mean_tokens += (prediction.own_tokens - work.mean_tokens) * 0.05
        if idle:
            # An idle engine begins a step as soon as a request arrives: this prefill is it,
            # and the next request waits for what is left of it, not for all of it.
            self._begin_step(work, now, seeded=True)
        else:
            self._changed(work)
        if not streamed:
            expected = ticket.started + prediction.ttft_s
            heapq.heappush(work.unobserved, (expected, ticket.number, ticket))
            heapq.heappush(self._due, (expected, ticket.number, work))
        return ticket

    def start_remote(self, pod: str, own_tokens: float) -> Ticket:
        """Another replica sent a request with `own_tokens` uncached tokens to `pod`: its
        prefill queues there like ours (until that replica reports its first byte)."""
        prediction = Prediction(pod, 0.0, own_tokens, 0.0, 0.0, 0.0, self.fleet.coefficients)
        ticket = self.start(prediction, streamed=True, learn=False)
        ticket.remote = True
        return ticket

    def first_byte(self, ticket: Ticket) -> float | None:
        """The pod answered: its prefill is done. Returns the observed TTFT (s) when it is
        one (a streamed answer), after learning from it (when its features were known)."""
        if ticket.phase != "prefill":
            return None
        work = self._pods.get(ticket.pod)
        if (
            work is not None
            and ticket.streamed  # an unstreamed answer's first byte is its last token's
            and work.sampled_step == work.steps
            and ticket.step < work.steps
        ):
            self._unsample_prefill_step(work)
        self._leave_prefill(ticket, work)
        ticket.phase = "decode"
        if work is not None:
            work.decoding += 1
            self._changed(work)
        if not ticket.streamed:
            return None
        now = self._clock()
        observed = now - ticket.started
        if ticket.remote:
            return None
        ticket.answered_at = now
        if work is not None:
            work.answered_at = now
        if ticket.learn and observed > 0.0:
            prediction = ticket.prediction
            x = prediction.features()
            speed = prediction.speed
            if work is not None:
                if work.speed is None:
                    self._set_speed(work, PodSpeed(math.log(speed)))
                assert work.speed is not None
                before = work.speed.log
                # The step's remainder is the pod's own measure: not the fleet's to scale.
                scaled = self.fleet.predict(x) - x[STEP_TERM] * self.fleet.theta[STEP_TERM]
                fixed = x[STEP_TERM] * speed * self.fleet.theta[STEP_TERM]
                if observed > fixed:
                    work.speed.learn(observed - fixed, scaled, self.params)
                self._log_speeds += work.speed.log - before
                self._changed(work)
            self.fleet.learn(x, observed / speed)
        return observed

    def finish(self, ticket: Ticket) -> None:
        """The exchange ended (answered, failed, cut or abandoned)."""
        work = self._pods.get(ticket.pod)
        if ticket.phase == "prefill":
            self._leave_prefill(ticket, work)
        elif ticket.phase == "decode" and work is not None:
            work.decoding -= 1
            self._changed(work)
        ticket.phase = "done"

    # -- pods -----------------------------------------------------------------------------

    def forget(self, live: Iterable[str]) -> None:
        """Drop pods that are gone (called with the registry's pods)."""
        keep = set(live)
        for name in [name for name in self._pods if name not in keep]:
            self._drop(name)
        self.tpot.forget(keep)

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

    def arrival_rate(self, pod: str) -> float:
        """Requests routed to `pod` per second lately (`activity` over its window)."""
        return self.activity(pod) / self.params.activity_window_s

    def bound_rate(self, pod: str) -> float:
        """Of `arrival_rate`, the requests bound to `pod` by its cache: each weighted by the
        share of its prompt the pod held. Only those keep coming while a long prefill runs
        there; the others are routed elsewhere at no cost of theirs (what `arrival_weight`
        charges for)."""
        work = self._pods.get(pod)
        if work is None:
            return 0.0
        window = self.params.activity_window_s
        return _decayed(work.bound, self._clock() - work.activity_at, window) / window

    def busy(self, pod: str) -> float:
        """The predicted prefill seconds of the requests routed to `pod` lately (decayed):
        the time its recent traffic costs it, however long each prompt. Each counts as on
        the pod holding most of it: a prefix prefilled there once because it was cold (a
        system prompt, then cached for every conversation placed after it) is no lasting
        load, and counted as one it would keep new conversations on its first holder."""
        work = self._pods.get(pod)
        if work is None:
            return 0.0
        return _decayed(
            work.busy_s, self._clock() - work.activity_at, self.params.activity_window_s
        )

    def _decayed_activity(self, work: _PodWork, now: float) -> float:
        return _decayed(work.activity, now - work.activity_at, self.params.activity_window_s)

    def speed(self, pod: str) -> float:
        """How much slower (> 1) or faster (< 1) than the fleet's model the pod runs."""
        work = self._pods.get(pod)
        return self.typical_speed() if work is None or work.speed is None else work.speed.factor

    def answers(self, pod: str) -> int:
        """Answers the pod's speed was learned from."""
        work = self._pods.get(pod)
        return 0 if work is None or work.speed is None else work.speed.observations

    def coefficients(self, pod: str) -> tuple[float, ...]:
        """θ as it applies to `pod` (its speed folded in; the fleet's typical speed for a
        pod not answered yet)."""
        return _pod_coefficients(self.fleet.coefficients, self.speed(pod))

    def outstanding(self, pod: str) -> tuple[float, int, int]:
        """(queued prefill tokens, requests prefilling, requests decoding) of ours on `pod`."""
        work = self._pods.get(pod)
        if work is None:
            return (0.0, 0, 0)
        if work.unobserved:
            self._expire(work, self._clock())
        return (work.prefill_tokens, work.prefilling, work.decoding)

    def step(self, pod: str) -> tuple[float, float]:
        """(when its current step began, its pure decode step in s) as seen from its chunks."""
        work = self._pods.get(pod)
        return (-math.inf, 0.0) if work is None else (work.step_start, work.decode_step_s)

    def _work(self, pod: str) -> _PodWork:
        work = self._pods.get(pod)
        if work is None:
            if len(self._pods) >= MAX_PODS:  # pods come and go: stay bounded
                for name in list(self._pods):
                    self._drop(name)
            work = self._pods[pod] = _PodWork(pod, seen_at=self._clock())
        return work

    def _set_speed(self, work: _PodWork, speed: PodSpeed) -> None:
        if work.speed is None:
            self._answered += 1
        else:
            self._log_speeds -= work.speed.log
        work.speed = speed
        self._changed(work)
        self._log_speeds += speed.log

    def _drop(self, name: str) -> None:
        work = self._pods.pop(name)
        self._changed(work)  # a ranking that still holds it re-estimates it from scratch
        if work.speed is not None:
            self._log_speeds -= work.speed.log
            self._answered -= 1

    def _leave_prefill(self, ticket: Ticket, work: _PodWork | None) -> None:
        if work is None:
            return
        own = ticket.prediction.own_tokens
        self._changed(work)
        work.prefill_tokens = max(0.0, work.prefill_tokens - own)
        work.prefilling = max(0, work.prefilling - 1)
        if ticket.step < work.steps:  # sent before the current step began: in it
            work.in_step_tokens = max(0.0, work.in_step_tokens - own)
            work.in_step_requests = max(0, work.in_step_requests - 1)
        if work.prefilling == 0:
            work.prefill_tokens = 0.0  # no float drift when the queue drains
            work.in_step_tokens, work.in_step_requests = 0.0, 0

    def _expire(self, work: _PodWork, now: float) -> None:
        heap = work.unobserved
        while heap and heap[0][0] <= now:
            _, _, ticket = heapq.heappop(heap)
            if ticket.phase == "prefill":
                self._leave_prefill(ticket, work)
                ticket.phase = "decode"
                work.decoding += 1
                self._changed(work)


def _decayed(count: float, age_s: float, window_s: float) -> float:
    """A count that decays with time constant `window_s`, `age_s` after it was last set."""
    return count * math.exp(-age_s / window_s) if count else 0.0
