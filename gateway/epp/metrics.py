"""The endpoint picker's metrics (`kvgate epp`): its picks, its refusals' share of them,
how long a pick takes, and the ext_proc streams it ended with a gRPC error. A refusal is
also counted by reason in `kvgate_requests_rejected_total`, as the proxy counts it."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

from gateway.observability.children import Children

PICK_RESULTS = ("picked", "refused")
STREAM_ERROR_CODES = ("INVALID_ARGUMENT", "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION")
_PICK_BUCKETS = (0.0002, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)


class EppMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.picks = Children(
            Counter(
                "kvgate_epp_picks",
                "Requests the endpoint picker answered, by result: picked (an endpoint named) or "
                "refused (an ImmediateResponse; its reason in kvgate_requests_rejected_total)",
                ["result"],
                registry=registry,
            )
        )
        for result in PICK_RESULTS:
            self.picks.labels(result)
        self.stream_errors = Children(
            Counter(
                "kvgate_epp_stream_errors",
                "ext_proc streams the picker ended with a gRPC error, by code: INVALID_ARGUMENT "
                "(a message out of order or unreadable), RESOURCE_EXHAUSTED, FAILED_PRECONDITION "
                "(no request body configured)",
                ["code"],
                registry=registry,
            )
        )
        for code in STREAM_ERROR_CODES:
            self.stream_errors.labels(code)
        self.pick_seconds = Histogram(
            "kvgate_epp_pick_seconds",
            "From a request's last body byte at the picker to its answer naming the endpoint",
            buckets=_PICK_BUCKETS,
            registry=registry,
        )
