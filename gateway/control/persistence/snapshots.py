"""Taking a pod's snapshot from the live index, and giving a pod its snapshot back.

A snapshot is taken on the event loop in one synchronous step (the pod's exported index
together with the subscriber's position), so it is always consistent: the index as of
exactly that batch. It is restored when the pod's subscriber starts (the subscriber
manager's resume hook): the index gets the entries back at once, and the subscriber then
checks them against the engine's replay — same history: only what follows is applied;
otherwise (the engine restarted, or its replay buffer no longer reaches back) the
subscriber's usual rules clear the pod and rebuild it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from gateway.control.persistence.files import SnapshotDir
from gateway.control.persistence.metrics import SnapshotMetrics
from indexer import PodSnapshot, SnapshotError, SyncPrefixHashTable, decode_snapshot
from subscriber import PodEndpoint, ResumePoint, SubscriberManager

logger = logging.getLogger(__name__)

FILE, PEER = "file", "peer"


def capture_pod(
    table: SyncPrefixHashTable,
    subscribers: SubscriberManager,
    pod: str,
    *,
    wall_clock: Callable[[], float] = time.time,
) -> PodSnapshot | None:
    """The pod's snapshot now; None when its index stands nowhere (being rebuilt, gone)."""
    position = subscribers.resume_point(pod)
    if position is None or not table.has_pod(pod):
        return None
    endpoint, point = position
    return PodSnapshot(
        pod=pod,
        model=endpoint.model,
        endpoint=endpoint.events,
        seq=point.seq,
        digest=point.digest,
        whole=point.whole,
        block_size=table.config.block_size,
        hash_seed=table.config.hash_seed,
        created_at=wall_clock(),
        index=table.export_pod(pod),
    )


class SnapshotRestorer:
    """Snapshots loaded at start-up, each waiting for its pod's subscriber to start.

    Each is used at most once: a subscriber restarted later (its endpoint changed) starts
    from scratch, as without persistence.
    """

    def __init__(self, table: SyncPrefixHashTable, metrics: SnapshotMetrics) -> None:
        self._table = table
        self.metrics = metrics
        self._pending: dict[str, tuple[PodSnapshot, str]] = {}

    def pending(self) -> list[str]:
        return list(self._pending)

    def add(self, snapshot: PodSnapshot, source: str) -> None:
        """Keep `snapshot` for its pod; a later one (a peer's after the files) wins."""
        self._pending[snapshot.pod] = (snapshot, source)

    def ignore(self, reason: str, what: str) -> None:
        self.metrics.ignored.labels(reason).inc()
        logger.warning("index snapshot %s ignored (%s)", what, reason)

    async def load_dir(self, directory: SnapshotDir, max_bytes: int) -> int:
        """Load every pod's file; bad ones are counted and skipped. Returns how many loaded."""
        leftovers = await asyncio.to_thread(directory.prepare)
        if leftovers:
            logger.info("removed %d unfinished snapshot writes from %s", leftovers, directory.path)
        loaded = 0
        for found in await asyncio.to_thread(directory.read_all, max_bytes):
            if found.data is None:
                self.ignore(found.error or "unreadable", str(found.path))
                continue
            try:
                snapshot = await asyncio.to_thread(decode_snapshot, found.data, max_bytes=max_bytes)
            except SnapshotError as exc:
                self.ignore(exc.reason, f"{found.path}: {exc.detail}")
                continue
            self.add(snapshot, FILE)
            loaded += 1
        return loaded

    def resume(self, endpoint: PodEndpoint) -> ResumePoint | None:
        """The subscriber manager's resume hook: restore the pod's index, say where it stands."""
        item = self._pending.pop(endpoint.name, None)
        if item is None:
            return None
        snapshot, source = item
        config = self._table.config
        reason = None
        if snapshot.model != endpoint.model:
            reason = "model_mismatch"
        elif (snapshot.block_size, snapshot.hash_seed) != (config.block_size, config.hash_seed):
            reason = "config_mismatch"  # its gateway hashes would not be ours
        elif source == FILE and snapshot.endpoint != endpoint.events:
            # Another address is another engine process. (Not checked for a peer's
            # snapshot: with `events_bind` each replica has its own address.)
            reason = "endpoint_mismatch"
        if reason is not None:
            self.ignore(reason, f"of pod {endpoint.name}")
            return None
        restored = self._table.restore_pod(endpoint.name, snapshot.index)
        self.metrics.restored.labels(source).inc()
        logger.info(
            "pod %s: %d index entries restored from its %s snapshot at seq %d; replaying on",
            endpoint.name,
            restored,
            source,
            snapshot.seq,
        )
        return ResumePoint(snapshot.seq, snapshot.digest, snapshot.whole)
