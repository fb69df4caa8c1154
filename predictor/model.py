"""The predictor: what a request costs on each pod, its predicted time to first byte.

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
at the gateway) and `speed` is the pod's own factor (`fleet.py`): a mixed pool is
modelled pod by pod from its first answers. Until its first answer a pod runs at the
fleet's typical speed as it is now. Updates are robust (Huber-weighted residuals), weighted
in relative terms, coefficients stay non-negative (more work never predicts less time), and
the state is fixed-size: memory per pod is bounded, whatever the traffic.

The new request's work is added to its pod when it is routed, so the next decision of a
burst already sees it: a burst spreads as soon as queueing costs more than the cache saves.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from predictor.costs import affine_costs
from predictor.features import FEATURES, STEP_TERM, pod_coefficients
from predictor.fleet import PodSpeed, TtftModel
from predictor.params import CostParams
from predictor.pods import PodBook
from predictor.prediction import Prediction, ScrapedPod, Ticket
from predictor.rankings import Estimates, Ranking
from predictor.state import check_export, export_state
from predictor.tpot import TpotModel, TpotPrediction
from predictor.work import PodWork, decayed

STALE_S = 10.0
"""An idle pod with no answer for this long is `stale`: the picker probes it now and then."""

Candidate = tuple[
    str, float, float | None, float, float
]  # pod, cached, scraped at, running, waiting


class Predictor:
    """Outstanding work, step timing and the TTFT and TPOT models of every pod; one per
    gateway, on the event loop. Pure and synchronous: time comes from `clock`.

    Its interface: a request is recorded where it was sent (`start`, `start_remote`), its
    first byte, the pod's chunks and its end observed (`first_byte`, `pulse`, `finish`,
    `stream_ended`), a pod's terms predicted for a request (`predict_many`, `candidates`),
    and the learned state exported and imported (`export`, `adopt`)."""

    def __init__(
        self, params: CostParams | None = None, *, clock: Callable[[], float] | None = None
    ) -> None:
        self.params = params or CostParams()
        self._clock = clock or time.perf_counter
        self._book = PodBook(self._clock)
        self.fleet = TtftModel(self.params)
        self.tpot = TpotModel(self.params)
        """Time per output token: the fleet's shape and each pod's decode speed."""
        self._estimates = Estimates(self._book, self.fleet)
        self._tickets = 0

    # -- predictions ----------------------------------------------------------------------

    def predict(
        self,
        pod: str,
        prompt_tokens: int,
        cached_tokens: float,
        scraped_at: float | None = None,
        running: float = 0.0,
        waiting: float = 0.0,
    ) -> Prediction:
        """Predicted TTFT of a new request on `pod` given how much of its prompt the pod
        holds (`cached_tokens`, already weighted by tier load cost), and the engine's own
        running and waiting counts at its last scrape (every gateway replica's requests)."""
        candidate = (pod, cached_tokens, scraped_at, running, waiting)
        return self.predict_many([candidate], prompt_tokens)[0]

    def predict_many(self, candidates: Sequence[Candidate], prompt_tokens: int) -> list[Prediction]:
        """`predict` for each candidate: one decision's in one loop."""
        now = self._clock()
        estimates = self._estimates.estimates([(c[0], c[2], c[3], c[4]) for c in candidates], now)
        theta = self._estimates.theta
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

    def predict_tpot(self, prediction: Prediction) -> TpotPrediction:
        """The predicted time per output token of the request `prediction` is for: it will
        decode with the sequences decoding there now and those ahead of it in prefill."""
        pod = prediction.pod
        work = self._book.pods.get(pod)
        arrivals = tokens = 0.0
        if work is not None:  # `arrival_rate` without looking the pod up again
            window = self.params.activity_window_s
            arrivals = decayed(work.activity, self._clock() - work.activity_at, window) / window
            tokens = arrivals * work.mean_tokens
        sequences = prediction.decoding + prediction.queued_requests + 1.0
        return self.tpot.predict(pod, sequences, tokens, arrivals)

    def candidates(
        self, pods: Sequence[ScrapedPod], names: Sequence[str] | None = None
    ) -> tuple[Ranking, float]:
        """The candidates' estimate terms as of now, and now (`names`: the pods' names, when
        the caller has them): what a decision ranks by, without a `Prediction` per pod."""
        now = self._clock()
        return self._estimates.ranking(pods, names, now), now

    @property
    def step_term(self) -> float:
        """θ5 as decisions use it: the weight of the time left in a pod's current step."""
        return self._estimates.step_term

    def rank_costs(
        self, pods: Sequence[ScrapedPod], cached: Sequence[float], prompt_tokens: int
    ) -> tuple[list[float], list[float]]:
        """Each pod's predicted TTFT and, within it, this request's own prefill (s), in the
        order of `pods` (`cached`: the tokens each holds)."""
        ranking, now = self.candidates(pods)
        held, prompt = self.work_of(cached, prompt_tokens)
        return affine_costs(ranking.bases, ranking.units, ranking.ends, held, prompt,
                            self.step_term, now)  # fmt: skip

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

    def cached_tokens(self, gpu: int, cpu: int, storage: int, expected: int, block: int) -> float:
        """Tokens a pod need not prefill, from its matched blocks per tier."""
        params = self.params
        return block * (
            gpu
            + expected
            + cpu * (1.0 - params.cpu_load_fraction)
            + storage * (1.0 - params.storage_load_fraction)
        )

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
        book = self._book
        work = book.work(prediction.pod)
        now = self._clock()
        self._tickets += 1
        # as a decision predicted it, before this request counts in the pod's traffic
        tpot = self.predict_tpot(prediction) if streamed else None
        ticket = Ticket(prediction.pod, prediction, now, streamed, learn, number=self._tickets,
                        step=work.steps, tpot=tpot)  # fmt: skip
        idle = not work.prefilling and not work.decoding
        prompt_work = self.work_of((), prompt_tokens)[1]
        window = self.params.activity_window_s
        book.count_traffic(work, prediction, now, prompt_work, fleet_own_tokens, window)
        work.prefill_tokens += prediction.own_tokens
        work.prefilling += 1
        work.mean_tokens += (prediction.own_tokens - work.mean_tokens) * 0.05
        if idle:
            # An idle engine begins a step as soon as a request arrives: this prefill is it,
            # and the next request waits for what is left of it, not for all of it.
            book.begin_step(work, now, seeded=True)
        else:
            book.changed(work)
        if not streamed:
            book.expect(work, ticket, ticket.started + prediction.ttft_s)
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
        work = self._book.answered(ticket)
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
            self._learn(ticket.prediction, work, observed)
        return observed

    def _learn(self, prediction: Prediction, work: PodWork | None, observed: float) -> None:
        """The fleet's shape and the pod's speed, from one observed TTFT."""
        x = prediction.features()
        speed = prediction.speed
        fleet = self.fleet
        if work is not None:
            book = self._book
            if work.speed is None:
                book.set_speed(work, PodSpeed(math.log(speed)))
            assert work.speed is not None
            before = work.speed.log
            # The step's remainder is the pod's own measure: not the fleet's to scale.
            scaled = fleet.predict(x) - x[STEP_TERM] * fleet.theta[STEP_TERM]
            fixed = x[STEP_TERM] * speed * fleet.theta[STEP_TERM]
            if observed > fixed:
                work.speed.learn(observed - fixed, scaled, self.params)
            book.log_speeds += work.speed.log - before
            book.changed(work)
        fleet.learn(x, observed / speed)

    def pulse(self, pod: str) -> None:
        """A chunk of `pod`'s answer (any answer) arrived now: one of its steps just ended.
        The first chunk after a quiet spell starts the next step: every request sent before
        it and not answered yet was admitted in it or waits behind it."""
        work = self._book.pods.get(pod)
        if work is not None:
            self._book.pulse(work, self._clock())

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

    def finish(self, ticket: Ticket) -> None:
        """The exchange ended (answered, failed, cut or abandoned)."""
        self._book.finish(ticket)

    def note_scrape(self, pod: str, at: float) -> None:
        """The engine's counts scraped at `at` include ours as they are now: note them, so
        that only what exceeds them is taken for other replicas' work."""
        self._book.note_scrape(pod, at)

    # -- pods -----------------------------------------------------------------------------

    def forget(self, live: Iterable[str]) -> None:
        """Drop pods that are gone (called with the registry's pods)."""
        keep = set(live)
        for name in [name for name in self._book.pods if name not in keep]:
            self._book.drop(name)
        self.tpot.forget(keep)

    def stale(self, pod: str) -> bool:
        """Idle and without an answer for a while: the picker may have stopped choosing it
        on one unlucky early answer, and only a new answer can correct its model."""
        work = self._book.pods.get(pod)
        if work is None or work.prefilling or work.decoding:
            return False
        return self._clock() - max(work.answered_at, work.seen_at) > STALE_S

    def activity(self, pod: str) -> float:
        """Requests routed to `pod` lately (decayed): how much of the traffic it carries,
        beyond what is in flight at this instant — a conversation's turns come in bursts."""
        return self._decayed(pod, "activity")

    def bound_rate(self, pod: str) -> float:
        """Of the requests routed to `pod` per second lately, those bound to it by its
        cache: each weighted by the share of its prompt the pod held. Only those keep coming
        while a long prefill runs there; the others are routed elsewhere at no cost of
        theirs."""
        return self._decayed(pod, "bound") / self.params.activity_window_s

    def busy(self, pod: str) -> float:
        """The predicted prefill seconds of the requests routed to `pod` lately (decayed):
        the time its recent traffic costs it, however long each prompt. Each counts as on
        the pod holding most of it: a prefix prefilled there once because it was cold (a
        system prompt, then cached for every conversation placed after it) is no lasting
        load, and counted as one it would keep new conversations on its first holder."""
        return self._decayed(pod, "busy_s")

    def _decayed(self, pod: str, count: str) -> float:
        work = self._book.pods.get(pod)
        if work is None:
            return 0.0
        window = self.params.activity_window_s
        return decayed(getattr(work, count), self._clock() - work.activity_at, window)

    def speed(self, pod: str) -> float:
        """How much slower (> 1) or faster (< 1) than the fleet's model the pod runs."""
        work = self._book.pods.get(pod)
        speed = None if work is None else work.speed
        return self._book.typical_speed() if speed is None else speed.factor

    def answers(self, pod: str) -> int:
        """Answers the pod's speed was learned from."""
        work = self._book.pods.get(pod)
        return 0 if work is None or work.speed is None else work.speed.observations

    def coefficients(self, pod: str) -> tuple[float, ...]:
        """θ as it applies to `pod` (its speed folded in; the fleet's typical speed for a
        pod not answered yet)."""
        return pod_coefficients(self.fleet.coefficients, self.speed(pod))

    def outstanding(self, pod: str) -> tuple[float, int, int]:
        """(queued prefill tokens, requests prefilling, requests decoding) of ours on `pod`."""
        work = self._book.pods.get(pod)
        if work is None:
            return (0.0, 0, 0)
        if work.unobserved:
            self._book.expire(work, self._clock())
        return (work.prefill_tokens, work.prefilling, work.decoding)

    def step(self, pod: str) -> tuple[float, float]:
        """(when its current step began, its pure decode step in s) as seen from its chunks."""
        work = self._book.pods.get(pod)
        return (-math.inf, 0.0) if work is None else (work.step_start, work.decode_step_s)

    # -- state ----------------------------------------------------------------------------

    def export(self) -> dict[str, Any]:
        """The learned model and each answered pod's speed (`/admin/cost-model`), for a new
        replica to start from (`KVGATE_BOOTSTRAP_PEER`)."""
        speeds = {
            name: work.speed for name, work in self._book.pods.items() if work.speed is not None
        }
        return export_state(self.fleet, speeds)

    def adopt(self, exported: Any) -> int:
        """Start from another gateway's `export()` (parsed JSON): the fleet's model (unless
        this one has learned its own), and the speed of each pod this one has not heard
        from yet; returns how many were taken. A peer's answer is checked, never trusted:
        anything malformed or out of range raises `StateError` and nothing is taken."""
        checked = check_export(exported, features=len(FEATURES), max_trace=self.fleet.max_trace)
        taken = 0
        if not self.fleet.observations:
            self.fleet.adopt(checked.fleet)
            taken += 1
        for name, (log, observations) in checked.speeds.items():
            work = self._book.work(name)
            if work.speed is None:
                self._book.set_speed(work, PodSpeed(log, observations))
                taken += 1
        return taken
