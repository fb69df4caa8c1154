"""The control plane's metrics: discovery's rejected updates and relists, background
tasks restarted, requests cut because their pod was gone."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from gateway.control.discovery import DiscoveryEvents, Pod
from gateway.observability.children import Children


class ControlMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.discovery_errors = Counter(
            "kvgate_discovery_errors",
            "Discovery updates rejected (the last good pod list was kept)",
            registry=registry,
        )
        self.discovery_relists = Counter(
            "kvgate_discovery_relists",
            "Kubernetes pod lists after the first (watch expired with 410 Gone)",
            registry=registry,
        )
        self.background_restarts = Counter(
            "kvgate_background_restarts",
            "Background tasks (discovery, metrics-scraper, index-eviction, pin-reconcile, "
            "snapshot-writer) restarted after a failure",
            ["task"],
            registry=registry,
        )
        self.dead_pod_cuts = Children(
            Counter(
                "kvgate_dead_pod_cuts",
                "Requests in flight cut because their pod left discovery or failed its health "
                "checks for longer than KVGATE_DEAD_POD_GRACE (each a client that saw its "
                "answer break off, or its request fail over)",
                ["pod"],
                registry=registry,
            )
        )

    def discovery_events(self) -> DiscoveryEvents:
        """What a discovery source reports to: these counters."""
        errors = self.discovery_errors
        return DiscoveryEvents(error=lambda _error: errors.inc(), relist=self.discovery_relists.inc)

    def known_pod(self, pod: Pod) -> None:
        self.dead_pod_cuts.labels(pod.name)
