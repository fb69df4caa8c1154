"""A pod as the predictor sees it: the work this gateway has outstanding there, what it
has seen of its steps (`PodWork`), and what its TTFT is made of whatever the prompt
(`Estimate`, `pod_estimate`)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

from predictor.features import SEQ_UNIT, TOKEN_UNIT
from predictor.fleet import PodSpeed

if TYPE_CHECKING:
    from predictor.prediction import Ticket


class Estimate(NamedTuple):
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


@dataclass(slots=True)
class PodWork:
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
    """Bumped whenever anything above changes (`PodBook.changed`: it invalidates
    `estimate`)."""
    estimate: Estimate | None = None


def pod_estimate(
    work: PodWork,
    theta: tuple[float, ...],
    typical_speed: float,
    theta_version: int,
    scraped_at: float | None,
    running: float,
    waiting: float,
) -> Estimate:
    """What a pod's TTFT is made of, whatever the request's prompt (kept as
    `work.estimate`): the work queued and decoding there, ours and,
    beyond ours at the last scrape (`scraped_at`, `running`, `waiting`), other replicas';
    its current step's end; at θ and the pod's speed (`typical_speed` until it answered).
    It runs whenever a pod's work changed (every step boundary of every busy pod)."""
    t0, t1, t2, t3, t4, _, t6 = theta
    prefilling = work.prefilling
    in_step = work.in_step_tokens
    in_step_requests = work.in_step_requests
    pending = work.prefill_tokens - in_step
    pending_requests = float(prefilling - in_step_requests)
    decoding = float(work.decoding)
    busy = bool(prefilling or work.decoding)
    if scraped_at is not None:
        at_scrape = work.at_scrape
        if at_scrape[0] != scraped_at:  # not noted by the scraper: first sight
            at_scrape = work.at_scrape = (scraped_at, prefilling, work.decoding)
        ours_prefilling = at_scrape[1]
        # The engine counts every replica's requests; ours in prefill may be running
        # or waiting there, so only what exceeds all of ours is another replica's.
        others = running + waiting - ours_prefilling - at_scrape[2]
        if others > 0.0 and others != math.inf:  # (NaN fails the first test)
            others_waiting = min(others, max(0.0, waiting - ours_prefilling))
            pending += others_waiting * work.mean_tokens
            pending_requests += others_waiting
            decoding += others - others_waiting
            busy = True
            if work.step_seeded:  # not idle after all: ours queued behind theirs
                pending += in_step
                pending_requests += in_step_requests
                in_step, in_step_requests = 0.0, 0
    speed = typical_speed if work.speed is None else work.speed.factor
    step_end = -math.inf
    if busy:
        in_step_s = speed * (t1 * in_step / TOKEN_UNIT + t0 * in_step_requests)
        step_end = work.step_start + work.decode_step_s + in_step_s
    base = (
        t0
        + t1 * pending / TOKEN_UNIT
        + t2 * pending_requests / SEQ_UNIT
        + t3 * decoding / SEQ_UNIT
        + (t4 if busy else 0.0)
        + t6 * in_step / TOKEN_UNIT
    )
    values = (
        work.version, theta_version, scraped_at, speed * base, speed * t1 / TOKEN_UNIT,
        step_end, pending, pending_requests, decoding, 1.0 if busy else 0.0, in_step, speed,
    )  # fmt: skip
    estimate = work.estimate = tuple.__new__(Estimate, values)
    return estimate


def decayed(count: float, age_s: float, window_s: float) -> float:
    """A count that decays with time constant `window_s`, `age_s` after it was last set."""
    return count * math.exp(-age_s / window_s) if count else 0.0
