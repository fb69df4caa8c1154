"""Every metric of one gateway (`kvgate_` prefix) on an injected registry: each component's
own (the HTTP layer's, the upstream exchange's, the router's, pinning's, the control
plane's), the fleet collector, and what any Python service exports.

Request-path metrics are updated as requests flow; fleet state (pods, subscribers, index)
is read when Prometheus scrapes, by a collector, so it costs nothing between scrapes.

Every counter series whose labels are known in advance is exported at 0 before its first
increment: enumerated labels (reasons, outcomes, kinds) from the start, a pod's or a
model's series as soon as discovery reports the pod (`known_pod`). A series that first
appears at 5 gives `rate()` and `increase()` nothing to compare its first burst with, so
that burst would never show on a dashboard nor fire an alert.
"""

from __future__ import annotations

import platform
from collections.abc import Callable

from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
)

from gateway.control.discovery import Pod
from gateway.control.metrics import ControlMetrics
from gateway.control.pinning.metrics import PinMetrics
from gateway.control.registry import PodRegistry
from gateway.epp.metrics import EppMetrics
from gateway.http.metrics import HttpMetrics
from gateway.observability.fleet import FleetCollector
from gateway.routing.metrics import RouterMetrics
from gateway.upstream.metrics import UpstreamMetrics
from gateway.version import version
from indexer import SyncPrefixHashTable
from predictor import Predictor
from subscriber import RejectCounter


class GatewayMetrics:
    """Each component's metrics, built before the components are (a pod's series exist as
    soon as discovery reports it), then given to each at construction."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.prometheus = registry
        """The Prometheus registry (not the pod registry, gateway/control/registry.py)."""
        # What operators expect on any Python service's page: process_* (CPU, memory, fds),
        # python_info and python_gc_*; and which kvgate this is.
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        GCCollector(registry=registry)
        Info("kvgate_build", "The running kvgate: version and Python", registry=registry).info(
            {"version": version(), "python": platform.python_version()}
        )
        self.http = HttpMetrics(registry)
        self.upstream = UpstreamMetrics(registry)
        self.routing = RouterMetrics(registry)
        self.pins = PinMetrics(registry)
        self.control = ControlMetrics(registry)
        self.epp = EppMetrics(registry)
        """`kvgate epp`'s (at 0 under `kvgate serve`)."""

    def known_pod(self, pod: Pod, policy: str) -> None:
        """`pod` is known (discovery reported it; again at each update): its series and its
        models' series, at 0 until their first increment. Requests are exported at 0 under
        the default `policy`; a policy a request names appears with its first request."""
        self.control.known_pod(pod)
        self.upstream.known_pod(pod, policy)
        self.routing.known_pod(pod)
        self.http.known_models((pod.model, *pod.loras))

    def watch_fleet(
        self,
        pods: PodRegistry,
        table: SyncPrefixHashTable,
        rejects: Callable[[], RejectCounter | None],
        cost: Predictor,
    ) -> None:
        self.prometheus.register(FleetCollector(pods, table, rejects, cost))
