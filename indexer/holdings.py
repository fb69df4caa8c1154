"""Who holds which block: the pod bits on blocks, kept in step with the pods' entries.

Every change of a block's masks goes through `Holdings`, which keeps the `Block`
invariants (see block.py) and the table-wide counts of (pod, block) pairs and of
router-side entries. A block nobody holds any more is dropped from its store at once.
"""

from __future__ import annotations

from collections.abc import Mapping

from indexer.block import Block
from indexer.pod import PodState, Target, blocks_of
from indexer.types import REAL_TIERS, EngineHash, Tier

_GPU, _EXPECTED = Tier.GPU, Tier.EXPECTED


class Holdings:
    """The pod-bit bookkeeping shared by event application, expiry and eviction."""

    __slots__ = ("_by_bit", "expected_count", "pairs")

    def __init__(self, by_bit: Mapping[int, PodState]) -> None:
        self._by_bit = by_bit  # the table's registered pods by bit (read only here)
        self.pairs = 0
        """(pod, block) pairs held in a real tier. Event application bumps it inline in
        its common case (a block new to the pod, on GPU only) to keep that loop short."""
        self.expected_count = 0
        """Router-side (expected) entries over all pods."""

    def link(self, state: PodState, target: Target, tier: Tier) -> None:
        """A new engine entry of `state` in `tier` stands for `target`."""
        bit = state.bit
        for block in blocks_of(target):
            if block.masks is None and tier is _GPU:
                if block.held & bit:
                    add_extra_ref(state, block, tier)
                else:
                    block.held |= bit
                    self.pairs += 1
                continue
            masks = block.tier_masks()
            if masks[tier] & bit:
                add_extra_ref(state, block, tier)
                continue
            if not block.real_mask() & bit:
                self.pairs += 1
            masks[tier] |= bit
            if masks[_EXPECTED] & bit:  # a BlockStored confirmed the router's expectation
                masks[_EXPECTED] &= ~bit
                del state.expected[block]
                self.expected_count -= 1
            block.refresh()

    def unlink(self, state: PodState, block: Block, tier: Tier) -> None:
        """One engine entry of `state` in `tier` no longer stands for `block`."""
        refs = state.extra_refs[tier]
        extra = refs.get(block)
        if extra:
            if extra == 1:
                del refs[block]
            else:
                refs[block] = extra - 1
            return
        if block.store is None:
            return
        bit = state.bit
        if block.masks is None:
            block.held &= ~bit
            self.pairs -= 1
        else:
            block.masks[tier] &= ~bit
            if not block.real_mask() & bit:
                self.pairs -= 1
            block.refresh()
        if not block.held:
            forget(block)

    def drop_entry(self, state: PodState, tier: Tier, engine_hash: EngineHash, old: Target) -> None:
        """Drop the engine entry `engine_hash` of `state` in `tier` (all its copies)."""
        del state.entries[tier][engine_hash]
        state.copies[tier].pop(engine_hash, None)
        state.size -= 1
        for block in blocks_of(old):
            self.unlink(state, block, tier)

    def drop_expected_bit(self, block: Block, bit: int) -> None:
        """Drop the router-side entry of the pod with `bit` from `block` (the caller has
        already removed it from the pod's `expected`)."""
        if block.store is None or block.masks is None:
            return
        block.masks[_EXPECTED] &= ~bit
        block.refresh()
        self.expected_count -= 1
        if not block.held:
            forget(block)

    def drop_pod(self, state: PodState) -> None:
        """Remove `state`'s bit from every block it holds or expects, and empty it."""
        bit = state.bit
        for tier in REAL_TIERS:
            for target in state.entries[tier].values():
                for block in blocks_of(target):
                    self._drop_bit(block, bit)
        for block in state.expected:
            self._drop_bit(block, bit)
        state.clear()

    def _drop_bit(self, block: Block, bit: int) -> None:
        """Remove the pod with `bit` from `block` in every tier (idempotent)."""
        if block.store is None or not block.held & bit:
            return
        if block.masks is None:
            block.held &= ~bit
            self.pairs -= 1
        else:
            masks = block.masks
            if block.real_mask() & bit:
                self.pairs -= 1
            if masks[_EXPECTED] & bit:
                self.expected_count -= 1
            for tier in Tier:
                masks[tier] &= ~bit
            block.refresh()
        if not block.held:
            forget(block)

    def kill(self, block: Block) -> int:
        """Drop a block for every pod (a cap was crossed); returns how many pods' entries
        now point at it (to be swept)."""
        holders = block.real_mask().bit_count()
        self.pairs -= holders
        if block.masks is not None:
            expected = block.masks[_EXPECTED]
            while expected:
                low = expected & -expected
                expected ^= low
                self._by_bit[low].expected.pop(block, None)
                self.expected_count -= 1
        block.held = 0
        block.masks = None
        forget(block)
        return holders


def add_extra_ref(state: PodState, block: Block, tier: Tier) -> None:
    """Another engine entry of `state` in `tier` stands for a block it already holds."""
    refs = state.extra_refs[tier]
    refs[block] = refs.get(block, 0) + 1


def forget(block: Block) -> None:
    """Drop a block nobody holds from its store."""
    store = block.store
    if store is not None:
        del store.blocks[block.gw_hash]
        block.store = None
