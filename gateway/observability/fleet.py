"""The fleet's state as Prometheus reads it: pods, their subscribers, the index and the
event loop, collected when Prometheus scrapes, so it costs nothing between scrapes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.registry import PodRegistry
from indexer import SyncPrefixHashTable
from predictor import FEATURES, Predictor
from subscriber import DECODE_REASONS, RESET_CAUSES, RejectCounter


@dataclass(frozen=True, slots=True)
class FleetCollector(Collector):
    pods: PodRegistry
    table: SyncPrefixHashTable
    rejects: Callable[[], RejectCounter | None]
    cost: Predictor

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
