"""Metrics of index snapshots (on the gateway's injected registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

SOURCES = ("file", "peer")
IGNORED_REASONS = (
    "truncated", "bad_magic", "checksum", "malformed", "unsupported_version", "too_large",
    "unreadable", "model_mismatch", "endpoint_mismatch", "config_mismatch", "peer_unavailable",
)  # fmt: skip
WRITE_OUTCOMES = ("ok", "too_large", "error")


class SnapshotMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.restored = Counter(
            "kvgate_snapshots_restored",
            "Pods whose index was restored from a snapshot at start-up, by source (file, peer)",
            ["source"],
            registry=registry,
        )
        self.ignored = Counter(
            "kvgate_snapshots_ignored",
            "Snapshots not used, by reason: a bad file (truncated, bad_magic, checksum, "
            "malformed, unsupported_version, too_large, unreadable), another engine or "
            "configuration (model_mismatch, endpoint_mismatch, config_mismatch), or a peer "
            "that could not give one (peer_unavailable)",
            ["reason"],
            registry=registry,
        )
        self.writes = Counter(
            "kvgate_snapshot_writes",
            "Snapshot file writes by outcome (ok, too_large, error)",
            ["outcome"],
            registry=registry,
        )
        # each series at 0 until its first increment (rate() sees the first one)
        for source in SOURCES:
            self.restored.labels(source)
        for reason in IGNORED_REASONS:
            self.ignored.labels(reason)
        for outcome in WRITE_OUTCOMES:
            self.writes.labels(outcome)
