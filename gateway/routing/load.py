"""How busy a pod is, as routing sees it.

Our own in-flight count is live and exact for the requests this gateway sent (queued
ones included); the engine's scraped running + waiting also counts what other gateway
replicas sent, but is up to one scrape interval old. So: load = ours in flight now + the
others' share, where the others' share is what the engine reported beyond our own
in-flight count at the time of that scrape (noted the first time routing sees it).

Not `PodState.load` (`max(inflight, running) + waiting`): it counts our own queued
requests twice and keeps a drained queue for a whole scrape interval, so the least
loaded pod at the last scrape draws every request until the next one. The routing
benchmark measured least-request 2× worse than round-robin on TTFT p90 with it.
"""

from __future__ import annotations

import math

from gateway.control.registry import PodState

_MAX_PODS = 4096


class LoadEstimator:
    """Shared by the load scorer and the hot-spot guard; one per gateway."""

    def __init__(self) -> None:
        # pod -> (scrape it belongs to, our in-flight count when routing first saw it)
        self._at_scrape: dict[str, tuple[float | None, int]] = {}

    def load(self, pod: PodState) -> float:
        seen = self._at_scrape.get(pod.name)
        if seen is None or seen[0] != pod.scraped_at:
            if len(self._at_scrape) >= _MAX_PODS:  # pods come and go: stay bounded
                self._at_scrape.clear()
            seen = self._at_scrape[pod.name] = (pod.scraped_at, pod.inflight)
        reported = pod.running + pod.waiting
        if not math.isfinite(reported):  # unknowable counts as infinitely busy, never idle
            return math.inf
        return pod.inflight + max(0.0, reported - seen[1])
