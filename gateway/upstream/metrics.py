"""The upstream exchange's metrics: every request proxied and every attempt, by pod and
outcome; what is in flight; the engines' first bytes; failed scrapes."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from gateway.control.discovery import Pod
from gateway.observability.children import Children
from gateway.observability.histograms import LabelledHistogram

_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_GATEWAY_STATUSES = ("200", "502", "504", "cut", "client_disconnect")
"""Statuses of `kvgate_requests_total` / outcomes of `kvgate_upstream_attempts_total`
exported at 0 per pod: success and every end the gateway itself gives an answer (an
engine's own 4xx/5xx appear with their first occurrence)."""
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "status_5xx", "midstream")


class UpstreamMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.requests = Children(
            Counter(
                "kvgate_requests",
                "Proxied requests (picked ones under `kvgate epp`), each once, by model, the pod "
                "that answered (or was tried last), policy and the status the client saw (cut / "
                "client_disconnect: ended mid-answer)",
                ["model", "pod", "policy", "status"],
                registry=registry,
            )
        )
        self.attempts = Children(
            Counter(
                "kvgate_upstream_attempts",
                "Every attempt to a pod (a retried request makes two), by pod and outcome",
                ["pod", "outcome"],
                registry=registry,
            )
        )
        self.inflight = Children(
            Gauge(
                "kvgate_inflight_requests",
                "Requests being proxied (or picked and not yet answered whole), by pod",
                ["pod"],
                registry=registry,
            )
        )
        self.upstream_errors = Children(
            Counter(
                "kvgate_upstream_errors",
                "Failed upstream attempts, by pod and kind (connect, timeout, status_5xx, "
                "midstream)",
                ["pod", "kind"],
                registry=registry,
            )
        )
        self.retries = Children(
            Counter(
                "kvgate_upstream_retries",
                "Requests retried on another pod before any byte was sent",
                ["pod"],
                registry=registry,
            )
        )
        self.ttft = LabelledHistogram(
            "kvgate_upstream_first_byte_seconds",
            "Time from dispatch to the engine's first response byte, by pod",
            ["pod"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self.scrape_failures = Children(
            Counter(
                "kvgate_scrape_failures",
                "Failed scrapes of a pod's /metrics, by pod and reason: unreachable (connect, "
                "broken answer), timeout, status (5xx), too_large (a page over the size bound)",
                ["pod", "reason"],
                registry=registry,
            )
        )

    def known_pod(self, pod: Pod, policy: str) -> None:
        """`pod`'s series and its models' requests, at 0 until their first increment.
        Requests are exported at 0 under the default `policy`; a policy a request names
        appears with its first request."""
        name = pod.name
        self.retries.labels(name)
        self.inflight.labels(name)
        self.ttft.labels(name)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(name, kind)
        for outcome in _GATEWAY_STATUSES:
            self.attempts.labels(name, outcome)
        for model in (pod.model, *pod.loras):
            for status in _GATEWAY_STATUSES:
                self.requests.labels(model, name, policy, status)
