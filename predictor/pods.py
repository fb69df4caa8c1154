"""Every pod's `PodWork`, kept as requests come and go and chunks mark the pods' steps,
with a log of the pods whose work changed (what the rankings re-estimate)."""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable

from predictor.features import MAX_PODS
from predictor.fleet import PodSpeed
from predictor.prediction import Prediction, Ticket
from predictor.work import PodWork, decayed

STEP_GAP_S = 0.002
"""Chunks closer than this (or a quarter of the pod's decode step) belong to one step."""
MAX_STEP_S = 5.0
"""A gap between step boundaries longer than this was idle time, not a step."""
STEP_HISTORY = 8
"""Recent steps whose shortest is the pod's pure decode step."""
MAX_CHANGES = 4096
"""Pod changes logged before the rankings are rebuilt from scratch (once)."""


class PodBook:
    """The pods' work and speeds; one per predictor."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self.clock = clock
        self.pods: dict[str, PodWork] = {}
        self.changes: list[PodWork] = []
        """Pods whose work changed, in order, since the rankings' `epoch` began."""
        self.epoch = 0
        self.log_speeds = 0.0
        """Sum of the answered pods' log-speeds (their mean is a new pod's speed)."""
        self.answered_pods = 0
        self.due: list[tuple[float, int, PodWork]] = []
        """Heap of (predicted first byte, ticket number, pod) of non-streamed answers."""

    def work(self, pod: str) -> PodWork:
        """`pod`'s work, made when first heard of."""
        work = self.pods.get(pod)
        if work is None:
            if len(self.pods) >= MAX_PODS:  # pods come and go: stay bounded
                for name in list(self.pods):
                    self.drop(name)
            work = self.pods[pod] = PodWork(pod, seen_at=self.clock())
        return work

    def typical_speed(self) -> float:
        """The answered pods' typical speed (geometric mean): a new pod's until it answers."""
        return math.exp(self.log_speeds / self.answered_pods) if self.answered_pods else 1.0

    def set_speed(self, work: PodWork, speed: PodSpeed) -> None:
        if work.speed is None:
            self.answered_pods += 1
        else:
            self.log_speeds -= work.speed.log
        work.speed = speed
        self.changed(work)
        self.log_speeds += speed.log

    def drop(self, name: str) -> None:
        work = self.pods.pop(name)
        self.changed(work)  # a ranking that still holds it re-estimates it from scratch
        if work.speed is not None:
            self.log_speeds -= work.speed.log
            self.answered_pods -= 1

    def changed(self, work: PodWork) -> None:
        """Anything an estimate reads of `work` changed."""
        work.version += 1
        changes = self.changes
        if len(changes) >= MAX_CHANGES:  # bounded, whether or not anything ranks
            changes.clear()
            self.epoch += 1  # every ranking is rebuilt once
        changes.append(work)

    # -- steps ----------------------------------------------------------------------------

    def pulse(self, work: PodWork, now: float) -> None:
        """A chunk of the pod's answer arrived `now`: one of its steps just ended. The first
        chunk after a quiet spell starts the next step."""
        quiet = 0.25 * work.decode_step_s
        if now - work.last_chunk > (quiet if quiet > STEP_GAP_S else STEP_GAP_S):
            length = now - work.step_start
            sampled = length < MAX_STEP_S and not work.step_seeded
            if sampled:
                lengths = work.step_lengths
                lengths.append(length)
                if len(lengths) > STEP_HISTORY:
                    del lengths[0]
                work.decode_step_s = min(lengths)
            self.begin_step(work, now, seeded=False)
            work.sampled_step = work.steps if sampled else -1
        work.last_chunk = now

    def begin_step(self, work: PodWork, now: float, *, seeded: bool) -> None:
        """The pod's next step begins now: every request in prefill is admitted in it or
        waits behind it."""
        work.step_start = now
        work.steps += 1
        work.step_seeded = seeded
        work.in_step_tokens = work.prefill_tokens
        work.in_step_requests = work.prefilling
        self.changed(work)

    @staticmethod
    def unsample_prefill_step(work: PodWork) -> None:
        """A request sent before the current step began got its first byte at its boundary
        (the burst of chunks that began it): the step before prefilled it, so its length
        is no decode step. Without this, on a pod that admits a prompt at almost every step
        (unique prompts at high load) the shortest of the recent "decode" steps became a
        prefill step of 100-250 ms: every prediction there waited out a step that had
        ended long before, and chunks 20 ms apart no longer told steps apart."""
        work.step_lengths.pop()
        work.decode_step_s = min(work.step_lengths, default=0.0)
        work.sampled_step = -1

    # -- requests -------------------------------------------------------------------------

    @staticmethod
    def count_traffic(
        work: PodWork,
        prediction: Prediction,
        now: float,
        prompt_work: float,
        fleet_own_tokens: float | None,
        window_s: float,
    ) -> None:
        """The pod's decayed counts of requests, of those bound to it by its cache, and of
        their prefill seconds, with this request (`prompt_work`: its prompt's prefill work;
        `fleet_own_tokens`: the fewest tokens any pod had to prefill)."""
        decay = decayed(1.0, now - work.activity_at, window_s)
        own_tokens = prediction.own_tokens
        held = 1.0 - own_tokens / prompt_work if prompt_work > own_tokens else 0.0
        work.activity = work.activity * decay + 1.0
        work.bound = work.bound * decay + held
        own = prediction.own_prefill_s()
        if fleet_own_tokens is not None and own_tokens > fleet_own_tokens:
            own *= fleet_own_tokens / own_tokens
        work.busy_s = work.busy_s * decay + own
        work.activity_at = now

    def answered(self, ticket: Ticket) -> PodWork | None:
        """`ticket`'s first byte came back: its prefill is done, it decodes. Returns its
        pod's work (None: a pod forgotten since)."""
        work = self.pods.get(ticket.pod)
        if (
            work is not None
            and ticket.streamed  # an unstreamed answer's first byte is its last token's
            and work.sampled_step == work.steps
            and ticket.step < work.steps
        ):
            self.unsample_prefill_step(work)
        self.leave_prefill(ticket, work)
        ticket.phase = "decode"
        if work is not None:
            work.decoding += 1
            self.changed(work)
        return work

    def finish(self, ticket: Ticket) -> None:
        work = self.pods.get(ticket.pod)
        if ticket.phase == "prefill":
            self.leave_prefill(ticket, work)
        elif ticket.phase == "decode" and work is not None:
            work.decoding -= 1
            self.changed(work)
        ticket.phase = "done"

    def note_scrape(self, pod: str, at: float) -> None:
        work = self.pods.get(pod)
        if work is not None:
            if work.unobserved:
                self.expire(work, self.clock())
            work.at_scrape = (at, work.prefilling, work.decoding)
            self.changed(work)

    # -- prefill --------------------------------------------------------------------------

    def leave_prefill(self, ticket: Ticket, work: PodWork | None) -> None:
        if work is None:
            return
        own = ticket.prediction.own_tokens
        self.changed(work)
        work.prefill_tokens = max(0.0, work.prefill_tokens - own)
        work.prefilling = max(0, work.prefilling - 1)
        if ticket.step < work.steps:  # sent before the current step began: in it
            work.in_step_tokens = max(0.0, work.in_step_tokens - own)
            work.in_step_requests = max(0, work.in_step_requests - 1)
        if work.prefilling == 0:
            work.prefill_tokens = 0.0  # no float drift when the queue drains
            work.in_step_tokens, work.in_step_requests = 0.0, 0

    def expect(self, work: PodWork, ticket: Ticket, expected: float) -> None:
        """An unstreamed answer's prefill is taken as done at `expected`."""
        heapq.heappush(work.unobserved, (expected, ticket.number, ticket))
        heapq.heappush(self.due, (expected, ticket.number, work))

    def expire(self, work: PodWork, now: float) -> None:
        heap = work.unobserved
        while heap and heap[0][0] <= now:
            _, _, ticket = heapq.heappop(heap)
            if ticket.phase == "prefill":
                self.leave_prefill(ticket, work)
                ticket.phase = "decode"
                work.decoding += 1
                self.changed(work)

    def expire_due(self, now: float) -> None:
        """Non-streamed answers whose predicted first byte is past: their prefill is done."""
        due = self.due
        while due and due[0][0] <= now:
            work = heapq.heappop(due)[2]
            if self.pods.get(work.name) is work:
                self.expire(work, now)
