"""Who holds which block: the pod bits on blocks, kept in step with the pods' entries.

Every change of a block's masks goes through `Holdings`, which keeps the `PrefixStore`
invariants (see block.py) and the table-wide counts of (pod, block) pairs and of
router-side entries. A block nobody holds any more is dropped from its store at once.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from indexer.block import PrefixStore
from indexer.pod import IndexedPod, Target, release_extra
from indexer.types import REAL_TIERS, EngineHash, Tier

_GPU, _EXPECTED = Tier.GPU, Tier.EXPECTED


class Holdings:
    """The pod-bit bookkeeping shared by event application, expiry and eviction."""

    __slots__ = ("_by_bit", "expected_count", "pairs")

    def __init__(self, by_bit: Mapping[int, IndexedPod]) -> None:
        self._by_bit = by_bit  # the table's registered pods by bit (read only here)
        self.pairs = 0
        """(pod, block) pairs held in a real tier. Event application bumps it inline in
        its common case (a block new to the pod, on GPU only) to keep that loop short."""
        self.expected_count = 0
        """Router-side (expected) entries over all pods."""

    def link(
        self, state: IndexedPod, store: PrefixStore, hashes: Iterable[int], tier: Tier
    ) -> None:
        """A new engine entry of `state` in `tier` stands for these blocks of `store`
        (created by the caller with `PrefixStore.touch`)."""
        bit = state.bit
        held, tiers = store.held, store.tiers
        for gw_hash in hashes:
            if tier is _GPU and gw_hash not in tiers:
                mask = held[gw_hash]
                if mask & bit:
                    add_extra_ref(state, store, gw_hash, tier)
                else:
                    held[gw_hash] = mask | bit
                    self.pairs += 1
                continue
            masks = store.tier_masks(gw_hash)
            if masks[tier] & bit:
                add_extra_ref(state, store, gw_hash, tier)
                continue
            if not store.real_mask(gw_hash) & bit:
                self.pairs += 1
            masks[tier] |= bit
            if masks[_EXPECTED] & bit:  # a BlockStored confirmed the router's expectation
                masks[_EXPECTED] &= ~bit
                del state.expected[state.key(store, gw_hash)]
                self.expected_count -= 1
            store.refresh(gw_hash, masks)

    def unlink(self, state: IndexedPod, store: PrefixStore, gw_hash: int, tier: Tier) -> None:
        """One engine entry of `state` in `tier` no longer stands for `gw_hash`."""
        refs = state.extra_refs[tier]
        if refs and release_extra(refs, state.key(store, gw_hash)):
            return
        held = store.held
        mask = held.get(gw_hash)
        if mask is None:
            return
        bit = state.bit
        masks = store.tiers.get(gw_hash)
        if masks is None:
            self.pairs -= 1
            mask &= ~bit
            if mask:
                held[gw_hash] = mask
            else:
                store.forget(gw_hash)
        else:
            masks[tier] &= ~bit
            if not store.real_mask(gw_hash) & bit:
                self.pairs -= 1
            store.refresh(gw_hash, masks)

    def unlink_target(self, state: IndexedPod, target: Target, tier: Tier) -> None:
        if type(target) is int:
            base = state.base
            if base is not None:
                self.unlink(state, base, target, tier)
            return
        store, hashes = state.resolve(target)
        for gw_hash in hashes:
            self.unlink(state, store, gw_hash, tier)

    def drop_entry(
        self, state: IndexedPod, tier: Tier, engine_hash: EngineHash, old: Target
    ) -> None:
        """Drop the engine entry `engine_hash` of `state` in `tier` (all its copies)."""
        del state.entries[tier][engine_hash]
        state.copies[tier].pop(engine_hash, None)
        state.size -= 1
        self.unlink_target(state, old, tier)

    def drop_expected_bit(self, store: PrefixStore, gw_hash: int, bit: int) -> None:
        """Drop the router-side entry of the pod with `bit` from a block (the caller has
        already removed it from the pod's `expected`)."""
        masks = store.tiers.get(gw_hash)
        if masks is None:
            return
        masks[_EXPECTED] &= ~bit
        self.expected_count -= 1
        store.refresh(gw_hash, masks)

    def drop_pod(self, state: IndexedPod) -> None:
        """Remove `state`'s bit from every block it holds or expects, and empty it."""
        bit = state.bit
        for tier in REAL_TIERS:
            for target in state.entries[tier].values():
                store, hashes = state.resolve(target)
                for gw_hash in hashes:
                    self._drop_bit(store, gw_hash, bit)
        for key in state.expected:
            store, gw_hash = state.unkey(key)
            self._drop_bit(store, gw_hash, bit)
        state.clear()

    def _drop_bit(self, store: PrefixStore, gw_hash: int, bit: int) -> None:
        """Remove the pod with `bit` from a block in every tier (idempotent)."""
        mask = store.held.get(gw_hash, 0)
        if not mask & bit:
            return
        masks = store.tiers.get(gw_hash)
        if masks is None:
            self.pairs -= 1
            mask &= ~bit
            if mask:
                store.held[gw_hash] = mask
            else:
                store.forget(gw_hash)
            return
        if store.real_mask(gw_hash) & bit:
            self.pairs -= 1
        if masks[_EXPECTED] & bit:
            self.expected_count -= 1
        for tier in Tier:
            masks[tier] &= ~bit
        store.refresh(gw_hash, masks)

    def kill(self, store: PrefixStore, gw_hash: int) -> int:
        """Drop a block for every pod (a cap was crossed); returns how many pods' entries
        now point at it (to be swept)."""
        holders = store.real_mask(gw_hash).bit_count()
        self.pairs -= holders
        masks = store.tiers.get(gw_hash)
        if masks is not None:
            expected = masks[_EXPECTED]
            while expected:
                low = expected & -expected
                expected ^= low
                state = self._by_bit[low]
                state.expected.pop(state.key(store, gw_hash), None)
                self.expected_count -= 1
        store.forget(gw_hash)
        return holders


def add_extra_ref(state: IndexedPod, store: PrefixStore, gw_hash: int, tier: Tier) -> None:
    """Another engine entry of `state` in `tier` stands for a block it already holds."""
    refs = state.extra_refs[tier]
    key = state.key(store, gw_hash)
    refs[key] = refs.get(key, 0) + 1
