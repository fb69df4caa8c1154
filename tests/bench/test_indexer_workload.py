"""The indexer benchmarks' synthetic streams, applied to a real table."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.indexer_workload import ChainShape, RemovedEvent, StoredEvent, build_churn
from indexer import IndexConfig, IndexLimits, SyncPrefixHashTable


@pytest.mark.parametrize("pure", [False, True])
def test_the_churn_stream_keeps_every_pod_full_and_prefix_closed(pure: bool) -> None:
    """Each pod holds at most its share of the blocks, evicts least recently used ones
    tail first (never a block whose child it still holds: no later store breaks its chain)
    and removes only what it holds; the stream interleaves the pods."""
    pods, held = 4, 2_000
    workload = build_churn(
        pods=pods, held_blocks=held, shape=ChainShape(chain_blocks=32, system_blocks=(2, 8))
    )
    limits = IndexLimits(max_prefixes_per_context=10**7, max_blocks_per_pod=10**7)
    table = SyncPrefixHashTable(IndexConfig(limits=limits, pure_python=pure))
    for pod in workload.pods:
        table.register_pod(pod, "m")
    capacity = held // pods
    switches = 0
    previous = None
    parent_of: dict[tuple[str, int], int | None] = {}
    children: Counter[tuple[str, int | None]] = Counter()  # held blocks per parent
    for pod, event in workload.stream:
        if isinstance(event, RemovedEvent):
            for block in event.block_hashes:
                assert children[(pod, block)] == 0, "a block evicted before its child"
                children[(pod, parent_of.pop((pod, block)))] -= 1
            assert table.apply_removed(pod, event.block_hashes, "GPU") == len(event.block_hashes)
        else:
            assert isinstance(event, StoredEvent)
            parent = event.parent_block_hash
            for block in event.block_hashes:
                assert (pod, block) not in parent_of, "a block announced while held"
                parent_of[(pod, block)] = parent
                children[(pod, parent)] += 1
                parent = block
            assert table.apply_stored(pod, event.as_decoded()) == len(event.block_hashes)
        switches += pod != previous
        previous = pod
        if isinstance(event, RemovedEvent):
            assert table.held_blocks(pod) <= capacity
    stats = table.stats()
    assert stats.broken_chain_events == 0 and stats.unknown_removals == 0
    assert stats.pairs == workload.held_blocks == sum(table.held_blocks(p) for p in workload.pods)
    assert workload.stored_blocks - workload.removed_blocks == workload.held_blocks
    assert workload.stored_blocks >= 3.0 * held and workload.removed_blocks > 0
    assert switches > len(workload.stream) // 10
    assert Counter(pod for pod, _chain in workload.prompts).keys() <= set(workload.pods)
