"""Cuts what is still in flight to a pod that is gone.

vLLM keeps in-flight streams open after SIGTERM, and a frozen engine sends nothing until
the upstream timeout (`KVGATE_UPSTREAM_TIMEOUT`, 600 s by default). The gateway knows much
sooner: the pod left discovery, or failed its health checks. After `KVGATE_DEAD_POD_GRACE`
(a pod that comes back within it loses nothing), its exchanges are broken off: a stream is
cut, as the engine's own failure would cut it, so the client can retry; a request still
waiting for its answer fails over to the next-best pod. Each exchange still in progress at
that moment is counted (`kvgate_dead_pod_cuts_total{pod}`, one per client that saw the
error) and the cut logged once per pod; exchanges that already ended are not.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from prometheus_client import Counter

from gateway.control.registry import PodRegistry
from gateway.observability.children import Children
from gateway.upstream.proxy import Upstream

logger = logging.getLogger(__name__)


class DeadPodReaper:
    def __init__(
        self,
        registry: PodRegistry,
        upstream: Upstream,
        cuts: Children[Counter],
        *,
        grace_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._upstream = upstream
        self._cuts = cuts
        self._grace_s = grace_s
        self._clock = clock
        self._dead_since: dict[str, float] = {}

    async def run(self) -> None:
        period = min(1.0, max(0.05, self._grace_s / 4))
        while True:
            self.sweep()
            await asyncio.sleep(period)

    def sweep(self) -> None:
        now = self._clock()
        in_flight = self._upstream.pods_in_flight()
        for pod in [pod for pod in self._dead_since if pod not in in_flight]:
            del self._dead_since[pod]
        for pod in in_flight:
            state = self._registry.get(pod)
            if state is not None and state.healthy:
                self._dead_since.pop(pod, None)
                continue
            since = self._dead_since.setdefault(pod, now)
            if now - since < self._grace_s:
                continue
            why = "left discovery" if state is None else "failed its health checks"
            cut = self._upstream.break_off(pod, f"pod {pod} {why}")
            del self._dead_since[pod]
            if cut:
                self._cuts.labels(pod).inc(cut)
                logger.warning("pod %s %s %.0f s ago: cut its %d request(s) in flight",
                               pod, why, now - since, cut)  # fmt: skip
