"""Cost-model routing: predicted time to first byte per pod, and the SLO-aware picker."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from gateway.control.registry import PodState
from gateway.errors import SloUnreachable
from gateway.routing.request import RoutingRequest
from indexer import MatchResult, Tier
from predictor import Prediction, Predictor, argsort, arrivals, delays, most_cached_first, near_ties
from predictor.costs import affine_order

DEFAULT_CHUNK_TOKENS = 8192
"""vLLM's `max_num_batched_tokens` for an OpenAI server on a large GPU, and SGLang's
`chunked_prefill_size` there."""


def cached_tokens(
    cost: Predictor, block_size: int, match: MatchResult | None, names: list[str] | tuple[str, ...]
) -> list[float]:
    """The prompt tokens each of `names` need not prefill, from the match (GPU and expected
    blocks free, CPU and STORAGE blocks at their load cost)."""
    if match is None:
        return [0.0] * len(names)
    block = float(block_size)
    if not match.offloaded:  # on GPU or expected there: the lengths are the whole answer
        return match.held_tokens(names, block)
    cached = []
    for name in names:
        if not match.offloaded_for(name):
            cached.append(match.matched(name) * block)
        else:
            counts = match.tier_counts(name)
            gpu, cpu, storage = counts[Tier.GPU], counts[Tier.CPU], counts[Tier.STORAGE]
            cached.append(cost.cached_tokens(gpu, cpu, storage, counts[Tier.EXPECTED], block_size))
    return cached


def predict_all(
    cost: Predictor,
    block_size: int,
    request: RoutingRequest,
    pods: Sequence[PodState],
) -> dict[str, Prediction]:
    """Each candidate's predicted TTFT for this request, with its terms (computed once per
    decision and pod)."""
    predictions = request.state.predictions
    missing = [pod for pod in pods if pod.pod.name not in predictions] if predictions else pods
    if not missing:
        return predictions
    names = [pod.pod.name for pod in missing]
    cached = cached_tokens(cost, block_size, request.match, names)
    candidates = [
        (name, held, pod.scraped_at, pod.running, pod.waiting)
        for name, held, pod in zip(names, cached, missing, strict=True)
    ]
    for prediction in cost.predict_many(candidates, request.prompt_tokens):
        predictions[prediction.pod] = prediction
    return predictions


class PredictedTtftScorer:
    """Scores 1 for the pod with the lowest predicted TTFT, less in proportion elsewhere
    (best / predicted); the predictions stay in the cycle state for the picker."""

    name = "predicted-ttft"
    uses_prefix = True

    def __init__(self, cost: Predictor, block_size: int) -> None:
        self._cost = cost
        self._block_size = block_size

    def score(self, request: RoutingRequest, pods: Sequence[PodState]) -> dict[str, float]:
        predictions = predict_all(self._cost, self._block_size, request, pods)
        best = min((predictions[pod.name].ttft_s for pod in pods), default=0.0)
        return {
            pod.name: (best / t if (t := predictions[pod.name].ttft_s) > 0 else 1.0) for pod in pods
        }


class MinPredictedTtftPicker:
    """Lowest predicted TTFT first; pods within `tie_tolerance` of the best are ordered by
    cache affinity (more matched blocks first), then at random. With `affinity_tolerance`,
    the pod holding most of the prompt goes first unless another is predicted faster by
    more than that share.

    `prefill_weight` charges the request's own prefill on a pod that much again: the
    compute a cache miss burns is capacity every later request loses, which this request's
    own TTFT does not see (0: pure TTFT). `delay_weight` charges what its prefill adds to
    the requests waiting for the pod's next step (a prompt longer than the engines'
    prefill chunk, `chunk_tokens`, holds them up by one chunk at most); `arrival_weight`
    what it costs the requests its cache binds to the pod that arrive while it runs (at
    their recent rate, each waiting out half of it): quadratic in the prefill, so it weighs
    on moving a long history.

    A conversation's first turn is a placement: its later turns follow it to its pod, so
    it goes where the conversation will be served fastest, not where this one request is —
    ranked as if every pod held the shared prefix — its system messages, or more where two
    pods or more hold more (a system prompt is prefilled once per pod, then serves every
    conversation placed there; a conversation's own history, held by one pod, is no shared
    prefix) — and among pods within `placement_tolerance` of the best, to the least loaded
    one (`_placement_shares`: its larger share of the requests or of the prefill work
    routed to the candidates lately): the instantaneous queue misses conversations between
    their turns, and prompts differ in size a hundredfold. Without
    this, every new conversation follows its system prompt to one pod and stays there.
    With `placement_load_tolerance`, loads within that share of the least count as equal,
    and among those the pods that hold the shared prefix go first: a balance not needed
    is not bought with a cold prefill of the system prompt.
    A first turn whose whole prompt a pod already holds (a retry, a regenerated answer) is
    no placement.

    With a TTFT objective (`x-slo-ttft-ms`; and `x-slo-tpot-ms` for a stream, with
    `tpot_ranking`): the pods predicted to meet them come first, best cache affinity first
    (keeping the cache warm costs nothing the client asked for); if none can, the ranking
    without them — or, with `shed`, a 429 + Retry-After. A TPOT objective alone (with
    `tpot_ranking`) puts the pods predicted to meet it first, each group in the ranking
    without it; without `tpot_ranking` it only sheds.
    """

    name = "min-predicted-ttft"
    uses_prefix = True

    def __init__(
        self,
        cost: Predictor,
        block_size: int,
        rng: random.Random,
        *,
        tie_tolerance: float = 0.05,
        affinity_tolerance: float = 0.0,
        prefill_weight: float = 0.0,
        delay_weight: float = 0.0,
        arrival_weight: float = 0.0,
        probe_rate: float = 0.02,
        placement_tolerance: float = 0.25,
        placement_load_tolerance: float = 0.0,
        tpot_tolerance: float = 0.5,
        tpot_ranking: bool = False,
        shed: bool = False,
        chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
    ) -> None:
        self._cost = cost
        self._block_size = block_size
        self._rng = rng
        self.tie_tolerance = tie_tolerance
        self.affinity_tolerance = affinity_tolerance
        self.prefill_weight = prefill_weight
        self.delay_weight = delay_weight
        self.arrival_weight = arrival_weight
        self.probe_rate = probe_rate
        self.placement_tolerance = placement_tolerance
        self.placement_load_tolerance = placement_load_tolerance
        self.tpot_tolerance = tpot_tolerance
        """A pod predicted within this share above a TPOT objective counts as meeting it:
        a stream's TPOT moves with the prompts that reach its pod while it decodes, and
        moving streams off their cache for a closer prediction costs prefills that lengthen
        every stream's steps (hetero at 80 %, a 60 ms objective met by the median stream:
        strict, TTFT p90 277 → 1,084 ms and the objective met by 29 % of answers)."""
        self.tpot_ranking = tpot_ranking
        """Whether a TPOT objective reorders the pods (those predicted to meet it first).
        Off, it is counted and, with `shed`, refuses what no pod can meet: in the benchmark
        reordering lowered the share of streams meeting it (hetero, 60 ms: 49 % → 43 %
        with the tolerance, 29 % without) — a stream's TPOT there is set by the prefills
        its pod runs meanwhile, which a move off its cache adds to. A fleet whose pods
        decode at different speeds than they prefill is where it can pay."""
        self.shed = shed
        self.chunk_tokens = chunk_tokens
        """The engines' prefill chunk (vLLM's `max_num_batched_tokens`, SGLang's
        `chunked_prefill_size`): a longer prompt is prefilled a chunk per step, so it holds
        up the requests admitted with it by one chunk, not by all of it."""

    def rank(
        self,
        request: RoutingRequest,
        pods: Sequence[PodState],
        scores: Mapping[str, float],
    ) -> list[PodState]:
        if not pods:
            return []
        slo_tpot = request.slo_tpot_s if request.streamed else None
        if slo_tpot is None or not (self.shed or self.tpot_ranking):
            return self._rank(request, pods, None)  # an objective only counted
        bar = slo_tpot * (1.0 + self.tpot_tolerance)
        if self.tpot_ranking and request.slo_ttft_s is not None:
            return self._rank(request, pods, bar)  # both met together, by cache affinity
        # Otherwise a TPOT objective bounds no wait for the first token: the pods predicted
        # to meet it keep the order they have without it (the cost model's), ahead of the
        # others. Ranked by cache affinity alone, as with a TTFT objective, the streams
        # piled onto the pods holding their prefixes (hetero at 80 %: TTFT p90 277 →
        # 1,040 ms, the objective met less often than by sticky-rr, on `kvgate bench routing`).
        ranked = self._rank(request, pods, None)
        predicted = dict(zip(ranked, self._tpots(request, ranked), strict=True))
        meeting = [pod for pod in ranked if predicted[pod] <= bar]
        if not meeting and self.shed:
            raise self._unreachable(None, [], bar, list(predicted.values()))
        if not self.tpot_ranking:
            return ranked  # counted, and shed when no pod can meet it
        return meeting + [pod for pod in ranked if predicted[pod] > bar]

    def _rank(
        self, request: RoutingRequest, pods: Sequence[PodState], slo_tpot: float | None
    ) -> list[PodState]:
        """The ranking, with the request's TTFT objective and `slo_tpot` (with it) met first."""
        match = request.match
        names = (
            request.routable_names if pods is request.routable else [pod.pod.name for pod in pods]
        )
        cached = cached_tokens(self._cost, self._block_size, match, names)
        slo = request.slo_ttft_s
        # A first turn whose whole prompt some pod already holds is a repeat (a retry, a
        # regenerated answer), not a new conversation: it goes where it is cached.
        repeat = match is not None and 0 < request.prompt_blocks <= match.longest()
        placing = request.opens_conversation and self.placement_tolerance >= 0.0 and not repeat
        objectives = slo is not None or slo_tpot is not None
        # (a prompt longer than a chunk delays those waiting by less than its prefill: the
        # slower path charges that)
        long = request.prompt_tokens > self.chunk_tokens and bool(self.delay_weight)
        plain = not placing and not self.affinity_tolerance and not long
        if plain and not objectives:
            # Only the TTFT (and the charges for the capacity and the delays to others)
            # counts: ranked and its near-ties ordered in one compiled pass.
            cost = self._cost
            ranking, now = cost.candidates(pods, names)
            held, prompt = cost.work_of(cached, request.prompt_tokens)
            window = cost.params.activity_window_s
            rates = ranking.rates(now, window) if self.arrival_weight else []
            order, _, equal = affine_order(
                ranking.bases, ranking.units, ranking.ends, held, prompt, cost.step_term, now,
                self.tie_tolerance, ranking.waits, self.delay_weight, rates,
                self.arrival_weight / 2.0, self.prefill_weight,
            )  # fmt: skip
            probed = self._probed(order, names)
            if probed is not None:
                return [pods[probed], *(pods[i] for i in order)]
            if equal > 1:  # as much cached: a random one (none favoured by its place)
                order.insert(0, order.pop(self._rng.randrange(equal)))
            return list(map(pods.__getitem__, order))
        ttfts, prefills = self._cost.rank_costs(pods, cached, request.prompt_tokens, names)
        ranking, now = self._cost.candidates(pods, names)
        if objectives:
            meets = [True] * len(pods) if slo is None else [ttft <= slo for ttft in ttfts]
            tpots: list[float] = []
            if slo_tpot is not None:
                tpots = self._tpots(request, pods)
                meets = [met and tpot <= slo_tpot for met, tpot in zip(meets, tpots, strict=True)]
            meeting = [i for i, met in enumerate(meets) if met]
            if meeting:
                meeting.sort(key=lambda i: (-cached[i], ttfts[i]))
                rest = [i for i, met in enumerate(meets) if not met]
                rest.sort(key=ttfts.__getitem__)
                return [pods[i] for i in meeting + rest]
            if self.shed:
                raise self._unreachable(slo, ttfts, slo_tpot, tpots)
        if placing:
            # As if every pod held as much as the best (the shared prefix): each pod's own
            # prefill scaled down to the least any pod has to do.
            held, prompt = self._cost.work_of(cached, request.prompt_tokens)
            # The shared prefix: what two pods or more hold, or its system messages (held
            # anywhere; a system prompt is prefilled once per pod). A conversation's own
            # history, on one pod, is none: its holder keeps what it holds.
            preamble = self._cost.work_of((), request.preamble_share * request.prompt_tokens)[1]
            ranked = sorted(held)
            second = ranked[-2] if len(ranked) > 1 else 0.0
            shared = max(second, min(ranked[-1], preamble))
            least = prompt - shared
            costs = [
                ttft - prefill * (1.0 - least / own) if (own := prompt - pod_held) > least else ttft
                for ttft, prefill, pod_held in zip(ttfts, prefills, held, strict=True)
            ]
        elif self.prefill_weight:
            weight = self.prefill_weight
            costs = [ttft + weight * prefill for ttft, prefill in zip(ttfts, prefills, strict=True)]
        else:
            costs = ttfts
        if self.delay_weight:
            # What sending it there costs the requests already waiting for that pod's next
            # step: they are admitted with it, and each waits out its prefill too.
            weight = self.delay_weight
            # an engine prefills a long prompt a chunk per step (after those waiting): it
            # holds up the requests admitted with it by one chunk at most
            chunk, tokens = float(self.chunk_tokens), float(request.prompt_tokens)
            delaying = [
                prefill * min(1.0, chunk / own) if (own := tokens - held) > 0 else prefill
                for prefill, held in zip(prefills, cached, strict=True)
            ]
            charged = delays(delaying, ranking.waits)
            costs = [cost + weight * delay for cost, delay in zip(costs, charged, strict=True)]
        if self.arrival_weight:
            # What its prefill there costs the requests that reach that pod while it runs
            # (at the pod's recent rate): each waits out the rest of it, half on average.
            weight = self.arrival_weight / 2.0
            charged = arrivals(prefills, ranking.rates(now, self._cost.params.activity_window_s))
            costs = [cost + weight * each for cost, each in zip(costs, charged, strict=True)]
        order = argsort(costs)
        probed = self._probed(order, names)
        if probed is not None:
            return [pods[probed], *(pods[i] for i in order)]
        if not placing and self.affinity_tolerance > 0.0:
            # A later turn stays with the pod that holds most of its conversation unless
            # another is predicted faster by more than `affinity_tolerance`: moving repays
            # the whole history's prefill there (and evicts someone else's) for a gain
            # within the predictions' own error.
            most = max(cached)
            if most > 0.0:
                home = next(i for i in order if cached[i] == most)  # the fastest of them
                if costs[home] <= costs[order[0]] * (1.0 + self.affinity_tolerance):
                    order.remove(home)
                    return [pods[home], *(pods[i] for i in order)]
        tolerance = self.placement_tolerance if placing else self.tie_tolerance
        ties = near_ties(order, costs, tolerance)
        if ties > 1:
            if placing:
                head = order[:ties]
                self._rng.shuffle(head)  # equals in load and match: none favoured by place
                shares, one = self._placement_shares(head, names, min(prefills))
                loads = dict(zip(head, shares, strict=True))
                if self.placement_load_tolerance > 0.0:
                    # Loads within the tolerance of the least (or within one request like
                    # this one of it, while the pods are nearly idle) are equal: among those,
                    # the pods that hold the shared prefix (as much of the prompt as any,
                    # within a tenth) go first, the least loaded of them first. A block more
                    # or less of a prefix every pod holds is no reason to load one pod more.
                    bar = min(shares) * (1.0 + self.placement_load_tolerance) + one
                    holds = 0.9 * max(cached[i] for i in head)
                    head.sort(key=lambda i: (loads[i] > bar, cached[i] < holds, loads[i]))
                else:
                    head.sort(key=lambda i: (round(loads[i] / one, 1), -cached[i]))
                order[:ties] = head
            else:
                # Near-equal predictions: keep the cache warm where it already is; among pods
                # that hold as much, a random one (none is favoured by its place in the list).
                equal = most_cached_first(order, ties, cached)
                if equal > 1:
                    order.insert(0, order.pop(self._rng.randrange(equal)))
        return [pods[i] for i in order]

    def _placement_shares(
        self, head: list[int], names: Sequence[str], prefill: float
    ) -> tuple[list[float], float]:
        """Each candidate's load for a placement: its dominant share of the traffic routed
        to the candidates lately — of the requests (each a place in the pod's steps until
        its answer ends; counted × the pod's speed, so a pod twice as slow carries half
        as many) or of their predicted prefill work (`Predictor.busy`: prompts differ in
        size a hundredfold), whichever is larger. By requests alone a pod given a few
        32k-token prompts looks as free as one given as many short ones; by work alone a
        pod serving warm conversations, whose turns are mostly cached, looks idle and
        draws every new prompt onto them. Also the share one request adds: this one
        (`prefill` seconds) or a typical recent one, whichever is larger."""
        cost = self._cost
        requests = [cost.activity(names[i]) * cost.speed(names[i]) for i in head]
        works = [cost.busy(names[i]) for i in head]
        all_requests, all_work = sum(requests) + 1.0, sum(works) + prefill
        shares = [
            max(count / all_requests, work / all_work)
            for count, work in zip(requests, works, strict=True)
        ]
        # one request: this one, or one as large as those routed lately (a pod that took a
        # single cold prompt is loaded by one request, however cheap this one is there)
        typical = sum(works) / sum(requests) if sum(requests) > 0.0 else 0.0
        return shares, max(1.0 / all_requests, max(prefill, typical) / max(all_work, 1e-9))

    def _tpots(self, request: RoutingRequest, pods: Sequence[PodState]) -> list[float]:
        """Each pod's predicted time per output token for this request."""
        predictions = predict_all(self._cost, self._block_size, request, pods)
        predict = self._cost.predict_tpot
        return [predict(predictions[pod.pod.name]).tpot_s for pod in pods]

    @staticmethod
    def _unreachable(
        slo: float | None, ttfts: list[float], slo_tpot: float | None, tpots: list[float]
    ) -> SloUnreachable:
        """The 429 of a request no pod is predicted to serve within its objectives."""
        wanted: list[str] = []
        best: list[str] = []
        late = 0.0
        if slo is not None:
            wanted.append(f"TTFT {slo * 1e3:.0f} ms")
            best.append(f"TTFT {min(ttfts) * 1e3:.0f} ms")
            late = min(ttfts) - slo
        if slo_tpot is not None:
            wanted.append(f"TPOT {slo_tpot * 1e3:.1f} ms with tpot_tolerance")
            best.append(f"TPOT {min(tpots) * 1e3:.1f} ms")
        return SloUnreachable(
            f"no pod is predicted to answer within the objectives ({', '.join(wanted)}; "
            f"best predicted: {', '.join(best)})",
            retry_after_s=max(1, round(late + 0.5)),
        )

    def _probed(self, order: list[int], names: Sequence[str]) -> int | None:
        """Now and then (`probe_rate`) a stale pod goes first, taken out of `order`: a pod
        one unlucky answer made look slow gets measured again instead of starving; a pod
        in use is never probed."""
        if not self.probe_rate or self._rng.random() >= self.probe_rate:
            return None
        stale = [i for i in order[1:] if self._cost.stale(names[i])]
        if not stale:
            return None
        order.remove(stale[-1])  # the most avoided of them
        return stale[-1]
