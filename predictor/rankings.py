"""A decision's candidates as estimate terms (`Ranking`), kept per candidate list between
decisions and refreshed from the pods whose work changed since, with the θ decisions use
(`Estimates`)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from predictor.features import STEP_TERM
from predictor.fleet import TtftModel
from predictor.pods import PodBook
from predictor.prediction import ScrapedPod
from predictor.work import Estimate, PodWork, pod_estimate

MAX_RANKINGS = 64
"""Candidate lists whose estimates are kept (one per model and set of routable pods)."""
FRESH_THETA_ANSWERS = 200
"""Until the model has learned from this many answers, every decision uses its latest θ."""
THETA_REFRESH_S = 0.05
"""Afterwards decisions take a new θ at most this often (it moves a little per answer)."""


class Ranking:
    """One candidate list's estimate terms, in its order: a pod's TTFT for a prompt of
    which it must prefill `own` tokens is `bases[i] + units[i] · own + θ5 · max(0, ends[i]
    − now)`. Valid for the θ and the scrapes it was built with, and for the pods' work up
    to `position` in the change log of `epoch`."""

    __slots__ = ("active_at", "bases", "bounds", "ends", "epoch", "index", "pods", "position",
                 "scraped", "theta_version", "units", "waits")  # fmt: skip

    def __init__(
        self,
        pods: tuple[ScrapedPod, ...],
        scraped: list[float | None],
        estimates: list[Estimate],
        works: list[PodWork],
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

    def arrivals(self, prefills: list[float], now: float, window_s: float) -> list[float]:
        """Per candidate, the requests that reach it at its bound arrival rate as of `now`
        (`Predictor.bound_rate`) while a prefill of `prefills[i]` seconds runs there, times
        that prefill: twice the time they wait out (each arrives, on average, half way
        through it)."""
        exp = math.exp
        return [
            (bound * exp((at - now) / window_s) / window_s if bound else 0.0) * (p * p)
            for bound, at, p in zip(self.bounds, self.active_at, prefills, strict=True)
        ]

    def add_arrivals(
        self, total: list[float], weight: float, prefills: list[float], now: float, window_s: float
    ) -> list[float]:
        """`total` + `weight` × `self.arrivals(prefills, now, window_s)`, in one pass."""
        exp = math.exp
        return [
            t + weight * ((bound * exp((at - now) / window_s) / window_s if bound else 0.0)
                          * (p * p))
            for t, bound, at, p in zip(total, self.bounds, self.active_at, prefills, strict=True)
        ]  # fmt: skip


class Estimates:
    """Each pod's estimate at the θ decisions use, and the candidate lists' rankings."""

    def __init__(self, book: PodBook, fleet: TtftModel) -> None:
        self._book = book
        self._fleet = fleet
        self.theta = fleet.coefficients
        """θ as decisions use it (`refresh_theta`), with the typical speed of that moment."""
        self._typical_speed = 1.0
        self._observations = 0
        self._at = -math.inf
        self._version = 0
        self._rankings: dict[tuple[str, ...], Ranking] = {}
        self._last: tuple[Sequence[str] | None, Ranking | None] = (None, None)
        """The names last ranked (the registry's cached tuple, as a rule) and their ranking:
        the next decision for that tuple finds it by identity, without hashing 64 names
        (then checked as one found by key)."""

    @property
    def step_term(self) -> float:
        return self.theta[STEP_TERM]

    def theta_for(self, now: float) -> None:
        """Takes the fleet's latest θ for the decisions of `now` when it is due: every
        answer moves it a little, and refreshing at most every `THETA_REFRESH_S` (once it
        has settled) keeps the pods' estimates valid across a burst of decisions."""
        fleet = self._fleet
        if fleet.observations != self._observations and (
            fleet.observations < FRESH_THETA_ANSWERS or now - self._at >= THETA_REFRESH_S
        ):
            self.theta = fleet.coefficients
            self._typical_speed = self._book.typical_speed()
            self._observations = fleet.observations
            self._at = now
            self._version += 1

    def estimates(
        self, pods: Iterable[tuple[str, float | None, float, float]], now: float
    ) -> list[Estimate]:
        """Each (pod, scraped at, running, waiting)'s estimate as of `now`: what does not
        depend on the request is kept per pod until the pod's work, its scrape or the
        decisions' θ changes, so a decision mostly costs a multiply-add per pod."""
        self.theta_for(now)
        self._book.expire_due(now)
        book = self._book
        works, work_for, current = book.pods, book.work, self.estimate
        return [
            current(works.get(name) or work_for(name), scraped_at, running, waiting)
            for name, scraped_at, running, waiting in pods
        ]

    def estimate(
        self, work: PodWork, scraped_at: float | None, running: float, waiting: float
    ) -> Estimate:
        """The estimate kept on `work` while its work, its scrape and the decisions' θ are
        those it was made with, else a new one."""
        e = work.estimate
        version = self._version
        if e is None or e[0] != work.version or e[1] != version or e[2] != scraped_at:
            e = pod_estimate(work, self.theta, self._typical_speed, version, scraped_at,
                             running, waiting)  # fmt: skip
        return e

    def ranking(
        self, pods: Sequence[ScrapedPod], names: Sequence[str] | None, now: float
    ) -> Ranking:
        """The candidates' estimate terms as of `now`, from the `Ranking` kept for this
        candidate list, re-estimating only the pods whose work changed since."""
        self.theta_for(now)
        book = self._book
        book.expire_due(now)
        last_names, ranking = self._last
        if names is not last_names or type(names) is not tuple:  # (a list may have changed)
            key = tuple(pod.name for pod in pods) if names is None else tuple(names)
            ranking = self._rankings.get(key)
        scraped = [pod.scraped_at for pod in pods]
        if (
            ranking is None
            or ranking.epoch != book.epoch
            or ranking.theta_version != self._version
            or ranking.scraped != scraped
            or (ranking.pods is not pods and ranking.pods != tuple(pods))
        ):
            # kept as a tuple: the registry's cached candidates are one, compared by identity
            key = tuple(pod.name for pod in pods) if names is None else tuple(names)
            ranking = self._build(key, tuple(pods), scraped, now)
        elif ranking.position < len(book.changes):
            self._refresh(ranking, pods)
        self._last = (names, ranking)
        return ranking

    def _refresh(self, ranking: Ranking, pods: Sequence[ScrapedPod]) -> None:
        """`ranking`'s terms of the pods whose work changed since it was last refreshed."""
        changes = self._book.changes
        index, works, work_for = ranking.index, self._book.pods, self._book.work
        bases, units, ends, waits = ranking.bases, ranking.units, ranking.ends, ranking.waits
        bounds, active_at = ranking.bounds, ranking.active_at
        current = self.estimate
        previous = None
        for changed in changes[ranking.position :]:
            if changed is previous:  # a pod changed twice in a row (a request's start)
                continue
            previous = changed
            at = index.get(changed.name)
            if at is None:
                continue
            pod = pods[at]
            work = works.get(changed.name) or work_for(changed.name)
            e = current(work, pod.scraped_at, pod.running, pod.waiting)
            # (the fields by index: a NamedTuple's names are Python properties)
            bases[at], units[at], ends[at], waits[at] = e[3], e[4], e[5], e[7]
            bounds[at] = work.bound
            active_at[at] = work.activity_at
        ranking.position = len(changes)

    def _build(
        self,
        key: tuple[str, ...],
        pods: tuple[ScrapedPod, ...],
        scraped: list[float | None],
        now: float,
    ) -> Ranking:
        if len(self._rankings) >= MAX_RANKINGS:  # candidate lists are few; stay bounded
            self._rankings.clear()
        candidates = [
            (name, pod.scraped_at, pod.running, pod.waiting)
            for name, pod in zip(key, pods, strict=True)
        ]
        estimates = self.estimates(candidates, now)
        book = self._book
        works = [book.pods.get(name) or book.work(name) for name in key]
        ranking = self._rankings[key] = Ranking(
            pods, scraped, estimates, works, book.epoch, self._version, len(book.changes)
        )
        return ranking
