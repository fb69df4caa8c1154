"""Router-side entries: blocks a pod is expected to hold because the router sent it a
request (or because the pod publishes no events), each until its expiry.

A pod's entries live in `IndexedPod.expected` (block key -> expiry, in LRU order) and as
the EXPECTED bit on the blocks; one heap over the whole table finds the ones due.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from itertools import islice

from indexer.block import PrefixStore
from indexer.holdings import Holdings
from indexer.pod import IndexedPod, Key
from indexer.types import Tier

_GPU, _CPU, _STORAGE, _EXPECTED = Tier.GPU, Tier.CPU, Tier.STORAGE, Tier.EXPECTED

Expiry = tuple[float, int, IndexedPod, list[Key]]
"""(expiry, tiebreak, pod, block keys): one routing decision's entries. Entries whose pod
or expiry changed since they were pushed are skipped when popped, and dropped by the next
compaction."""


class ExpectedEntries:
    """Adds router-side entries, caps them per pod, and expires them."""

    __slots__ = ("_heap", "_heap_keys", "_holdings", "_max_per_pod", "_pods", "_seq", "expired")

    def __init__(
        self, pods: Mapping[str, IndexedPod], holdings: Holdings, max_per_pod: int
    ) -> None:
        self._pods = pods  # the table's registered pods (read only here)
        self._holdings = holdings
        self._max_per_pod = max_per_pod
        self._heap: list[Expiry] = []
        self._heap_keys = 0
        """Block keys in `_heap`, live or stale."""
        self._seq = 0
        self.expired = 0
        """Entries dropped because they expired."""

    def add(
        self,
        state: IndexedPod,
        store: PrefixStore,
        prefix_hashes: Sequence[int],
        expiry: float,
        now: float,
    ) -> int:
        """Expect `state` to hold these blocks of `store` until `expiry`; blocks it holds
        for real are skipped. Returns the entries added or refreshed.

        Runs for every request routed (a prompt's every block), so the store's block
        operations (`touch`, `real_mask`, `tier_masks`, `refresh`) are inlined here, and
        the call's entries share one heap item."""
        bit = state.bit
        expected = state.expected
        state.use_store(store)
        base = store is state.base
        held, tiers, access = store.held, store.tiers, store.access
        keys: list[Key] = []
        added = 0
        for gw_hash in prefix_hashes:
            masks = tiers.get(gw_hash)
            if masks is None:
                mask = held.get(gw_hash, 0)
                if mask & bit:  # held on GPU for real
                    access[gw_hash] = now
                    continue
                tiers[gw_hash] = [mask, 0, 0, bit]
                held[gw_hash] = mask | bit
                added += 1
            elif (masks[_GPU] | masks[_CPU] | masks[_STORAGE]) & bit:
                access[gw_hash] = now
                continue
            elif not masks[_EXPECTED] & bit:
                masks[_EXPECTED] |= bit
                held[gw_hash] = masks[_GPU] | masks[_CPU] | masks[_STORAGE] | masks[_EXPECTED]
                added += 1
            access[gw_hash] = now
            key = gw_hash if base else (store, gw_hash)
            if key in expected:
                del expected[key]  # re-inserted below: dict order is the pod's LRU order
            expected[key] = expiry
            keys.append(key)
        if keys:
            self._seq += 1
            heapq.heappush(self._heap, (expiry, self._seq, state, keys))
            self._heap_keys += len(keys)
        holdings = self._holdings
        holdings.expected_count += added
        overflow = len(expected) - self._max_per_pod
        if overflow > 0:
            for key in list(islice(expected, overflow)):
                del expected[key]
                holdings.drop_expected_bit(*state.unkey(key), bit)
        return len(keys)

    def expire(self, now: float) -> None:
        """Drop every entry due by `now`."""
        heap = self._heap
        pods = self._pods
        drop = self._holdings.drop_expected_bit
        while heap and heap[0][0] <= now:
            expiry, _, state, keys = heapq.heappop(heap)
            self._heap_keys -= len(keys)
            if pods.get(state.name) is not state:
                continue  # the pod went
            expected = state.expected
            for key in keys:
                if expected.get(key) != expiry:
                    continue  # refreshed, confirmed or evicted since
                del expected[key]
                drop(*state.unkey(key), state.bit)
                self.expired += 1

    def compact_if_sparse(self) -> None:
        """Rebuild the heap without its stale entries once they outnumber the live ones
        (entries confirmed or refreshed are left in it until popped)."""
        if self._heap_keys <= 4 * self._holdings.expected_count + 1024:
            return
        pods = self._pods
        live: list[Expiry] = []
        for expiry, seq, state, keys in self._heap:
            if pods.get(state.name) is not state:
                continue
            expected = state.expected
            kept = [key for key in keys if expected.get(key) == expiry]
            if kept:
                live.append((expiry, seq, state, kept))
        heapq.heapify(live)
        self._heap = live
        self._heap_keys = sum(len(keys) for _, _, _, keys in live)
