"""Metrics of index snapshots and of a peer bootstrap (on the gateway's injected registry)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

from predictor import REASONS

SOURCES = ("file", "peer")
IGNORED_REASONS = (
    "truncated", "bad_magic", "checksum", "malformed", "non_finite", "out_of_range",
    "unsupported_version", "too_large", "unreadable", "model_mismatch", "endpoint_mismatch",
    "config_mismatch", "peer_unavailable",
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
            "malformed, non_finite, out_of_range, unsupported_version, too_large, unreadable), "
            "another engine or configuration (model_mismatch, endpoint_mismatch, "
            "config_mismatch), or a peer that could not give one (peer_unavailable)",
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


class BootstrapMetrics:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.rejected = Counter(
            "kvgate_bootstrap_rejected",
            "A bootstrap peer's cost model not taken (the replica starts from the prior), by "
            "reason: peer_unavailable, too_large, malformed, non_finite, out_of_range, "
            "unsupported_version",
            ["reason"],
            registry=registry,
        )
        for reason in REASONS:
            self.rejected.labels(reason)
