"""Index snapshots: periodic per-pod files, start-up restore and resume, peer bootstrap."""

from gateway.control.persistence.files import SnapshotDir, file_name
from gateway.control.persistence.lifecycle import restore_snapshots, snapshot_writer
from gateway.control.persistence.metrics import BootstrapMetrics, SnapshotMetrics
from gateway.control.persistence.peer import bootstrap_from_peer, cost_model_from_peer
from gateway.control.persistence.snapshots import SnapshotRestorer, capture_pod
from gateway.control.persistence.writer import SnapshotWriter

__all__ = [
    "BootstrapMetrics",
    "SnapshotDir",
    "SnapshotMetrics",
    "SnapshotRestorer",
    "SnapshotWriter",
    "bootstrap_from_peer",
    "capture_pod",
    "cost_model_from_peer",
    "file_name",
    "restore_snapshots",
    "snapshot_writer",
]
