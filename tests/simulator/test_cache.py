"""Cache semantics: matching, references, LRU leaf eviction, host tier, events."""

from __future__ import annotations

from simulator import Allocation, PagedPrefixCache, RecordingSink, Tier
from simulator.block_hash import BlockHasher
from simulator.latency import LatencyModel

BS = 4


def make(gpu: int = 8, host: int = 0) -> tuple[PagedPrefixCache, RecordingSink]:
    sink = RecordingSink()
    return PagedPrefixCache(BlockHasher(BS), sink, gpu_blocks=gpu, host_blocks=host), sink


def run_request(cache: PagedPrefixCache, tokens: list[int], max_new: int = 1) -> Allocation:
    alloc = cache.acquire(tokens, len(tokens) + max_new)
    assert alloc is not None
    cache.commit(alloc, tokens)
    return alloc


def test_store_then_match_caps_at_last_token() -> None:
    cache, sink = make()
    tokens = list(range(12))
    alloc = run_request(cache, tokens)
    assert sink.events == [("stored", tuple(b.key for b in alloc.blocks), None, "GPU")]
    cache.release(alloc)
    # 12 tokens = 3 full blocks, but the last token is always recomputed: 2 blocks match.
    assert len(cache.match(tokens)) == 2
    assert len(cache.match([*tokens, 99])) == 3
    assert cache.match([1, *tokens]) == []


def test_hashes_chain_on_parent() -> None:
    hasher = BlockHasher(BS)
    a = hasher.chain([1, 2, 3, 4, 5, 6, 7, 8])
    b = hasher.chain([9, 9, 9, 9, 5, 6, 7, 8])
    assert a[1] != b[1]  # same block tokens, different parent
    assert hasher.chain([1, 2, 3, 4, 5, 6, 7, 8]) == a
    assert BlockHasher(BS, seed=1).chain([1, 2, 3, 4]) != a[:1]


def test_stores_are_incremental_and_parented() -> None:
    cache, sink = make()
    first = run_request(cache, list(range(8)))
    cache.release(first)
    second = run_request(cache, [*range(8), 50, 51, 52, 53, 54])
    assert second.hits[Tier.GPU] == 2
    assert sink.events[-1] == ("stored", (second.blocks[2].key,), first.blocks[1].key, "GPU")


def test_lru_evicts_unreferenced_leaves_tail_first() -> None:
    cache, sink = make(gpu=4)
    a = run_request(cache, list(range(8)), max_new=0)
    cache.release(a)
    b = run_request(cache, list(range(100, 108)), max_new=0)  # fills the cache, b held
    sink.events.clear()
    c = cache.acquire(list(range(200, 208)), 8)
    assert c is not None
    removed = [e[1][0] for e in sink.events if e[0] == "removed"]
    assert removed == [a.blocks[1].key, a.blocks[0].key]  # tail first, never b's blocks
    assert all(Tier.GPU in blk.tiers for blk in b.blocks)
    assert cache.acquire(list(range(300, 308)), 8) is None  # everything left is referenced
    assert cache.gpu_used <= 4


def test_evictions_precede_the_store_that_needed_them() -> None:
    cache, sink = make(gpu=2)
    cache.release(run_request(cache, list(range(8)), max_new=0))
    sink.events.clear()
    run_request(cache, list(range(10, 18)), max_new=0)
    kinds = [e[0] for e in sink.events]
    assert kinds == ["removed", "removed", "stored"]


def test_generated_tokens_fill_blocks() -> None:
    cache, sink = make()
    prompt = [1, 2, 3, 4, 5, 6]
    alloc = run_request(cache, prompt, max_new=6)
    assert len(alloc.blocks) == 1
    cache.commit(alloc, [*prompt, 7, 8, 9])
    assert len(alloc.blocks) == 2
    assert sink.events[-1][2] == alloc.blocks[0].key


def test_host_tier_takes_gpu_evictions_and_serves_hits() -> None:
    cache, sink = make(gpu=3, host=2)
    a_tokens = list(range(9))
    cache.release(run_request(cache, a_tokens, max_new=0))
    cache.release(run_request(cache, list(range(100, 109)), max_new=0))
    moved = [e for e in sink.events if e[3] == "CPU"]
    assert [e[0] for e in moved] == ["stored", "stored"]
    match = cache.match(a_tokens)
    assert [b.best_tier() for b in match] == [Tier.CPU, Tier.CPU]
    sink.events.clear()
    again = cache.acquire(a_tokens, 10)
    assert again is not None and again.hits[Tier.CPU] == 2
    assert all(Tier.GPU in b.tiers for b in again.blocks)
    assert sink.events[-1][0] == "stored" and sink.events[-1][3] == "GPU"
    assert cache.count(Tier.CPU) <= 2


def test_host_lru_evicts_for_real() -> None:
    cache, sink = make(gpu=1, host=1)
    for start in (0, 100, 200):
        cache.release(run_request(cache, list(range(start, start + 4)), max_new=0))
    cpu_removed = [e for e in sink.events if e == ("removed", e[1], None, "CPU")]
    assert len(cpu_removed) == 1
    assert cache.count(Tier.CPU) == 1 and cache.count(Tier.GPU) == 1


def test_cached_prefix_costs_less_prefill() -> None:
    model = LatencyModel()
    cold = model.prefill_seconds(10_826)
    warm = model.prefill_seconds(1_191, 9_635)
    assert warm < cold / 4
    assert model.prefill_seconds(1_191, 9_635, host_tokens=9_635) > warm
    assert 0.35 < model.prefill_seconds(3_158) < 0.5  # calibration point: 421.5 ms


def test_reset_clears_everything() -> None:
    cache, sink = make()
    cache.release(run_request(cache, list(range(9))))
    cache.reset()
    assert sink.events[-1][0] == "cleared"
    assert cache.count(Tier.GPU) == 0 and cache.match(list(range(9))) == []
