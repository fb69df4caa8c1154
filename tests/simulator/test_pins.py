"""Pin semantics: the intent of SGLang's 11 pin unit tests (seed 001) plus the tier-aware
cases it left as TODO, pin-aware flush and the scheduler's auto-unpin safety net."""

from __future__ import annotations

import asyncio
import random

from simulator import PagedPrefixCache, RecordingSink, Tier
from simulator.block_hash import BlockHasher
from simulator.latency import LatencyModel
from simulator.scheduler import Scheduler, SimRequest

BS = 4
A = list(range(0, 8))  # 2 blocks
B = list(range(100, 108))  # 2 blocks, another chain


def make(gpu: int = 8, host: int = 0) -> tuple[PagedPrefixCache, RecordingSink]:
    sink = RecordingSink()
    return PagedPrefixCache(BlockHasher(BS), sink, gpu_blocks=gpu, host_blocks=host), sink


def insert(cache: PagedPrefixCache, tokens: list[int]) -> list[int]:
    alloc = cache.acquire(tokens, len(tokens))
    assert alloc is not None
    cache.commit(alloc, tokens)
    cache.release(alloc)
    return [b.key for b in alloc.blocks]


def resident(cache: PagedPrefixCache, tier: Tier = Tier.GPU) -> set[int]:
    return {b.key for b in cache.resident(tier)}


def test_block_hash_index_populated_on_insert() -> None:
    cache, sink = make()
    keys = insert(cache, A[:4])
    assert len(keys) == 1 and cache.get(keys[0]) is not None
    assert sink.events[0][1] == tuple(keys)


def test_block_hash_index_multiple_pages() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    assert len(set(keys)) == 2 and all(cache.get(k) is not None for k in keys)


def test_index_cleared_on_reset() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    assert cache.pin(keys) == 2
    cache.reset()
    assert cache.get(keys[0]) is None and cache.pinned_blocks == 0
    assert cache.unpin(keys) == 0


def test_index_cleared_on_evict() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    cache.flush()
    assert all(cache.get(k) is None for k in keys)


def test_pin_unknown_hash() -> None:
    cache, _ = make()
    assert cache.pin([12345]) == 0


def test_unpin_unknown_hash() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    assert cache.unpin([12345, keys[0]]) == 0  # known but never pinned counts 0 too


def test_pin_protects_from_eviction() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    assert cache.pin([keys[1]]) == 1
    cache.flush()
    assert resident(cache) == set(keys)


def test_unpin_restores_evictable_status() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    cache.pin([keys[1]])
    assert cache.unpin([keys[1]]) == 1
    cache.flush()
    assert resident(cache) == set()


def test_pin_survives_eviction_unpin_does_not() -> None:
    cache, _ = make()
    a, b = insert(cache, A), insert(cache, B)
    cache.pin(a)
    cache.flush()
    assert resident(cache) == set(a)
    assert all(cache.get(k) is None for k in b)
    cache.unpin(a)
    cache.flush()
    assert resident(cache) == set()


def test_double_pin_requires_double_unpin() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    cache.pin(keys)
    cache.pin(keys)
    cache.unpin(keys)
    cache.flush()
    assert resident(cache) == set(keys)
    cache.unpin(keys)
    cache.flush()
    assert resident(cache) == set()


def test_pin_protects_ancestors() -> None:
    cache, _ = make()
    parent, leaf = insert(cache, A)
    cache.pin([leaf])
    cache.flush()
    assert resident(cache) == {parent, leaf}
    assert cache.get(parent).protect == 1 and cache.get(parent).pin_count == 0  # type: ignore[union-attr]


def test_request_references_are_separate_from_pins() -> None:
    cache, _ = make()
    keys = insert(cache, A)
    cache.pin(keys)
    alloc = cache.acquire([*A, 1], 9)
    assert alloc is not None
    cache.release(alloc)  # a finishing request does not drop the pin
    cache.flush()
    assert resident(cache) == set(keys)
    alloc = cache.acquire([*A, 1], 9)
    assert alloc is not None
    cache.unpin(keys)  # an unpin does not drop the request's references
    cache.flush()
    assert resident(cache) == set(keys)
    cache.release(alloc)


# ---- tier-aware pins (the seed's TODO) ------------------------------------------------
def test_pinned_block_may_leave_gpu_for_host_but_never_leaves_host() -> None:
    cache, sink = make(gpu=3, host=2)
    a = insert(cache, A)
    cache.pin(a)
    for start in range(200, 240, 8):  # flood: 5 chains through a 3-block GPU and 2-block host
        insert(cache, list(range(start, start + 8)))
    assert resident(cache, Tier.CPU) == set(a)
    assert not resident(cache, Tier.GPU) & set(a)
    assert ("removed", (a[0],), None, "CPU") not in sink.events
    again = cache.acquire([*A, 1], 9)  # loads back from host
    assert again is not None and again.hits[Tier.CPU] == 2


def test_pins_lock_the_gpu_without_a_host_tier() -> None:
    cache, _ = make(gpu=3)
    a = insert(cache, A)
    cache.pin(a)
    assert cache.acquire(B, 8) is None  # needs 2 slots, only 1 is free and pins hold 2
    assert cache.acquire(B[:4], 4) is not None


def test_flush_keeps_pinned_blocks_on_host() -> None:
    cache, _ = make(gpu=4, host=4)
    a, b = insert(cache, A), insert(cache, B)
    cache.pin(a)
    cache.flush()
    assert resident(cache, Tier.GPU) == set()
    assert resident(cache, Tier.CPU) == set(a)
    assert all(cache.get(k) is None for k in b)


async def test_auto_unpin_when_pins_leave_no_room() -> None:
    cache, _ = make(gpu=3)
    cache.pin(insert(cache, A))

    async def no_wait(_: float) -> None:
        await asyncio.sleep(0)

    published: list[int] = []

    async def on_step_end() -> None:
        published.append(1)

    scheduler = Scheduler(
        cache,
        LatencyModel(),
        max_batch=4,
        max_batched_tokens=1024,
        on_step_end=on_step_end,
        clock=lambda: 0.0,
        sleep=no_wait,
    )
    request = SimRequest("r", list(range(300, 308)), 2, random.Random(0), (7, 8))
    scheduler.submit(request)
    assert await scheduler.step()
    assert scheduler.stats.auto_unpins == 1 and cache.pinned_blocks == 0
    while not request.finished:
        await scheduler.step()
    assert request.generated and request.stream.qsize() == len(request.generated) + 1
