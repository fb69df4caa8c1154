"""What the app's lifespan calls: restore at start-up, and the writer it runs."""

from __future__ import annotations

import asyncio
import functools
import json
import logging

import httpx
from prometheus_client import CollectorRegistry

from gateway.control.persistence.files import SnapshotDir, SnapshotFile
from gateway.control.persistence.metrics import SnapshotMetrics
from gateway.control.persistence.peer import bootstrap_from_peer
from gateway.control.persistence.snapshots import SnapshotRestorer, capture_pod
from gateway.control.persistence.writer import SnapshotWriter
from gateway.control.registry import PodRegistry
from gateway.errors import ConfigError
from gateway.settings import Settings
from indexer import SyncPrefixHashTable
from predictor import MAX_EXPORT_BYTES, CostStateError, Predictor, parse_export
from subscriber import SubscriberManager

logger = logging.getLogger(__name__)


async def restore_snapshots(
    settings: Settings,
    table: SyncPrefixHashTable,
    metrics_registry: CollectorRegistry,
    client: httpx.AsyncClient,
    cost: Predictor,
) -> SnapshotRestorer:
    """Load the snapshot files, then the peer's (which win: they are the fresher view);
    they are restored when discovery starts each pod's subscriber. The cost model's file
    fills in what `cost` has not taken from a peer already."""
    restorer = SnapshotRestorer(table, SnapshotMetrics(metrics_registry))
    if settings.snapshot_dir is not None:
        directory = SnapshotDir(settings.snapshot_dir)
        try:
            await restorer.load_dir(directory, settings.snapshot_max_bytes)
            found = await asyncio.to_thread(directory.read_cost_model, MAX_EXPORT_BYTES)
        except OSError as exc:  # the directory itself: a configuration error, said once
            allowed = f"a directory the gateway can create and read ({exc.strerror})"
            raise ConfigError("KVGATE_SNAPSHOT_DIR", str(directory.path), allowed) from None
        if found is not None:
            await _restore_cost_model(cost, found, restorer.metrics)
    if settings.bootstrap_peer is not None:
        await bootstrap_from_peer(
            client,
            settings.bootstrap_peer,
            settings.admin_token,
            restorer,
            max_bytes=settings.snapshot_max_bytes,
        )
    return restorer


async def _restore_cost_model(
    cost: Predictor, found: SnapshotFile, metrics: SnapshotMetrics
) -> None:
    """Checked like a peer's (`cost_state.py`): a file of another version, shape or range
    gives nothing. What a peer gave is kept."""
    try:
        if found.data is None:
            raise CostStateError(found.error or "unreadable", "not read")
        taken = cost.adopt(await asyncio.to_thread(parse_export, found.data))
    except CostStateError as exc:
        metrics.ignored.labels(exc.reason).inc()
        logger.warning("cost model file %s not used (%s: %s)", found.path, exc.reason, exc.detail)
        return
    logger.info("cost model file %s: %d parts taken (the fleet's model and pods' speeds)",
                found.path, taken)  # fmt: skip


def _cost_model_file(cost: Predictor) -> bytes | None:
    """What the cost model's file holds now; None until it has learned anything."""
    if not cost.fleet.observations:
        return None
    return json.dumps(cost.export(), sort_keys=True).encode()


def snapshot_writer(
    settings: Settings,
    table: SyncPrefixHashTable,
    subscribers: SubscriberManager | None,
    pods: PodRegistry,
    restorer: SnapshotRestorer | None,
    cost: Predictor,
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
        cost_model=functools.partial(_cost_model_file, cost),
    )
