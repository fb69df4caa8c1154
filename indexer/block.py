"""A gateway block of one context, and the per-context store of them.

Which pods hold a block is a bit mask (one bit per registered pod), so a prefix match
is a few integer ANDs per block whatever the fleet size. Almost every block is held
on GPU only; such a block keeps a single mask (`held`) and no per-tier masks at all,
which is what keeps the index near a hundred bytes per (block, pod) pair.
"""

from __future__ import annotations

from indexer.types import ModelContext, Tier

_GPU, _CPU, _STORAGE, _EXPECTED = Tier.GPU, Tier.CPU, Tier.STORAGE, Tier.EXPECTED


class Block:
    """One gateway hash in one context.

    Invariants: `held` is the OR of all tier masks; `masks` is None exactly when every
    holder holds the block on GPU and no router-side entry exists (then `held` is the GPU
    mask); `store` is None once the block was dropped from its store (an evicted or emptied
    block may still be referenced from a pod's engine-hash map until that entry goes).
    """

    __slots__ = ("gw_hash", "held", "last_access", "masks", "store")

    def __init__(self, gw_hash: int, store: PrefixStore, now: float) -> None:
        self.gw_hash = gw_hash
        self.held = 0
        self.masks: list[int] | None = None
        self.last_access = now
        self.store: PrefixStore | None = store

    def real_mask(self) -> int:
        """Pods that hold this block in a real tier (not merely expected)."""
        masks = self.masks
        if masks is None:
            return self.held
        return masks[_GPU] | masks[_CPU] | masks[_STORAGE]

    def tier_masks(self) -> list[int]:
        """Per-tier masks, materialised on first use of a non-GPU tier."""
        masks = self.masks
        if masks is None:
            masks = self.masks = [self.held, 0, 0, 0]
        return masks

    def refresh(self) -> None:
        """Recompute `held` from the tier masks and fold them away when all-GPU."""
        masks = self.masks
        if masks is None:
            return
        self.held = masks[_GPU] | masks[_CPU] | masks[_STORAGE] | masks[_EXPECTED]
        if not (masks[_CPU] or masks[_STORAGE] or masks[_EXPECTED]):
            self.masks = None

    def tier_of(self, bit: int) -> Tier:
        """The best tier in which the pod with `bit` holds this block (it must hold it)."""
        masks = self.masks
        if masks is None:
            return _GPU
        return tier_from_masks(masks, bit)


def tier_from_masks(masks: list[int] | tuple[int, ...], bit: int) -> Tier:
    for tier in (_GPU, _CPU, _STORAGE):
        if masks[tier] & bit:
            return tier
    return _EXPECTED


class PrefixStore:
    """Gateway hash -> Block for one ModelContext."""

    __slots__ = ("blocks", "context", "last_access")

    def __init__(self, context: ModelContext, now: float) -> None:
        self.context = context
        self.blocks: dict[int, Block] = {}
        self.last_access = now

    def get_or_create(self, gw_hash: int, now: float) -> Block:
        block = self.blocks.get(gw_hash)
        if block is None:
            block = self.blocks[gw_hash] = Block(gw_hash, self, now)
        return block
