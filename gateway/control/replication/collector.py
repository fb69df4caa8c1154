"""The replica channel's figures at scrape time (zero / empty without replica sync)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gateway.control.replication.channel import ReplicaSync

REJECT_REASONS = (
    "undecodable", "malformed", "unknown_pod", "unknown_model", "index_full", "excess_load",
    "rate_limited", "too_many_peers", "peer_lookup_failed", "refused_key", "handshake_failed",
)  # fmt: skip
"""Every reason a peer's message or connection is refused (each exported from 0)."""


class ReplicaSyncCollector(Collector):
    def __init__(self, sync: Callable[[], ReplicaSync | None]) -> None:
        self._sync = sync

    def collect(self) -> Iterator[Metric]:
        sync = self._sync()
        live = GaugeMetricFamily(
            "kvgate_replica_sync_peers_live", "Peer replicas heard from within the timeout"
        )
        live.add_metric([], float(sync.live_peers()) if sync is not None else 0.0)
        messages = CounterMetricFamily(
            "kvgate_replica_sync_messages",
            "Decision-sharing messages by direction (sent, received, dropped at the send "
            "queue's limit) and kind (d decision, b first byte, f end, h heartbeat)",
            labels=["direction", "kind"],
        )
        rejected = CounterMetricFamily(
            "kvgate_replica_sync_rejected",
            "Peer messages ignored and connections refused, by reason: "
            + ", ".join(REJECT_REASONS),
            labels=["reason"],
        )
        losses = CounterMetricFamily(
            "kvgate_replica_sync_peer_losses",
            "Times a peer fell silent with requests in flight (its requests were dropped)",
        )
        expired = CounterMetricFamily(
            "kvgate_replica_sync_expired_requests",
            "Peer requests dropped because they were older than the bound on a peer "
            "request's life (60 s), while their peer was live",
        )
        cpu = CounterMetricFamily(
            "kvgate_replica_sync_cpu_seconds",
            "CPU time of the event loop's thread spent on the sharing channel: encoding and "
            "sending this replica's messages, receiving and applying the peers'",
        )
        if sync is not None:
            for kind, count in sync.sent.items():
                messages.add_metric(["sent", kind], float(count))
            for kind, count in sync.received.items():
                messages.add_metric(["received", kind], float(count))
            messages.add_metric(["dropped", "any"], float(sync.dropped))
            for reason in REJECT_REASONS:
                rejected.add_metric([reason], float(sync.rejected[reason]))
        losses.add_metric([], float(sync.losses) if sync is not None else 0.0)
        expired.add_metric([], float(sync.expired) if sync is not None else 0.0)
        cpu.add_metric([], sync.cpu_s if sync is not None else 0.0)
        yield live
        yield messages
        yield rejected
        yield losses
        yield expired
        yield cpu
