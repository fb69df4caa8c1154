"""The HTTP layer's metrics: refusals, replaced headers, and per model, the time to the
answer's first byte and its end and the tokens it carried."""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter

from gateway.errors import GatewayError
from gateway.observability.children import Children
from gateway.observability.histograms import LabelledHistogram

_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
TOKEN_SOURCES = ("engine", "gateway")


def _error_names(root: type[GatewayError] = GatewayError) -> list[str]:
    """`kvgate_requests_rejected_total{reason}`: the gateway's error classes by name."""
    names = []
    for error in root.__subclasses__():
        names += [error.__name__, *_error_names(error)]
    return names


class HttpMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rejected = Children(
            Counter(
                "kvgate_requests_rejected",
                "Requests answered by the gateway itself with an error, by reason",
                ["reason"],
                registry=registry,
            )
        )
        for reason in ("TooManyRequests", "RequestTimeout"):  # the limits': at 0 from the start
            self.rejected.labels(reason)
        for reason in _error_names():
            self.rejected.labels(reason)
        self.invalid_headers = Children(
            Counter(
                "kvgate_invalid_headers",
                "Client headers the gateway replaced instead of passing on, by header: an "
                "unacceptable x-request-id (a new id is made), an invalid or oversized "
                "traceparent (a new trace is started, tracestate dropped)",
                ["header"],
                registry=registry,
            )
        )
        for header in ("x-request-id", "traceparent"):
            self.invalid_headers.labels(header)
        self.model_ttft = LabelledHistogram(
            "kvgate_time_to_first_byte_seconds",
            "Chat and completion requests: from the complete request to the first body byte "
            "of the answer (the engine's first token when streamed), by model",
            ["model"],
            buckets=_TTFT_BUCKETS,
            registry=registry,
        )
        self.model_duration = LabelledHistogram(
            "kvgate_request_duration_seconds",
            "Chat and completion requests: from the complete request to the answer's last "
            "byte (or its failure), by model",
            ["model"],
            buckets=_DURATION_BUCKETS,
            registry=registry,
        )
        self.prompt_tokens = Children(
            Counter(
                "kvgate_prompt_tokens",
                "Prompt tokens of answered (2xx) chat and completion requests, by model; source: "
                "`engine` (the answer's usage) or `gateway` (its own tokenization, for streams "
                "without usage)",
                ["model", "source"],
                registry=registry,
            )
        )
        self.completion_tokens = Children(
            Counter(
                "kvgate_completion_tokens",
                "Completion tokens relayed in answered (2xx) chat and completion requests, by "
                "model; source: `engine` (the answer's usage) or `gateway` (one per streamed "
                "event, for streams without usage)",
                ["model", "source"],
                registry=registry,
            )
        )

    def known_models(self, models: Iterable[str]) -> None:
        """Each model's series, at 0 until their first increment."""
        for model in models:
            self.model_ttft.labels(model)
            self.model_duration.labels(model)
            for source in TOKEN_SOURCES:
                self.prompt_tokens.labels(model, source)
                self.completion_tokens.labels(model, source)
