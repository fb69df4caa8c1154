"""The routing decision's metrics: its latency by stage and by plugin, the cost model's
prediction errors, SLO outcomes, prompt and matched blocks, tokenizations."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from gateway.control.discovery import Pod
from gateway.observability.children import Children
from gateway.observability.histograms import HistogramSeries, LabelledHistogram

_LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
)  # fmt: skip
_PLUGIN_BUCKETS = (5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 1e-2, 0.1)
_ERROR_BUCKETS = (
    -5.0, -2.5, -1.0, -0.5, -0.25, -0.1, -0.05, -0.025, -0.01, 0.0,
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
)  # fmt: skip
_TPOT_ERROR_BUCKETS = (
    -0.1, -0.05, -0.025, -0.01, -0.005, -0.0025, -0.001, 0.0,
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
)  # fmt: skip
SLO_OUTCOMES = ("predicted_met", "predicted_missed", "observed_met", "observed_missed", "shed")
DEGRADED_ROUTING_REASONS = ("tokenizer",)


class RouterMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.decision_seconds = LabelledHistogram(
            "kvgate_decision_seconds",
            "Routing decision latency by stage (tokenize, match, decide, total)",
            ["stage"],
            buckets=_LATENCY_BUCKETS,
            registry=registry,
        )
        self.plugin_seconds = LabelledHistogram(
            "kvgate_routing_plugin_seconds",
            "Time each routing plugin (filter, scorer, picker, preference) took per decision",
            ["plugin"],
            buckets=_PLUGIN_BUCKETS,
            registry=registry,
        )
        self._plugin_children: dict[str, HistogramSeries] = {}
        self._predictions(registry)
        self._requests(registry)
        for result in ("hit", "miss", "failure"):
            for where in ("local", "remote"):
                self.tokenizer.labels(result, where)
        for outcome in SLO_OUTCOMES:
            self.slo.labels(outcome)
            self.slo_tpot.labels(outcome)
        for reason in DEGRADED_ROUTING_REASONS:
            self.degraded_routing.labels(reason)

    def _predictions(self, registry: CollectorRegistry) -> None:
        """The predictions' errors and the objectives' outcomes."""
        self.prediction_error = LabelledHistogram(
            "kvgate_ttft_prediction_error_seconds",
            "Observed minus predicted time to first byte of streamed answers, by pod",
            ["pod"],
            buckets=_ERROR_BUCKETS,
            registry=registry,
        )
        self.slo = Children(
            Counter(
                "kvgate_slo_ttft",
                "Requests with a TTFT objective (x-slo-ttft-ms), by outcome: predicted_met, "
                "predicted_missed (at decision), observed_met, observed_missed (first byte), shed",
                ["outcome"],
                registry=registry,
            )
        )
        self.tpot_prediction_error = LabelledHistogram(
            "kvgate_tpot_prediction_error_seconds",
            "Observed minus predicted time per output token of streamed answers, by pod",
            ["pod"],
            buckets=_TPOT_ERROR_BUCKETS,
            registry=registry,
        )
        self.slo_tpot = Children(
            Counter(
                "kvgate_slo_tpot",
                "Streamed requests with a time-per-output-token objective (x-slo-tpot-ms), by "
                "outcome: predicted_met, predicted_missed (at decision), observed_met, "
                "observed_missed (at the answer's end), shed",
                ["outcome"],
                registry=registry,
            )
        )

    def _requests(self, registry: CollectorRegistry) -> None:
        """What the routed requests' prompts held, and how they were tokenized."""
        self.prompt_blocks = Children(
            Counter(
                "kvgate_prompt_blocks",
                "Full prompt blocks of routed requests",
                ["model"],
                registry=registry,
            )
        )
        self.matched_blocks = Children(
            Counter(
                "kvgate_matched_blocks",
                "Prompt blocks the chosen pod already held when it was chosen",
                ["model"],
                registry=registry,
            )
        )
        self.degraded_routing = Children(
            Counter(
                "kvgate_degraded_routing",
                "Requests routed on load only, by reason (tokenizer failure, no index...)",
                ["reason"],
                registry=registry,
            )
        )
        self.tokenizer = Children(
            Counter(
                "kvgate_tokenizer_requests",
                "Prompt tokenizations by result (hit: from the cache, miss, failure) and "
                "tokenizer (local: in-process with the model's files; remote: an engine's "
                "/tokenize)",
                ["result", "tokenizer"],
                registry=registry,
            )
        )

    def known_pod(self, pod: Pod) -> None:
        """`pod`'s series and its models', at 0 until their first increment."""
        self.prediction_error.labels(pod.name)
        self.tpot_prediction_error.labels(pod.name)
        for model in (pod.model, *pod.loras):
            self.prompt_blocks.labels(model)
            self.matched_blocks.labels(model)

    def time_plugin(self, plugin: str, seconds: float) -> None:
        """A routing plugin's time in one decision (children cached: this runs per plugin
        per request)."""
        child = self._plugin_children.get(plugin)
        if child is None:
            child = self._plugin_children[plugin] = self.plugin_seconds.labels(plugin)
        child.observe(seconds)
