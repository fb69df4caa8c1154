"""Residency bookkeeping and eviction policy of the cache's tiers (GPU, host CPU, STORAGE).

`TierResidency` owns, per tier, the LRU order of resident blocks and their count, the GPU
slots reserved by running requests, and the rules for leaving a tier:
- only leaves of a tier (no child resident in it) that no request references may leave it,
  oldest first, so chains leave tail-first;
- with a host tier, a block leaving the GPU moves to the host (making room there first);
- a protected block (pinned, or an ancestor of a pinned one) never leaves the GPU without a
  host tier, may move GPU → host with one, and never leaves the host or STORAGE.
A block that no tier holds any more, and that has no children, is dropped from the index.
Every change is reported to the sink as it happens.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

from simulator.cache_types import Block, CacheEventSink, StorageBackend, Tier


class TierResidency:
    def __init__(
        self,
        capacity: dict[Tier, int],
        index: dict[int, Block],
        sink: CacheEventSink,
        storage: StorageBackend | None,
    ) -> None:
        self.capacity = capacity
        self.index = index
        self.sink = sink
        self.storage = storage
        # Oldest first; the GPU list holds only blocks that no running request references.
        self.lru: dict[Tier, OrderedDict[int, Block]] = {t: OrderedDict() for t in Tier}
        self.resident = {t: 0 for t in Tier}
        self.reserved = 0

    def enabled(self, tier: Tier) -> bool:
        return self.capacity[tier] > 0

    def free(self, tier: Tier) -> int:
        used = self.resident[tier] + (self.reserved if tier is Tier.GPU else 0)
        return self.capacity[tier] - used

    def clear(self) -> None:
        for tier in Tier:
            self.lru[tier].clear()
            self.resident[tier] = 0

    # ---- references ---------------------------------------------------------------------
    def ref(self, block: Block) -> None:
        block.ref_count += 1
        if block.ref_count == 1:
            self.lru[Tier.GPU].pop(block.key, None)

    def unref(self, block: Block) -> None:
        block.ref_count -= 1
        if block.ref_count == 0 and Tier.GPU in block.tiers:
            self.lru[Tier.GPU][block.key] = block

    def touch(self, block: Block) -> None:
        """Mark a hit in the host and STORAGE LRUs (the GPU LRU is ordered on release)."""
        for tier in (Tier.CPU, Tier.STORAGE):
            if block.key in self.lru[tier]:
                self.lru[tier].move_to_end(block.key)

    # ---- entering and leaving tiers -----------------------------------------------------
    def add(self, block: Block, tier: Tier) -> None:
        block.tiers.add(tier)
        self.resident[tier] += 1
        if tier is not Tier.GPU or block.ref_count == 0:
            self.lru[tier][block.key] = block

    def drop(self, block: Block, tier: Tier) -> None:
        block.tiers.discard(tier)
        self.resident[tier] -= 1
        self.lru[tier].pop(block.key, None)
        self.sink.block_removed(block, tier)

    def write_through(self, run: Sequence[Block]) -> None:
        """Copy freshly stored GPU blocks to STORAGE (when enabled) and announce them."""
        if self.storage is None:
            return
        written: list[Block] = []
        for block in run:
            if Tier.STORAGE in block.tiers:
                continue
            if not self.make_room(Tier.STORAGE, exclude=block):
                break
            self.add(block, Tier.STORAGE)
            self.storage.write(block)
            written.append(block)
        if written:
            self.sink.block_stored(written, written[0].parent, Tier.STORAGE)

    def make_room(self, tier: Tier, need: int = 1, exclude: Block | None = None) -> bool:
        while self.free(tier) < need:
            if not self.evict_one(tier, exclude):
                return False
        return True

    def evict_one(self, tier: Tier, exclude: Block | None = None) -> bool:
        """Evict the least recently used evictable block of `tier`; False when none is."""
        host = self.enabled(Tier.CPU)
        for block in self.lru[tier].values():
            if block is exclude or block.ref_count > 0 or block.has_child_in(tier):
                continue
            if tier is Tier.GPU:
                if block.protect > 0 and not host:
                    continue
                moved = Tier.CPU in block.tiers or (host and self.make_room(Tier.CPU, 1, block))
                if block.protect > 0 and not moved:
                    continue
                self.drop(block, tier)
                if moved and Tier.CPU not in block.tiers:
                    self.add(block, Tier.CPU)
                    self.sink.block_stored([block], block.parent, Tier.CPU)
                self.forget_if_gone(block)
                return True
            if block.protect > 0:
                continue
            self.drop(block, tier)
            if tier is Tier.STORAGE and self.storage is not None:
                self.storage.delete(block)
            self.forget_if_gone(block)
            return True
        return False

    def forget_if_gone(self, block: Block | None) -> None:
        while block is not None and not block.tiers and not block.children:
            if self.index.get(block.key) is block:
                del self.index[block.key]
            parent = block.parent
            if parent is not None:
                parent.children.pop(block.key, None)
            block = parent

    # ---- capacity estimates -------------------------------------------------------------
    def protected_footprint(self) -> int:
        """GPU slots pins keep from requests: protected blocks that cannot leave the GPU."""
        protected = [b for b in self.lru[Tier.GPU].values() if b.protect > 0]
        if not self.enabled(Tier.CPU):
            return len(protected)
        host_room = self.capacity[Tier.CPU] - sum(
            1 for b in self.lru[Tier.CPU].values() if b.protect > 0
        )
        return max(0, len([b for b in protected if Tier.CPU not in b.tiers]) - host_room)

    def evictable_estimate(self, *, any_pins: bool = True) -> int:
        """Roughly how many GPU slots eviction could free (ignores the leaf order).

        Without pins nothing is protected: skip the scan of every GPU block."""
        resident = len(self.lru[Tier.GPU])
        return resident - self.protected_footprint() if any_pins else resident
