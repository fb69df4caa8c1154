"""Paged prefix cache with request references, LRU leaf eviction, host/disk tiers and pins.

Invariants (checked by the stateful test):
- GPU slots used (resident blocks + reserved slots of running requests) never exceed
  `gpu_blocks`; CPU and STORAGE residents never exceed their capacities.
- A block referenced by a running request is GPU-resident; so are its ancestors (a request
  references its whole chain), hence never evicted.
- Eviction is LRU over leaves of each tier (no child resident in that tier), so chains leave
  a tier tail-first. With a host tier, a block leaving the GPU moves to the host.
- Pins (`pin`/`unpin`) are counted and separate from request references; a pin protects the
  block and its ancestors. Without a host tier a protected block never leaves the GPU; with
  one it may move to the host but never leaves it. Protected blocks never leave STORAGE.
- Every change is reported to the sink at the moment it happens, evictions before the
  store that needed the room.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from simulator.block_hash import BlockHasher, int_hash
from simulator.cache_types import Allocation, Block, CacheEventSink, StorageBackend, Tier
from simulator.tiers import TierResidency


class PagedPrefixCache:
    def __init__(
        self,
        hasher: BlockHasher,
        sink: CacheEventSink,
        *,
        gpu_blocks: int,
        host_blocks: int = 0,
        disk_blocks: int = 0,
        storage: StorageBackend | None = None,
    ) -> None:
        if gpu_blocks < 1:
            raise ValueError(f"gpu_blocks must be >= 1, got {gpu_blocks}")
        self.hasher = hasher
        self.block_size = hasher.block_size
        self.capacity = {Tier.GPU: gpu_blocks, Tier.CPU: host_blocks, Tier.STORAGE: disk_blocks}
        self._sink = sink
        self._index: dict[int, Block] = {}
        self._pinned: dict[int, Block] = {}
        self.tiers = TierResidency(
            self.capacity, self._index, sink, storage if disk_blocks > 0 else None
        )

    # ---- inspection -----------------------------------------------------------------
    def resident(self, tier: Tier) -> list[Block]:
        return [b for b in self._index.values() if tier in b.tiers]

    def count(self, tier: Tier) -> int:
        return self.tiers.resident[tier]

    def get(self, key: int) -> Block | None:
        return self._index.get(key)

    @property
    def gpu_used(self) -> int:
        return self.tiers.resident[Tier.GPU] + self.tiers.reserved

    @property
    def reserved(self) -> int:
        return self.tiers.reserved

    @property
    def pinned_blocks(self) -> int:
        return len(self._pinned)

    def tier_enabled(self, tier: Tier) -> bool:
        return self.tiers.enabled(tier)

    # ---- lookup and allocation ------------------------------------------------------
    def match(self, tokens: Sequence[int]) -> list[Block]:
        """The longest chain of resident blocks covering a prefix of `tokens`.

        Like vLLM, the last prompt token is always recomputed, so at most
        `(len(tokens) - 1) // block_size` blocks can match.
        """
        size = self.block_size
        limit = max(0, (len(tokens) - 1) // size)
        chain: list[Block] = []
        parent: Block | None = None
        for index in range(limit):
            digest = self.hasher.digest(
                parent.digest if parent else None, tokens[index * size : (index + 1) * size]
            )
            block = self._index.get(int_hash(digest))
            if block is None or block.digest != digest or not block.tiers:
                break
            chain.append(block)
            parent = block
        return chain

    def blocks_needed(self, total_tokens: int) -> int:
        return -(-total_tokens // self.block_size)

    def can_fit(self, total_tokens: int) -> bool:
        """Whether a request of `total_tokens` could ever fit, pins aside."""
        return self.blocks_needed(total_tokens) <= self.capacity[Tier.GPU]

    def acquire(self, tokens: Sequence[int], total_tokens: int) -> Allocation | None:
        """Reference the cached prefix of `tokens` and reserve GPU slots for the rest.

        Blocks found on the host or on disk are loaded back to the GPU. Returns None (and
        holds nothing) when the GPU cannot make room.
        """
        chain = self.match(tokens)
        on_gpu = sum(1 for b in chain if Tier.GPU in b.tiers)
        need = max(0, self.blocks_needed(total_tokens) - on_gpu)
        idle_in_chain = sum(1 for b in chain if b.key in self.tiers.lru[Tier.GPU])
        if (
            self.tiers.free(Tier.GPU)
            + self.tiers.evictable_estimate(any_pins=bool(self._pinned))
            - idle_in_chain
            < need
        ):
            return None
        hits = {t: 0 for t in Tier}
        for block in chain:
            hits[block.best_tier() or Tier.GPU] += 1
            self.tiers.ref(block)
            self.tiers.touch(block)
        if not self.tiers.make_room(Tier.GPU, need):
            for block in reversed(chain):
                self.tiers.unref(block)
            return None
        loaded: list[Block] = []
        for block in chain:
            if Tier.GPU not in block.tiers:
                self.tiers.add(block, Tier.GPU)
                loaded.append(block)
            elif loaded:
                self._sink.block_stored(loaded, loaded[0].parent, Tier.GPU)
                loaded = []
        if loaded:
            self._sink.block_stored(loaded, loaded[0].parent, Tier.GPU)
        reserve = need - hits[Tier.CPU] - hits[Tier.STORAGE]
        self.tiers.reserved += reserve
        return Allocation(blocks=list(chain), reserved=reserve, hits=hits)

    def commit(self, alloc: Allocation, tokens: Sequence[int]) -> int:
        """Store the blocks of `tokens` that became full since the last commit.

        Returns the number of blocks newly made resident. A block whose hash is already on
        the GPU (computed concurrently by another request) is shared, not stored twice.
        """
        start = len(alloc.blocks)
        parent = alloc.blocks[-1] if alloc.blocks else None
        digests = self.hasher.chain(
            tokens, parent=parent.digest if parent else None, start_block=start
        )
        size = self.block_size
        run: list[Block] = []
        run_parent = parent
        stored = 0
        for offset, digest in enumerate(digests):
            index = start + offset
            key = int_hash(digest)
            block = self._index.get(key)
            if block is not None and Tier.GPU in block.tiers:
                self.tiers.ref(block)
                self._release_reserved(alloc, 1)
                if run:
                    self._store_run(run, run_parent)
                    run = []
                run_parent = block
            else:
                if alloc.reserved > 0:
                    self._release_reserved(alloc, 1)
                elif not self.tiers.make_room(Tier.GPU):
                    break  # over-committed request: the rest of its blocks are not cached
                if block is None:
                    block = Block(
                        key, digest, parent, tuple(tokens[index * size : (index + 1) * size])
                    )
                    self._index[key] = block
                    if parent is not None:
                        parent.children[key] = block
                self.tiers.ref(block)
                self.tiers.add(block, Tier.GPU)
                if not run:
                    run_parent = parent
                run.append(block)
                stored += 1
            alloc.blocks.append(block)
            parent = block
        if run:
            self._store_run(run, run_parent)
        return stored

    def release(self, alloc: Allocation) -> None:
        """Drop the request's references (tail first, so tails are evicted first)."""
        if alloc.released:
            return
        alloc.released = True
        for block in reversed(alloc.blocks):
            self.tiers.unref(block)
        self._release_reserved(alloc, alloc.reserved)

    # ---- pins ---------------------------------------------------------------------------
    def pin(self, keys: Iterable[int]) -> int:
        count = 0
        for key in keys:
            block = self._index.get(key)
            if block is None or not block.tiers:
                continue
            block.pin_count += 1
            if block.pin_count == 1:
                self._pinned[key] = block
                node: Block | None = block
                while node is not None:
                    node.protect += 1
                    node = node.parent
            count += 1
        return count

    def unpin(self, keys: Iterable[int]) -> int:
        count = 0
        for key in keys:
            block = self._pinned.get(key)
            if block is None:
                continue
            block.pin_count -= 1
            if block.pin_count == 0:
                del self._pinned[key]
                node: Block | None = block
                while node is not None:
                    node.protect -= 1
                    node = node.parent
            count += 1
        return count

    def unpin_all(self) -> int:
        """Drop every pin (the scheduler's safety net); returns the number of pins dropped."""
        total = 0
        for key, block in list(self._pinned.items()):
            total += self.unpin([key] * block.pin_count)
        return total

    def protected_footprint(self) -> int:
        return self.tiers.protected_footprint()

    # ---- flush / reset --------------------------------------------------------------
    def flush(self) -> int:
        """Evict everything evictable (pins survive); returns the number of blocks evicted."""
        evicted = 0
        while self.tiers.evict_one(Tier.GPU):
            evicted += 1
        while self.tiers.evict_one(Tier.CPU):
            evicted += 1
        return evicted

    def reset(self) -> None:
        """Forget every block and pin (requests keep running uncached); one AllBlocksCleared."""
        for block in self._index.values():
            block.tiers.clear()
        self._index.clear()
        self._pinned.clear()
        self.tiers.clear()
        if self.tiers.storage is not None:
            self.tiers.storage.clear()
        self._sink.all_cleared()

    def restore(self, entries: Sequence[tuple[bytes, bytes | None, tuple[int, ...]]]) -> int:
        """Rebuild STORAGE blocks found on disk at start-up (parents first) and announce them."""
        run: list[Block] = []
        restored = 0
        for digest, parent_digest, tokens in entries:
            parent = self._index.get(int_hash(parent_digest)) if parent_digest else None
            if parent_digest is not None and (parent is None or parent.digest != parent_digest):
                continue
            if self.tiers.free(Tier.STORAGE) <= 0:
                break
            key = int_hash(digest)
            if key in self._index:
                continue
            block = Block(key, digest, parent, tokens)
            self._index[key] = block
            if parent is not None:
                parent.children[key] = block
            self.tiers.add(block, Tier.STORAGE)
            if run and run[-1] is not parent:
                self._sink.block_stored(run, run[0].parent, Tier.STORAGE)
                run = []
            run.append(block)
            restored += 1
        if run:
            self._sink.block_stored(run, run[0].parent, Tier.STORAGE)
        return restored

    def announce_resident(self) -> int:
        """Announce every resident block again, parents first (a restarted publisher's
        subscribers know nothing of what the engine kept). Returns the blocks announced."""
        announced = 0
        for tier in (Tier.GPU, Tier.CPU, Tier.STORAGE):
            run: list[Block] = []
            for block in self._index.values():  # insertion order: parents before children
                if tier not in block.tiers:
                    continue
                if run and block.parent is not run[-1]:
                    self._sink.block_stored(run, run[0].parent, tier)
                    run = []
                run.append(block)
                announced += 1
            if run:
                self._sink.block_stored(run, run[0].parent, tier)
        return announced

    def _release_reserved(self, alloc: Allocation, n: int) -> None:
        n = min(n, alloc.reserved)
        alloc.reserved -= n
        self.tiers.reserved -= n

    def _store_run(self, run: list[Block], parent: Block | None) -> None:
        self._sink.block_stored(run, parent, Tier.GPU)
        self.tiers.write_through(run)
