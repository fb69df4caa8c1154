"""The periodic snapshot writer: every pod whose index moved since its last snapshot, and
the cost model when it learned since its last file.

Taking a snapshot is synchronous on the event loop (that is what makes it consistent);
encoding and the file I/O run in a thread. A write abandoned by cancellation finishes in
its thread and `close` waits for it before the final snapshot, so an older snapshot can
never replace a newer one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Iterable

from gateway.control.persistence.files import SnapshotDir
from gateway.control.persistence.metrics import SnapshotMetrics
from indexer import PodSnapshot, encode_snapshot

logger = logging.getLogger(__name__)


class SnapshotWriter:
    def __init__(
        self,
        directory: SnapshotDir,
        *,
        capture: Callable[[str], PodSnapshot | None],
        pods: Callable[[], Iterable[str]],
        metrics: SnapshotMetrics,
        interval_s: float,
        max_bytes: int,
        cost_model: Callable[[], bytes | None] | None = None,
    ) -> None:
        """`cost_model`: the cost model's file as it is now (None: nothing learned yet)."""
        self._dir = directory
        self._capture = capture
        self._pods = pods
        self._metrics = metrics
        self._interval_s = interval_s
        self._max_bytes = max_bytes
        # pod -> (seq, digest, whole) of its last snapshot written (or refused as too large)
        self._written: dict[str, tuple[int, int, bool]] = {}
        self._inflight: asyncio.Future[None] | None = None
        self._cost_model = cost_model
        self._cost_model_written: bytes | None = None

    async def run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            await self.write_all()

    async def write_all(self) -> int:
        """Write the snapshot of every pod whose index moved; remove those of pods that went
        since (only those: a discovery that failed or has not answered yet must not wipe
        the directory). Returns how many files were written."""
        names = list(self._pods())
        written = 0
        for name in names:
            snapshot = self._capture(name)
            if snapshot is None:
                continue  # being rebuilt: its last file (if any) is still a valid start
            key = (snapshot.seq, snapshot.digest, snapshot.whole)
            if self._written.get(name) == key:
                continue
            data = await asyncio.to_thread(encode_snapshot, snapshot)
            if len(data) > self._max_bytes:
                self._written[name] = key
                self._metrics.writes.labels("too_large").inc()
                logger.warning(
                    "snapshot of pod %s not written: %d bytes > KVGATE_SNAPSHOT_MAX_BYTES=%d",
                    name,
                    len(data),
                    self._max_bytes,
                )
                continue
            if not await self._write(functools.partial(self._dir.write, name, data),
                                     f"snapshot of pod {name}"):  # fmt: skip
                continue
            self._written[name] = key
            written += 1
        gone = set(self._written) - set(names)
        if gone:
            try:
                await asyncio.to_thread(self._dir.remove, gone)
            except OSError as exc:
                logger.warning("snapshots of pods that went not removed: %s", exc)
            for name in gone:
                del self._written[name]
        return written + await self._write_cost_model()

    async def _write_cost_model(self) -> int:
        data = self._cost_model() if self._cost_model is not None else None
        if data is None or data == self._cost_model_written:
            return 0
        if not await self._write(functools.partial(self._dir.write_cost_model, data), "cost model"):
            return 0
        self._cost_model_written = data
        return 1

    async def close(self) -> None:
        """The final snapshot, on a clean shutdown (after `run` was cancelled)."""
        if self._inflight is not None:
            await asyncio.wait([self._inflight])
        await self.write_all()

    async def _write(self, write: Callable[[], None], what: str) -> bool:
        """Run one file write in a thread; counted, and logged when it fails."""
        self._inflight = asyncio.ensure_future(asyncio.to_thread(write))
        try:
            await asyncio.shield(self._inflight)
        except OSError as exc:
            self._metrics.writes.labels("error").inc()
            logger.warning("%s not written: %s", what, exc)
            return False
        self._metrics.writes.labels("ok").inc()
        return True
