"""The persistent STORAGE tier: write-through block files under `--disk-dir` (seed 004).

Layout: `<dir>/blocks/<digest hex>.blk` (msgpack `[parent digest | nil, tokens]`, written to a
temporary file then renamed, so a file is whole or absent) and `<dir>/index.msgpack`
(`{"block_size", "hash_seed", "clean_shutdown", "entries": [[digest, parent], ...]}`,
rewritten atomically now and then and at shutdown).

Writes are queued by the cache (synchronously) and done by one async writer task off the
event loop (`asyncio.to_thread`). The queue is bounded: when it is full, writes wait in a
backlog and `wait_for_room()` (awaited by the engine after each step) holds the engine until
the writer catches up — back-pressure instead of dropping. At start-up `load()` validates the
index against the files: entries without a valid file are dropped, files the index does not
name are deleted (orphans), blocks whose parent is gone are deleted; what remains is
returned parents-first so the cache can announce it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import msgpack

from simulator.block_hash import BlockHasher
from simulator.cache_types import Block

logger = logging.getLogger(__name__)

Entry = tuple[bytes, bytes | None, tuple[int, ...]]
_INDEX_EVERY_OPS = 64


@dataclass
class DiskStats:
    written: int = 0
    deleted: int = 0
    write_errors: int = 0
    backpressure_waits: int = 0
    missing_cleaned: int = 0
    orphans_cleaned: int = 0
    unreachable_cleaned: int = 0
    loaded: int = 0
    last_shutdown_clean: bool | None = None


class DiskTier:
    def __init__(self, directory: Path, hasher: BlockHasher, hash_seed: int, queue_size: int = 512):
        self.directory = directory
        self._blocks_dir = directory / "blocks"
        self._index_path = directory / "index.msgpack"
        self._hasher = hasher
        self._hash_seed = hash_seed
        self._queue: asyncio.Queue[tuple[str, bytes, bytes | None, tuple[int, ...]]] = (
            asyncio.Queue(maxsize=queue_size)
        )
        self._backlog: deque[tuple[str, bytes, bytes | None, tuple[int, ...]]] = deque()
        self._index: dict[bytes, bytes | None] = {}
        self._ops_since_index = 0
        self.stats = DiskStats()

    # ---- StorageBackend (called synchronously by the cache) --------------------------
    def write(self, block: Block) -> None:
        parent = block.parent.digest if block.parent is not None else None
        self._enqueue(("write", block.digest, parent, block.tokens))

    def delete(self, block: Block) -> None:
        self._enqueue(("delete", block.digest, None, ()))

    def clear(self) -> None:
        self._enqueue(("clear", b"", None, ()))

    def _enqueue(self, op: tuple[str, bytes, bytes | None, tuple[int, ...]]) -> None:
        if self._backlog:
            self._backlog.append(op)
            return
        try:
            self._queue.put_nowait(op)
        except asyncio.QueueFull:
            self._backlog.append(op)

    async def wait_for_room(self) -> None:
        """Back-pressure: move the backlog into the bounded queue, waiting as needed."""
        if self._backlog:
            self.stats.backpressure_waits += 1
        while self._backlog:
            await self._queue.put(self._backlog.popleft())

    # ---- writer task --------------------------------------------------------------------
    async def run_writer(self) -> None:
        while True:
            kind, digest, parent, tokens = await self._queue.get()
            try:
                await asyncio.to_thread(self._apply, kind, digest, parent, tokens)
            except OSError as exc:
                self.stats.write_errors += 1
                logger.warning("disk tier %s failed for %s: %s", kind, digest.hex()[:16], exc)
            finally:
                self._queue.task_done()
            self._ops_since_index += 1
            if self._ops_since_index >= _INDEX_EVERY_OPS or self._queue.empty():
                await asyncio.to_thread(self._write_index, False)

    async def close(self, drain_timeout: float = 5.0) -> bool:
        """Drain pending writes (bounded), then write the index with the shutdown status."""
        clean = True
        try:
            async with asyncio.timeout(drain_timeout):  # not wait_for: it can lose a cancel
                await self._drain()
        except TimeoutError:
            clean = False
            logger.error("disk tier writer did not drain within %.1fs", drain_timeout)
        await asyncio.to_thread(self._write_index, clean)
        return clean

    async def _drain(self) -> None:
        await self.wait_for_room()
        await self._queue.join()

    def _path(self, digest: bytes) -> Path:
        return self._blocks_dir / f"{digest.hex()}.blk"

    def _apply(
        self, kind: str, digest: bytes, parent: bytes | None, tokens: tuple[int, ...]
    ) -> None:
        if kind == "write":
            path = self._path(digest)
            tmp = path.with_suffix(".tmp")
            tmp.write_bytes(msgpack.packb([parent, list(tokens)]))
            tmp.replace(path)
            self._index[digest] = parent
            self.stats.written += 1
        elif kind == "delete":
            self._index.pop(digest, None)
            self._path(digest).unlink(missing_ok=True)
            self.stats.deleted += 1
        else:
            self._index.clear()
            for path in self._blocks_dir.glob("*.blk"):
                path.unlink(missing_ok=True)

    def _write_index(self, clean: bool) -> None:
        self._ops_since_index = 0
        body = {
            "block_size": self._hasher.block_size,
            "hash_seed": self._hash_seed,
            "block_hash": type(self._hasher).__name__,
            "clean_shutdown": clean,
            "entries": [[d, p] for d, p in self._index.items()],
        }
        tmp = self._index_path.with_suffix(".tmp")
        tmp.write_bytes(msgpack.packb(body))
        tmp.replace(self._index_path)

    # ---- start-up -----------------------------------------------------------------------
    async def load(self) -> list[Entry]:
        return await asyncio.to_thread(self._load)

    def _load(self) -> list[Entry]:
        self._blocks_dir.mkdir(parents=True, exist_ok=True)
        for tmp in self._blocks_dir.glob("*.tmp"):
            tmp.unlink(missing_ok=True)
        index: dict[bytes, bytes | None] = {}
        with contextlib.suppress(OSError, ValueError, msgpack.UnpackException):
            body = msgpack.unpackb(self._index_path.read_bytes())
            same_config = (
                body.get("block_size") == self._hasher.block_size
                and body.get("hash_seed") == self._hash_seed
                and body.get("block_hash", "BlockHasher") == type(self._hasher).__name__
            )
            if same_config:
                index = {bytes(d): (bytes(p) if p else None) for d, p in body["entries"]}
                self.stats.last_shutdown_clean = bool(body.get("clean_shutdown"))
        valid: dict[bytes, Entry] = {}
        for digest, parent in index.items():
            tokens = self._read_block(digest, parent)
            if tokens is None:
                self.stats.missing_cleaned += 1
                self._path(digest).unlink(missing_ok=True)
            else:
                valid[digest] = (digest, parent, tokens)
        for path in self._blocks_dir.glob("*.blk"):
            if bytes.fromhex(path.stem) not in valid:
                path.unlink(missing_ok=True)
                self.stats.orphans_cleaned += 1
        ordered = _parents_first(valid)
        for digest in set(valid) - {entry[0] for entry in ordered}:
            self._path(digest).unlink(missing_ok=True)
            self.stats.unreachable_cleaned += 1
        self._index = {digest: parent for digest, parent, _ in ordered}
        self.stats.loaded = len(ordered)
        self._write_index(False)
        return ordered

    def _read_block(self, digest: bytes, parent: bytes | None) -> tuple[int, ...] | None:
        try:
            stored_parent, tokens = msgpack.unpackb(self._path(digest).read_bytes())
        except (OSError, ValueError, TypeError, msgpack.UnpackException):
            return None
        if stored_parent != parent or len(tokens) != self._hasher.block_size:
            return None
        if self._hasher.digest(parent, tokens) != digest:
            return None
        return tuple(tokens)


def _parents_first(valid: dict[bytes, Entry]) -> list[Entry]:
    children: dict[bytes | None, list[Entry]] = {}
    for entry in valid.values():
        children.setdefault(entry[1], []).append(entry)
    ordered: list[Entry] = []
    frontier: list[bytes | None] = [None]
    while frontier:
        parent = frontier.pop()
        for entry in children.get(parent, []):
            ordered.append(entry)
            frontier.append(entry[0])
    return ordered
