"""A decision's passes over its candidates: each runs once per decision over every pod of
the model."""

from __future__ import annotations

import math
from typing import Any, Protocol, TypeVar

TOKEN_UNIT = 1000.0  # features in thousands of tokens and tens of sequences keep the
SEQ_UNIT = 10.0  # least-squares state well conditioned at float precision

_E = TypeVar("_E", bound=tuple[Any, ...])


def affine_costs(
    bases: list[float],
    units: list[float],
    ends: list[float],
    cached: list[float],
    prompt_tokens: float,
    step_term: float,
    now: float,
) -> tuple[list[float], list[float]]:
    """Per pod: (TTFT, own prefill) = (base + prefill + θ5 · max(0, end − now), unit · own
    uncached tokens)."""
    ttfts: list[float] = []
    prefills: list[float] = []
    for base, unit, end, held in zip(bases, units, ends, cached, strict=True):
        own = prompt_tokens - held
        prefill = unit * own if own > 0.0 else 0.0
        remaining = end - now
        ttfts.append(base + prefill + step_term * remaining if remaining > 0.0 else base + prefill)
        prefills.append(prefill)
    return ttfts, prefills


def argsort(values: list[float]) -> list[int]:
    """The indices of `values` by ascending value, equal values in index order."""
    return sorted(range(len(values)), key=values.__getitem__)


def affine_order(
    bases: list[float],
    units: list[float],
    ends: list[float],
    cached: list[float],
    prompt_tokens: float,
    step_term: float,
    now: float,
    tolerance: float,
    waits: list[float],
    delay_weight: float,
    rates: list[float],
    arrival_weight: float,
    prefill_weight: float,
) -> tuple[list[int], int, int]:
    """`affine_costs`' TTFTs ranked: (order, ties, equal). `order` is their `argsort`, but
    its first `ties` pods (those within `tolerance` of the best, at least one) in descending
    order of `cached` tokens (equal ones as they were); `equal`: how many of those hold as
    much as the first. Each TTFT is first charged `prefill_weight` times the request's own
    prefill there, then `delay_weight` times its `delays` on the pod (`waits`: read only
    when the weight is not 0), then `arrival_weight` times its `arrivals` there (`rates`:
    likewise). What the cost-model picker ranks by when nothing else counts."""
    ttfts, prefills = affine_costs(bases, units, ends, cached, prompt_tokens, step_term, now)
    if prefill_weight:
        ttfts = [ttft + prefill_weight * own for ttft, own in zip(ttfts, prefills, strict=True)]
    if delay_weight:
        charged = delays(prefills, waits)
        ttfts = [ttft + delay_weight * delay for ttft, delay in zip(ttfts, charged, strict=True)]
    if arrival_weight:
        charged = arrivals(prefills, rates)
        ttfts = [ttft + arrival_weight * cost for ttft, cost in zip(ttfts, charged, strict=True)]
    order = argsort(ttfts)
    if not order:
        return order, 0, 0
    ties = near_ties(order, ttfts, tolerance)
    return order, ties, most_cached_first(order, ties, cached)


def delays(prefills: list[float], waits: list[float]) -> list[float]:
    """Per pod, what a request whose own prefill there is `prefills[i]` adds to the TTFTs
    of the `waits[i]` requests waiting there for the next step: it is admitted with them,
    and each waits out its prefill."""
    return [waiting * prefill for prefill, waiting in zip(prefills, waits, strict=True)]


def arrivals(prefills: list[float], rates: list[float]) -> list[float]:
    """Per pod, the requests that reach it (at `rates[i]` per second) while a prefill of
    `prefills[i]` seconds runs there, times that prefill: twice the time they wait out
    (each arrives, on average, half way through it)."""
    return [rate * (prefill * prefill) for prefill, rate in zip(prefills, rates, strict=True)]


def near_ties(order: list[int], costs: list[float], tolerance: float) -> int:
    """How many of `order` (indices of `costs`, ascending, not empty) are within
    `tolerance` of the first's cost: at least one."""
    limit = costs[order[0]] * (1.0 + tolerance)
    ties = 1
    while ties < len(order) and costs[order[ties]] <= limit:
        ties += 1
    return ties


def most_cached_first(order: list[int], ties: int, cached: list[float]) -> int:
    """Puts the first `ties` of `order` in descending order of `cached` (equal ones as they
    were), in place; returns how many of them hold as much as the first."""
    head = order[:ties]
    head.sort(key=cached.__getitem__, reverse=True)  # stable: equal ones keep their order
    order[:ties] = head
    equal = 1
    while equal < ties and cached[head[equal]] == cached[head[0]]:
        equal += 1
    return equal


class PodSpeedView(Protocol):
    @property
    def factor(self) -> float: ...


class PodWorkView(Protocol):
    """What `pod_estimate` reads of a pod's work (`cost._PodWork`); it sets `at_scrape` (on
    a scrape's first sight) and `estimate`."""

    prefilling: int
    in_step_tokens: float
    in_step_requests: int
    prefill_tokens: float
    decoding: int
    at_scrape: tuple[float | None, int, int]
    step_seeded: bool
    mean_tokens: float
    step_start: float
    decode_step_s: float
    version: int
    estimate: Any

    @property
    def speed(self) -> PodSpeedView | None: ...


def pod_estimate(
    work: PodWorkView,
    theta: tuple[float, ...],
    typical_speed: float,
    theta_version: int,
    scraped_at: float | None,
    running: float,
    waiting: float,
    make: type[_E],
) -> _E:
    """What a pod's TTFT is made of, whatever the request's prompt (`cost._Estimate`, made
    as `make` and kept as `work.estimate`): the work queued and decoding there, ours and,
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
    estimate = work.estimate = tuple.__new__(make, values)
    return estimate
