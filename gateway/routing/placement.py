"""A conversation's first turn is a placement: its later turns follow it to its pod.

So it goes where the conversation will be served fastest, not where this one request is:
ranked as if every pod held the shared prefix — its system messages, or more where two
pods or more hold more (a system prompt is prefilled once per pod, then serves every
conversation placed there; a conversation's own history, held by one pod, is no shared
prefix) — and among the pods within `PLACEMENT_TOLERANCE` of the best, to the least
loaded one: the instantaneous queue misses conversations between their turns, and prompts
differ in size a hundredfold. Loads within `load_tolerance` of the least (plus one
request) count as equal, and among those the pods that hold the shared prefix go first: a
balance not needed is not bought with a cold prefill of the system prompt. A first turn
whose whole prompt a pod already holds (a retry, a regenerated answer) is no placement.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from gateway.routing.request import RoutingRequest
from gateway.routing.terms import DecisionTerms
from predictor import Predictor, near_ties

PLACEMENT_TOLERANCE = 0.25
"""A first turn's candidates: the pods whose cost, as if each held its shared prefix, is
within this share of the best."""


class FirstTurnPlacement:
    name = "first-turn"

    def __init__(self, cost: Predictor, rng: random.Random, *, load_tolerance: float) -> None:
        self._cost = cost
        self._rng = rng
        self.load_tolerance = load_tolerance

    @staticmethod
    def applies(request: RoutingRequest) -> bool:
        """A new conversation's first turn, not a repeat of a prompt some pod holds whole."""
        match = request.match
        repeat = match is not None and 0 < request.prompt_blocks <= match.longest()
        return request.opens_conversation and not repeat

    def as_if_held(self, request: RoutingRequest, terms: DecisionTerms) -> list[float]:
        """Each pod's TTFT as if it held as much as the shared prefix: its own prefill
        scaled down to the least any pod has to do."""
        cost = self._cost
        held, prompt = cost.work_of(terms.cached, request.prompt_tokens)
        # The shared prefix: what two pods or more hold, or its system messages (held
        # anywhere; a system prompt is prefilled once per pod). A conversation's own
        # history, on one pod, is none: its holder keeps what it holds.
        preamble = cost.work_of((), request.preamble_share * request.prompt_tokens)[1]
        ranked = sorted(held)
        second = ranked[-2] if len(ranked) > 1 else 0.0
        shared = max(second, min(ranked[-1], preamble))
        least = prompt - shared
        return [
            ttft - prefill * (1.0 - least / own) if (own := prompt - pod_held) > least else ttft
            for ttft, prefill, pod_held in zip(terms.ttfts, terms.prefills, held, strict=True)
        ]

    def order(self, order: list[int], costs: list[float], terms: DecisionTerms) -> None:
        """Puts the pods of `order` (by cost) within `PLACEMENT_TOLERANCE` of the first in
        the order of their load, in place."""
        ties = near_ties(order, costs, PLACEMENT_TOLERANCE)
        if ties < 2:
            return
        head = order[:ties]
        self._rng.shuffle(head)  # equals in load and match: none favoured by place
        shares, one = self._shares(head, terms.names, min(terms.prefills))
        loads = dict(zip(head, shares, strict=True))
        # Loads within the tolerance of the least (or within one request like this one of
        # it, while the pods are nearly idle) are equal: among those, the pods that hold the
        # shared prefix (as much of the prompt as any, within a tenth) go first, the least
        # loaded of them first. A block more or less of a prefix every pod holds is no
        # reason to load one pod more.
        bar = min(shares) * (1.0 + self.load_tolerance) + one
        cached = terms.cached
        holds = 0.9 * max(cached[i] for i in head)
        head.sort(key=lambda i: (loads[i] > bar, cached[i] < holds, loads[i]))
        order[:ties] = head

    def _shares(
        self, head: list[int], names: Sequence[str], prefill: float
    ) -> tuple[list[float], float]:
        """Each candidate's load: its dominant share of the traffic routed to the
        candidates lately — of the requests (each a place in the pod's steps until its
        answer ends; counted × the pod's speed, so a pod twice as slow carries half as
        many) or of their predicted prefill work (`Predictor.busy`), whichever is larger.
        By requests alone a pod given a few 32k-token prompts looks as free as one given as
        many short ones; by work alone a pod serving warm conversations looks idle and
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
