"""Prometheus metrics (`kvgate_` prefix) on an injected registry.

Request-path metrics are updated as requests flow; fleet state (pods, subscribers, index)
is read when Prometheus scrapes, by a collector, so it costs nothing between scrapes.

Every counter series whose labels are known in advance is exported at 0 before its first
increment: enumerated labels (reasons, outcomes, kinds) from the start, a pod's or a
model's series as soon as discovery reports the pod (`known_pod`). A series that first
appears at 5 gives `rate()` and `increase()` nothing to compare its first burst with, so
that burst would never show on a dashboard nor fire an alert.
"""

from __future__ import annotations

import asyncio
import platform
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    GCCollector,
    Info,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.discovery import Pod
from gateway.control.registry import PodRegistry
from gateway.errors import GatewayError
from gateway.observability.histograms import HistogramSeries, LabelledHistogram
from gateway.routing.cost import FEATURES, CostModel
from gateway.version import version
from indexer import SyncPrefixHashTable
from subscriber import DECODE_REASONS, RESET_CAUSES, RejectCounter

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
_DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 30.0, 60.0, 120.0, 300.0)
_TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


_GATEWAY_STATUSES = ("200", "502", "504", "cut", "client_disconnect")
"""Statuses of `kvgate_requests_total` / outcomes of `kvgate_upstream_attempts_total`
exported at 0 per pod: success and every end the gateway itself gives an answer (an
engine's own 4xx/5xx appear with their first occurrence)."""
UPSTREAM_ERROR_KINDS = ("connect", "timeout", "status_5xx", "midstream")
TOKEN_SOURCES = ("engine", "gateway")
SLO_OUTCOMES = ("predicted_met", "predicted_missed", "observed_met", "observed_missed", "shed")
PIN_OPS = ("pin", "unpin")
PIN_OUTCOMES = ("ok", "error")
PIN_REFUSALS = ("budget", "no_pin_support", "unknown_capacity", "no_kv_events")
DEGRADED_ROUTING_REASONS = ("tokenizer",)


def _error_names(root: type[GatewayError] = GatewayError) -> list[str]:
    """`kvgate_requests_rejected_total{reason}`: the gateway's error classes by name."""
    names = []
    for error in root.__subclasses__():
        names += [error.__name__, *_error_names(error)]
    return names


_Metric = TypeVar("_Metric", Counter, Gauge)
_MAX_CHILDREN = 10_000


class Children(Generic[_Metric]):
    """A labelled metric's children from a dict: prometheus_client's `labels()` checks the
    values and takes a lock on every call (~2 µs), and a request looks up about ten. Label
    series are never removed here, so a remembered child is always the live one."""

    __slots__ = ("_children", "metric")

    def __init__(self, metric: _Metric) -> None:
        self.metric: _Metric = metric
        self._children: dict[tuple[str, ...], _Metric] = {}

    def labels(self, *values: str) -> _Metric:
        child = self._children.get(values)
        if child is None:
            if len(self._children) >= _MAX_CHILDREN:  # bounded whatever the label values
                self._children.clear()
            child = self._children[values] = self.metric.labels(*values)
        return child


class GatewayMetrics:
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
        self.requests = Children(
            Counter(
                "kvgate_requests",
                "Proxied requests, each once, by model, the pod that answered (or was tried "
                "last), policy and the status the client saw (cut / client_disconnect: ended "
                "mid-answer)",
                ["model", "pod", "policy", "status"],
                registry=registry,
            )
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
        self.attempts = Children(
            Counter(
                "kvgate_upstream_attempts",
                "Every attempt to a pod (a retried request makes two), by pod and outcome",
                ["pod", "outcome"],
                registry=registry,
            )
        )
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
        self.scrape_failures = Children(
            Counter(
                "kvgate_scrape_failures",
                "Failed scrapes of a pod's /metrics, by pod and reason: unreachable (connect, "
                "broken answer), timeout, status (5xx), too_large (a page over the size bound)",
                ["pod", "reason"],
                registry=registry,
            )
        )
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
        self.inflight = Children(
            Gauge(
                "kvgate_inflight_requests",
                "Requests being proxied, by pod",
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
        for result in ("hit", "miss", "failure"):
            for where in ("local", "remote"):
                self.tokenizer.labels(result, where)
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
        self.pins_active = Gauge(
            "kvgate_pins_active", "Live pin leases, by pod", ["pod"], registry=registry
        )
        self.pinned_blocks = Gauge(
            "kvgate_pinned_blocks",
            "Engine blocks the gateway holds pinned, by pod",
            ["pod"],
            registry=registry,
        )
        self.pin_calls = Counter(
            "kvgate_pin_calls",
            "Engine pin/unpin calls, by op (pin, unpin) and outcome (ok, error)",
            ["op", "outcome"],
            registry=registry,
        )
        self.pin_lease_expiries = Counter(
            "kvgate_pin_lease_expiries", "Pin leases unpinned because their TTL ran out",
            registry=registry,
        )  # fmt: skip
        self.repins = Counter(
            "kvgate_repins", "Leases pinned again after the engine lost their pins",
            registry=registry,
        )  # fmt: skip
        self.pin_refusals = Counter(
            "kvgate_pin_refusals",
            "Pins refused, by reason (budget, no_pin_support, unknown_capacity, no_kv_events)",
            ["reason"],
            registry=registry,
        )
        self._at_zero()

    def _at_zero(self) -> None:
        """Every series of an enumerated label, at 0 from the start."""
        for reason in _error_names():
            self.rejected.labels(reason)
        for outcome in SLO_OUTCOMES:
            self.slo.labels(outcome)
            self.slo_tpot.labels(outcome)
        for reason in DEGRADED_ROUTING_REASONS:
            self.degraded_routing.labels(reason)
        for op in PIN_OPS:
            for outcome in PIN_OUTCOMES:
                self.pin_calls.labels(op, outcome)
        for reason in PIN_REFUSALS:
            self.pin_refusals.labels(reason)

    def known_pod(self, pod: Pod, policy: str) -> None:
        """`pod` is known (discovery reported it; again at each update): its series and its
        models' series, at 0 until their first increment. Requests are exported at 0 under
        the default `policy`; a policy a request names appears with its first request."""
        name = pod.name
        self.dead_pod_cuts.labels(name)
        self.retries.labels(name)
        self.inflight.labels(name)
        self.ttft.labels(name)
        self.prediction_error.labels(name)
        self.tpot_prediction_error.labels(name)
        for kind in UPSTREAM_ERROR_KINDS:
            self.upstream_errors.labels(name, kind)
        for outcome in _GATEWAY_STATUSES:
            self.attempts.labels(name, outcome)
        for model in (pod.model, *pod.loras):
            for status in _GATEWAY_STATUSES:
                self.requests.labels(model, name, policy, status)
            self.prompt_blocks.labels(model)
            self.matched_blocks.labels(model)
            self.model_ttft.labels(model)
            self.model_duration.labels(model)
            for source in TOKEN_SOURCES:
                self.prompt_tokens.labels(model, source)
                self.completion_tokens.labels(model, source)

    def time_plugin(self, plugin: str, seconds: float) -> None:
        """A routing plugin's time in one decision (children cached: this runs per plugin
        per request)."""
        child = self._plugin_children.get(plugin)
        if child is None:
            child = self._plugin_children[plugin] = self.plugin_seconds.labels(plugin)
        child.observe(seconds)

    def watch_fleet(
        self,
        pods: PodRegistry,
        table: SyncPrefixHashTable,
        rejects: Callable[[], RejectCounter | None],
        cost: CostModel,
    ) -> None:
        self.prometheus.register(_FleetCollector(pods, table, rejects, cost))


@dataclass(frozen=True, slots=True)
class _FleetCollector(Collector):
    pods: PodRegistry
    table: SyncPrefixHashTable
    rejects: Callable[[], RejectCounter | None]
    cost: CostModel

    def collect(self) -> Iterator[Metric]:
        yield from self._pods()
        yield from self._subscribers()
        yield from self._index()
        yield from self._event_loop()

    def _pods(self) -> Iterator[Metric]:
        healthy = GaugeMetricFamily(
            "kvgate_pod_healthy", "1 if the pod is routable", labels=["pod"]
        )
        load = GaugeMetricFamily(
            "kvgate_pod_load", "Engine load as scraped (running, waiting, kv_usage)",
            labels=["pod", "gauge"],
        )  # fmt: skip
        coefficients = GaugeMetricFamily(
            "kvgate_cost_model_coefficient",
            "The TTFT model as it applies to the pod (the fleet's coefficients x the pod's "
            "learned speed): seconds per unit of each term (base; per 1,000 prefill tokens "
            "pending; per 10 pending requests; per 10 decoding sequences; busy; per second left "
            "in the current step, not scaled; per 1,000 tokens in the current step)",
            labels=["pod", "term"],
        )
        queued = GaugeMetricFamily(
            "kvgate_queued_prefill_tokens",
            "Uncached prompt tokens this gateway sent to the pod whose first byte has not come "
            "back (the cost model's queue), in prefill work: each request's attention over its "
            "cached context included (KVGATE_COST_CONTEXT_SHARE)",
            labels=["pod"],
        )
        unindexable = GaugeMetricFamily(
            "kvgate_pod_unindexable",
            "1 if the pod publishes KV events none of which can be indexed (every block breaks "
            "its chain); routed from the gateway's own entries meanwhile",
            labels=["pod"],
        )
        for state in self.pods.all():
            healthy.add_metric([state.name], float(state.pod.ready and state.healthy))
            unindexable.add_metric([state.name], float(self.pods.index_mode(state.name)
                                                       == "unindexable"))  # fmt: skip
            load.add_metric([state.name, "running"], state.running)
            load.add_metric([state.name, "waiting"], state.waiting)
            load.add_metric([state.name, "kv_usage"], state.kv_usage)
            theta = self.cost.coefficients(state.name)
            for term, value in zip(FEATURES, theta, strict=True):
                coefficients.add_metric([state.name, term], value)
            queued.add_metric([state.name], self.cost.outstanding(state.name)[0])
        yield healthy
        yield load
        yield unindexable
        yield coefficients
        yield queued

    def _subscribers(self) -> Iterator[Metric]:
        families = {
            "connected": GaugeMetricFamily(
                "kvgate_subscriber_connected", "1 if the event socket is connected", labels=["pod"]
            ),
            "last_seq": GaugeMetricFamily(
                "kvgate_subscriber_last_seq", "Last applied batch seq", labels=["pod"]
            ),
            "degraded": GaugeMetricFamily(
                "kvgate_subscriber_degraded", "1 if the pod's index may miss blocks", labels=["pod"]
            ),
        }  # fmt: skip
        counters = {
            name: CounterMetricFamily(f"kvgate_subscriber_{name}", help_text, labels=["pod"])
            for name, help_text in (
                (
                    "replays",
                    "Replays requested to recover or verify the pod's history (a gap, "
                    "a reconnect, a restart; idle probes are counted apart)",
                ),
                ("idle_probes", "Replay checks after a silence (no batch for a while)"),
                ("restarts", "Engine restarts detected"),
                ("gaps", "Sequence gaps detected"),
                ("batches_applied", "Event batches applied to the index"),
                ("live_dropped", "Live batches dropped by the bounded queue (replayed later)"),
                ("refused_peers", "Publishers refused on a bound event socket (not the pod)"),
            )
        }
        for state in self.pods.all():
            status = self.pods.subscriber_status(state.name)
            if status is None:
                continue
            families["connected"].add_metric([state.name], float(status.connected))
            families["last_seq"].add_metric([state.name], float(status.last_seq or 0))
            families["degraded"].add_metric([state.name], float(not status.whole))
            for name, family in counters.items():
                family.add_metric([state.name], float(getattr(status, name)))
        broken = CounterMetricFamily(
            "kvgate_subscriber_broken_chain_blocks",
            "Stored blocks not indexed because their parent was unknown",
            labels=["pod"],
        )
        for state in self.pods.all():
            if self.table.has_pod(state.name):
                count = self.table.rejected_blocks(state.name).get("broken_chain", 0)
                broken.add_metric([state.name], float(count))
        resets = CounterMetricFamily(
            "kvgate_subscriber_index_resets",
            "Times a pod's index was thrown away, by cause: engine_restart, replay_unavailable "
            "(rebuilt from live batches), replay_overrun, cleared (AllBlocksCleared)",
            labels=["pod", "cause"],
        )
        for state in self.pods.all():
            status = self.pods.subscriber_status(state.name)
            if status is not None:
                for cause in RESET_CAUSES:
                    resets.add_metric([state.name, cause], float(status.resets.get(cause, 0)))
        yield from families.values()
        yield from counters.values()
        yield broken
        yield resets
        rejected = CounterMetricFamily(
            "kvgate_subscriber_rejected_frames", "Frames that could not be decoded",
            labels=["pod", "reason"],
        )  # fmt: skip
        counter = self.rejects()
        if counter is not None:
            counts = counter.snapshot()
            subscribed = [s.name for s in self.pods.all() if self.pods.subscriber_status(s.name)]
            for pod in subscribed:
                for reason in sorted(DECODE_REASONS):
                    rejected.add_metric([pod, reason], float(counts.get((pod, reason), 0)))
            for (pod, reason), count in counts.items():
                if pod not in subscribed:  # a pod gone since (its count stays until then)
                    rejected.add_metric([pod, reason], float(count))
        yield rejected

    def _event_loop(self) -> Iterator[Metric]:
        # A task leak (one per request or per reconnect) shows here long before in RSS.
        tasks = GaugeMetricFamily(
            "kvgate_process_asyncio_tasks", "asyncio tasks alive in the gateway's event loop"
        )
        try:
            tasks.add_metric([], float(len(asyncio.all_tasks())))
        except RuntimeError:  # collected outside the event loop's thread: no figure
            return
        yield tasks

    def _index(self) -> Iterator[Metric]:
        stats = self.table.stats()
        size = GaugeMetricFamily("kvgate_index_size", "Index size", labels=["kind"])
        for kind in ("pods", "contexts", "blocks", "pairs", "engine_entries", "expected"):
            size.add_metric([kind], float(getattr(stats, kind)))
        yield size
        events = CounterMetricFamily(
            "kvgate_index_events", "Index bookkeeping events", labels=["kind"]
        )
        for kind in (
            "broken_chain_events",
            "broken_chain_blocks",
            "unknown_removals",
            "remapped",
            "evicted_blocks",
            "evicted_contexts",
            "expired_expected",
            "eviction_runs",
        ):
            events.add_metric([kind], float(getattr(stats, kind)))
        yield events
        rejected = CounterMetricFamily(
            "kvgate_index_rejected_blocks",
            "Stored blocks not indexed, by reason",
            labels=["reason"],
        )
        for reason, count in stats.rejected_blocks.items():
            rejected.add_metric([reason], float(count))
        yield rejected
