"""The per-context store of gateway blocks, kept as plain ints in dicts.

A block is its gateway hash: there is no object per block. Which pods hold it is a bit
mask (one bit per registered pod), so a prefix match is a few integer ANDs per block
whatever the fleet size. Almost every block is held on GPU only; such a block has a
mask in `held` and nothing in `tiers`, which keeps the index small and a match a single
dict lookup per block.

Two layouts behind one interface: `PrefixStore` keeps dicts (the pure-Python path);
`CompiledStore` keeps one `_native.U64Map` whose items are the blocks' masks, unboxed,
with their last access times in the map's float column (about 40 bytes a block instead
of two dict entries and an int object, ~110).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from itertools import repeat
from typing import TYPE_CHECKING, cast

from indexer.native import BlockMap, Native, Stamps
from indexer.types import ModelContext, Tier

if TYPE_CHECKING:
    from indexer._native import U64Map

_GPU, _CPU, _STORAGE, _EXPECTED = Tier.GPU, Tier.CPU, Tier.STORAGE, Tier.EXPECTED


class PrefixStore:
    """Gateway blocks of one ModelContext.

    Invariants: `held` and `access` have the same keys (the blocks of the store, in
    insertion order); `held[h]` is the non-zero OR of the block's tier masks; `tiers` has
    an entry exactly for the blocks some pod holds off-GPU or merely expects (then
    `held[h]` is the OR of its four masks), else every holder holds `h` on GPU. A block
    nobody holds any more is dropped at once. `alive` turns False when the evictor drops
    the store (entries of pods that still point at it are swept).
    """

    __slots__ = ("access", "alive", "context", "held", "last_access", "offloaded", "tiers")

    def __init__(self, context: ModelContext, now: float) -> None:
        self.context = context
        held: dict[int, int] = {}
        access: dict[int, float] = {}
        self.held: BlockMap[int, int] = held
        self.tiers: dict[int, list[int]] = {}
        self.offloaded: set[int] = set()
        """The blocks some pod holds on CPU or STORAGE (a match asks whether it meets one)."""
        self.access: Stamps = access
        self.last_access = now
        self.alive = True

    def real_mask(self, gw_hash: int) -> int:
        """Pods that hold `gw_hash` in a real tier (not merely expected); 0 if absent."""
        masks = self.tiers.get(gw_hash)
        if masks is None:
            return self.held.get(gw_hash, 0)
        return masks[_GPU] | masks[_CPU] | masks[_STORAGE]

    def tier_masks(self, gw_hash: int) -> list[int]:
        """Per-tier masks of a block, materialised on first use of a non-GPU tier."""
        masks = self.tiers.get(gw_hash)
        if masks is None:
            masks = self.tiers[gw_hash] = [self.held.get(gw_hash, 0), 0, 0, 0]
        return masks

    def refresh(self, gw_hash: int, masks: list[int]) -> int:
        """Recompute `held` of a block from its tier masks (folding them away when it is
        all-GPU); drops the block when nobody holds it. Returns the new `held`."""
        held = masks[_GPU] | masks[_CPU] | masks[_STORAGE] | masks[_EXPECTED]
        if masks[_CPU] or masks[_STORAGE]:
            self.offloaded.add(gw_hash)
        else:
            self.offloaded.discard(gw_hash)
            if not masks[_EXPECTED]:
                del self.tiers[gw_hash]
        if held:
            self.held[gw_hash] = held
        else:
            self.forget(gw_hash)
        return held

    def tier_of(self, gw_hash: int, bit: int) -> Tier:
        """The best tier in which the pod with `bit` holds `gw_hash` (it must hold it)."""
        masks = self.tiers.get(gw_hash)
        if masks is None:
            return _GPU
        return tier_from_masks(masks, bit)

    def touch(self, gw_hash: int, now: float) -> None:
        """Create the block (held by nobody yet: the caller sets a bit) or mark it used."""
        if gw_hash not in self.held:
            self.held[gw_hash] = 0
        self.access[gw_hash] = now

    def forget(self, gw_hash: int) -> None:
        """Drop a block nobody holds."""
        del self.held[gw_hash]
        del cast(dict[int, float], self.access)[gw_hash]
        self.tiers.pop(gw_hash, None)
        self.offloaded.discard(gw_hash)

    def walk(self, prefix_hashes: Sequence[int], alive: int, now: float) -> list[tuple[int, int]]:
        """The match's walk: from the prompt's first block, while some pod of `alive` (a
        non-empty mask) holds it; marks the matched blocks accessed. Returns (length, mask
        of the pods that stop there) per length where some stop, ascending, the last being
        (matched blocks, the pods holding them all)."""
        get = self.held.get
        ends: list[tuple[int, int]] = []
        matched = 0
        for gw_hash in prefix_hashes:
            mask = get(gw_hash)
            if mask is None:
                break
            still = mask & alive
            if still != alive:
                if not still:
                    break
                ends.append((matched, alive ^ still))
                alive = still
            matched += 1
        ends.append((matched, alive))
        cast(dict[int, float], self.access).update(zip(prefix_hashes[:matched], repeat(now)))
        return ends

    def lru(self, count: int) -> list[int]:
        """The `count` least recently used blocks, oldest first; among equally old blocks
        the newest inserted first, which takes a chain from its tail (children are created
        after their parents): a tail left without its root could never be matched."""
        access = cast(dict[int, float], self.access)
        return heapq.nsmallest(count, reversed(access.keys()), key=access.__getitem__)


class CompiledStore(PrefixStore):
    """A `PrefixStore` whose blocks live in one compiled map (`held`), their last access
    in its float column (`access` is a view of it): same invariants, same answers."""

    __slots__ = ("_map", "_native_walk")

    def __init__(self, context: ModelContext, now: float, native: Native) -> None:
        super().__init__(context, now)
        blocks: U64Map[int, int] = native.map_type()
        self._map = blocks
        self.held = blocks
        self.access = blocks.stamps()
        self._native_walk = native.match_walk

    def forget(self, gw_hash: int) -> None:
        del self.held[gw_hash]  # its access time goes with it
        self.tiers.pop(gw_hash, None)
        self.offloaded.discard(gw_hash)

    def walk(self, prefix_hashes: Sequence[int], alive: int, now: float) -> list[tuple[int, int]]:
        ends = self._native_walk(self._map, prefix_hashes, alive, now)
        if ends is None:  # masks wider than 64 bits (more than 64 pods registered)
            return self._walk_in_python(prefix_hashes, alive, now)
        return ends

    def _walk_in_python(
        self, prefix_hashes: Sequence[int], alive: int, now: float
    ) -> list[tuple[int, int]]:
        get = self.held.get
        access = self.access
        ends: list[tuple[int, int]] = []
        matched = 0
        for gw_hash in prefix_hashes:
            mask = get(gw_hash)
            if mask is None:
                break
            still = mask & alive
            if still != alive:
                if not still:
                    break
                ends.append((matched, alive ^ still))
                alive = still
            access[gw_hash] = now
            matched += 1
        ends.append((matched, alive))
        return ends

    def lru(self, count: int) -> list[int]:
        return self._map.oldest(count)


def tier_from_masks(masks: list[int] | tuple[int, ...], bit: int) -> Tier:
    for tier in (_GPU, _CPU, _STORAGE):
        if masks[tier] & bit:
            return tier
    return _EXPECTED
