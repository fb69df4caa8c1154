"""What the app's lifespan calls: restore at start-up, and the writer it runs."""

from __future__ import annotations

import functools

import httpx
from prometheus_client import CollectorRegistry

from gateway.errors import ConfigError
from gateway.persistence.files import SnapshotDir
from gateway.persistence.metrics import SnapshotMetrics
from gateway.persistence.peer import bootstrap_from_peer
from gateway.persistence.snapshots import SnapshotRestorer, capture_pod
from gateway.persistence.writer import SnapshotWriter
from gateway.registry import PodRegistry
from gateway.settings import Settings
from indexer import SyncPrefixHashTable
from subscriber import SubscriberManager


async def restore_snapshots(
    settings: Settings,
    table: SyncPrefixHashTable,
    metrics_registry: CollectorRegistry,
    client: httpx.AsyncClient,
) -> SnapshotRestorer:
    """Load the snapshot files, then the peer's (which win: they are the fresher view);
    they are restored when discovery starts each pod's subscriber."""
    restorer = SnapshotRestorer(table, SnapshotMetrics(metrics_registry))
    if settings.snapshot_dir is not None:
        directory = SnapshotDir(settings.snapshot_dir)
        try:
            await restorer.load_dir(directory, settings.snapshot_max_bytes)
        except OSError as exc:  # the directory itself: a configuration error, said once
            allowed = f"a directory the gateway can create and read ({exc.strerror})"
            raise ConfigError("KVGATE_SNAPSHOT_DIR", str(directory.path), allowed) from None
    if settings.bootstrap_peer is not None:
        await bootstrap_from_peer(
            client,
            settings.bootstrap_peer,
            settings.admin_token,
            restorer,
            max_bytes=settings.snapshot_max_bytes,
        )
    return restorer


def snapshot_writer(
    settings: Settings,
    table: SyncPrefixHashTable,
    subscribers: SubscriberManager | None,
    pods: PodRegistry,
    restorer: SnapshotRestorer | None,
) -> SnapshotWriter | None:
    """The periodic writer, when KVGATE_SNAPSHOT_DIR is set (and KV events are on)."""
    if settings.snapshot_dir is None or subscribers is None or restorer is None:
        return None
    return SnapshotWriter(
        SnapshotDir(settings.snapshot_dir),
        capture=functools.partial(capture_pod, table, subscribers),
        pods=lambda: [state.name for state in pods.all()],
        metrics=restorer.metrics,
        interval_s=settings.snapshot_interval_s,
        max_bytes=settings.snapshot_max_bytes,
    )
