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

_EXPECTED = Tier.EXPECTED

Expiry = tuple[float, int, IndexedPod, Key]
"""(expiry, tiebreak, pod, block key). Entries whose pod or expiry changed since they were
pushed are skipped when popped, and dropped by the next compaction."""


class ExpectedEntries:
    """Adds router-side entries, caps them per pod, and expires them."""

    __slots__ = ("_heap", "_holdings", "_max_per_pod", "_pods", "_seq", "expired")

    def __init__(
        self, pods: Mapping[str, IndexedPod], holdings: Holdings, max_per_pod: int
    ) -> None:
        self._pods = pods  # the table's registered pods (read only here)
        self._holdings = holdings
        self._max_per_pod = max_per_pod
        self._heap: list[Expiry] = []
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
        for real are skipped. Returns the entries added or refreshed."""
        bit = state.bit
        expected = state.expected
        heap = self._heap
        seq = self._seq
        added = refreshed = 0
        state.use_store(store)
        key_of = state.key
        for gw_hash in prefix_hashes:
            store.touch(gw_hash, now)
            if store.real_mask(gw_hash) & bit:
                continue
            key = key_of(store, gw_hash)
            if key in expected:
                del expected[key]  # re-inserted below: dict order is the pod's LRU order
            else:
                masks = store.tier_masks(gw_hash)
                masks[_EXPECTED] |= bit
                store.refresh(gw_hash, masks)
                added += 1
            expected[key] = expiry
            seq += 1
            heapq.heappush(heap, (expiry, seq, state, key))
            refreshed += 1
        self._seq = seq
        holdings = self._holdings
        holdings.expected_count += added
        overflow = len(expected) - self._max_per_pod
        if overflow > 0:
            for key in list(islice(expected, overflow)):
                del expected[key]
                holdings.drop_expected_bit(*state.unkey(key), bit)
        return refreshed

    def expire(self, now: float) -> None:
        """Drop every entry due by `now`."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            expiry, _, state, key = heapq.heappop(heap)
            if self._pods.get(state.name) is not state or state.expected.get(key) != expiry:
                continue  # refreshed, confirmed, evicted, or the pod went
            del state.expected[key]
            self._holdings.drop_expected_bit(*state.unkey(key), state.bit)
            self.expired += 1

    def compact_if_sparse(self) -> None:
        """Rebuild the heap without its stale items once they outnumber the live ones
        (entries confirmed or refreshed are left in it until popped)."""
        if len(self._heap) <= 4 * self._holdings.expected_count + 1024:
            return
        pods = self._pods
        live = [
            (expiry, seq, state, key)
            for expiry, seq, state, key in self._heap
            if pods.get(state.name) is state and state.expected.get(key) == expiry
        ]
        heapq.heapify(live)
        self._heap = live
