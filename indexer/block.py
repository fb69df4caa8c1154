"""The per-context store of gateway blocks, kept as plain ints in dicts.

A block is its gateway hash: there is no object per block. Which pods hold it is a bit
mask (one bit per registered pod), so a prefix match is a few integer ANDs per block
whatever the fleet size. Almost every block is held on GPU only; such a block has a
mask in `held` and nothing in `tiers`, which keeps the index small and a match a single
dict lookup per block.
"""

from __future__ import annotations

from indexer.types import ModelContext, Tier

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

    __slots__ = ("access", "alive", "context", "held", "last_access", "tiers")

    def __init__(self, context: ModelContext, now: float) -> None:
        self.context = context
        self.held: dict[int, int] = {}
        self.tiers: dict[int, list[int]] = {}
        self.access: dict[int, float] = {}
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
        if not (masks[_CPU] or masks[_STORAGE] or masks[_EXPECTED]):
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
        del self.access[gw_hash]
        self.tiers.pop(gw_hash, None)


def tier_from_masks(masks: list[int] | tuple[int, ...], bit: int) -> Tier:
    for tier in (_GPU, _CPU, _STORAGE):
        if masks[tier] & bit:
            return tier
    return _EXPECTED
