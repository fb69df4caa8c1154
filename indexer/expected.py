"""Router-side entries: blocks a pod is expected to hold because the router sent it a
request (or because the pod publishes no events), each until its expiry.

A pod's entries live in `PodState.expected` (block -> expiry, in LRU order) and as the
EXPECTED bit on the blocks; one heap over the whole table finds the ones due.
"""

from __future__ import annotations

import heapq
from collections.abc import Mapping, Sequence
from itertools import islice

from indexer.block import Block, PrefixStore
from indexer.holdings import Holdings
from indexer.pod import PodState
from indexer.types import Tier

_EXPECTED = Tier.EXPECTED

Expiry = tuple[float, int, PodState, Block]
"""(expiry, tiebreak, pod, block). Entries whose pod or expiry changed since they were
pushed are skipped when popped, and dropped by the next compaction."""


class ExpectedEntries:
    """Adds router-side entries, caps them per pod, and expires them."""

    __slots__ = ("_heap", "_holdings", "_max_per_pod", "_pods", "_seq", "expired")

    def __init__(self, pods: Mapping[str, PodState], holdings: Holdings, max_per_pod: int) -> None:
        self._pods = pods  # the table's registered pods (read only here)
        self._holdings = holdings
        self._max_per_pod = max_per_pod
        self._heap: list[Expiry] = []
        self._seq = 0
        self.expired = 0
        """Entries dropped because they expired."""

    def add(
        self,
        state: PodState,
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
        for gw_hash in prefix_hashes:
            block = store.get_or_create(gw_hash, now)
            block.last_access = now
            if block.real_mask() & bit:
                continue
            if block in expected:
                del expected[block]  # re-inserted below: dict order is the pod's LRU order
            else:
                masks = block.tier_masks()
                masks[_EXPECTED] |= bit
                block.refresh()
                added += 1
            expected[block] = expiry
            seq += 1
            heapq.heappush(heap, (expiry, seq, state, block))
            refreshed += 1
        self._seq = seq
        holdings = self._holdings
        holdings.expected_count += added
        overflow = len(expected) - self._max_per_pod
        if overflow > 0:
            for block in list(islice(expected, overflow)):
                del expected[block]
                holdings.drop_expected_bit(block, bit)
        return refreshed

    def expire(self, now: float) -> None:
        """Drop every entry due by `now`."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            expiry, _, state, block = heapq.heappop(heap)
            if self._pods.get(state.name) is not state or state.expected.get(block) != expiry:
                continue  # refreshed, confirmed, evicted, or the pod went
            del state.expected[block]
            self._holdings.drop_expected_bit(block, state.bit)
            self.expired += 1

    def compact_if_sparse(self) -> None:
        """Rebuild the heap without its stale items once they outnumber the live ones
        (entries confirmed or refreshed are left in it until popped)."""
        if len(self._heap) <= 4 * self._holdings.expected_count + 1024:
            return
        pods = self._pods
        live = [
            (expiry, seq, state, block)
            for expiry, seq, state, block in self._heap
            if pods.get(state.name) is state and state.expected.get(block) == expiry
        ]
        heapq.heapify(live)
        self._heap = live
