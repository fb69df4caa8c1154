"""Hypothesis stateful test: the cache against a reference built only from its events.

The reference applies every BlockStored / BlockRemoved / AllBlocksCleared to per-tier sets,
so `events emitted == cache changes` is checked after every step, together with the
capacity, reference and pin invariants.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from simulator import Allocation, Block, PagedPrefixCache, RecordingSink, Tier
from simulator.block_hash import BlockHasher

BS = 2
PREFIXES = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9], [7, 7, 7, 7], []]


class CacheMachine(RuleBasedStateMachine):
    @initialize(gpu=st.integers(4, 10), host=st.sampled_from([0, 0, 3, 6]))
    def setup(self, gpu: int, host: int) -> None:
        self.sink = RecordingSink()
        self.cache = PagedPrefixCache(BlockHasher(BS), self.sink, gpu_blocks=gpu, host_blocks=host)
        self.host = host
        self.seen = 0
        self.reference: dict[str, set[int]] = {t.value: set() for t in Tier}
        self.running: list[tuple[Allocation, list[int], int]] = []
        self.pins: dict[int, int] = {}

    def _apply_events(self) -> None:
        for kind, keys, parent, medium in self.sink.events[self.seen :]:
            if kind == "cleared":
                for tier_set in self.reference.values():
                    tier_set.clear()
            elif kind == "stored":
                known = set().union(*self.reference.values())
                assert parent is None or parent in known, "stored under an unknown parent"
                for key in keys:
                    assert key not in self.reference[medium], "stored twice in one tier"
                    self.reference[medium].add(key)
            else:
                assert keys[0] in self.reference[medium], "removed a block not resident"
                self.reference[medium].discard(keys[0])
        self.seen = len(self.sink.events)

    @rule(
        prefix=st.sampled_from(PREFIXES),
        suffix=st.lists(st.integers(0, 3), max_size=5),
        max_new=st.integers(0, 4),
    )
    def start_request(self, prefix: list[int], suffix: list[int], max_new: int) -> None:
        tokens = prefix + suffix
        if not tokens:
            return
        alloc = self.cache.acquire(tokens, len(tokens) + max_new)
        if alloc is not None:
            self.cache.commit(alloc, tokens)
            self.running.append((alloc, tokens, max_new))

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100), token=st.integers(0, 3))
    def decode(self, index: int, token: int) -> None:
        alloc, tokens, left = self.running[index % len(self.running)]
        if left > 0:
            tokens.append(token)
            self.running[index % len(self.running)] = (alloc, tokens, left - 1)
            self.cache.commit(alloc, tokens)

    @precondition(lambda self: self.running)
    @rule(index=st.integers(0, 100))
    def finish(self, index: int) -> None:
        alloc, _, _ = self.running.pop(index % len(self.running))
        self.cache.release(alloc)

    @rule(index=st.integers(0, 1000))
    def pin(self, index: int) -> None:
        blocks = [b for t in Tier for b in self.cache.resident(t)]
        if blocks:
            key = blocks[index % len(blocks)].key
            assert self.cache.pin([key]) == 1
            self.pins[key] = self.pins.get(key, 0) + 1

    @rule(index=st.integers(0, 1000))
    def unpin(self, index: int) -> None:
        pinned = sorted(self.pins)
        if pinned:
            key = pinned[index % len(pinned)]
            assert self.cache.unpin([key]) == 1
            self.pins[key] -= 1
            if not self.pins[key]:
                del self.pins[key]

    @precondition(lambda self: not self.running)
    @rule()
    def flush(self) -> None:
        self.cache.flush()

    @precondition(lambda self: not self.running)
    @rule()
    def reset(self) -> None:
        self.cache.reset()
        self.pins.clear()

    @invariant()
    def events_match_cache(self) -> None:
        self._apply_events()
        for tier in Tier:
            assert {b.key for b in self.cache.resident(tier)} == self.reference[tier.value]

    @invariant()
    def capacity_never_exceeded(self) -> None:
        assert self.cache.gpu_used <= self.cache.capacity[Tier.GPU]
        assert self.cache.count(Tier.GPU) == len(self.cache.resident(Tier.GPU))
        assert self.cache.count(Tier.CPU) <= self.host
        assert self.cache.reserved >= 0

    @invariant()
    def referenced_blocks_stay_on_gpu(self) -> None:
        for alloc, _, _ in self.running:
            for block in alloc.blocks:
                if block.ref_count > 0 and block.tiers:
                    assert Tier.GPU in block.tiers

    @invariant()
    def pinned_blocks_never_lost(self) -> None:
        keep = {Tier.GPU, Tier.CPU} if self.host else {Tier.GPU}
        for key, count in self.pins.items():
            block = self.cache.get(key)
            assert block is not None and block.pin_count == count
            node: Block | None = block
            while node is not None:  # the pinned block and every ancestor stay resident
                assert node.tiers & keep, "a pinned chain left its protected tiers"
                node = node.parent


CacheMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestCache = CacheMachine.TestCase
