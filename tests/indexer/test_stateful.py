"""Random event sequences against a deliberately naive model of what each pod holds.

The reference keeps, per pod and tier, engine hash -> (the whole token prefix the block
ends, number of copies) and answers matches by comparing token prefixes — no hashing,
no masks, no reverse index.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from indexer import ModelContext, SyncPrefixHashTable, Tier
from tests.helpers import FakeClock
from tests.indexer.conftest import Stored, make_table

BLOCK = 2  # gateway block size
PODS = ("p0", "p1", "p2")
MEDIA = ("GPU", "CPU", None)
CTX = ModelContext("m")

tokens = st.integers(min_value=0, max_value=3)  # tiny alphabet: prefixes collide often
engine_hashes = st.integers(min_value=0, max_value=12)  # small: duplicates and reuse


def boundaries(end: int, engine_block: int) -> range:
    """Gateway-block ends that fall inside the engine block ending at token `end`."""
    return range(end - end % BLOCK, max(end - engine_block, 0), -BLOCK)


def stands_for_the_same(old: Entry, prefix: tuple[int, ...], engine_block: int) -> bool:
    """A re-store is another copy when it stands for the same gateway blocks (an engine's
    block size never changes, so this only matters to the random model)."""
    return old.prefix == prefix and list(boundaries(len(prefix), old.engine_block)) == list(
        boundaries(len(prefix), engine_block)
    )


@dataclass
class Entry:
    prefix: tuple[int, ...]  # all tokens from the root to the end of this engine block
    engine_block: int
    parent: int | None  # the engine hash it was chained onto (to re-send it)
    copies: int = 1


@dataclass
class PodModel:
    # tier -> engine hash -> entry
    tiers: dict[Tier, dict[int, Entry]] = field(
        default_factory=lambda: {t: {} for t in (Tier.GPU, Tier.CPU, Tier.STORAGE)}
    )

    def lookup(self, engine_hash: int) -> Entry | None:
        for tier in (Tier.GPU, Tier.CPU, Tier.STORAGE):
            if engine_hash in self.tiers[tier]:
                return self.tiers[tier][engine_hash]
        return None

    def held(self) -> dict[tuple[int, ...], Tier]:
        """Gateway-block prefixes this pod holds, with their best tier: those ending inside
        an engine block it holds (an engine block smaller than a gateway block covers one
        only if it ends on a gateway boundary)."""
        best: dict[tuple[int, ...], Tier] = {}
        for tier in (Tier.STORAGE, Tier.CPU, Tier.GPU):  # better tiers overwrite
            for entry in self.tiers[tier].values():
                for boundary in boundaries(len(entry.prefix), entry.engine_block):
                    best[entry.prefix[:boundary]] = tier
        return best


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.table: SyncPrefixHashTable = make_table(self.clock, block_size=BLOCK)
        self.model: dict[str, PodModel] = {}
        # router-side entries: pod -> gateway-block prefix -> expiry
        self.expected: dict[str, dict[tuple[int, ...], float]] = {pod: {} for pod in PODS}
        self.prompts: list[tuple[int, ...]] = []
        self.engine_blocks: dict[str, int] = {}
        for pod in PODS:
            self.table.register_pod(pod, "m")
            self.model[pod] = PodModel()

    @initialize(
        sizes=st.lists(
            st.sampled_from((BLOCK, 2 * BLOCK, BLOCK // 2)), min_size=len(PODS), max_size=len(PODS)
        )
    )
    def engine_block_sizes(self, sizes: list[int]) -> None:
        """Each pod's engine has one block size (smaller, equal or larger than the
        gateway's) for its whole life, as a real engine does."""
        self.engine_blocks = dict(zip(PODS, sizes, strict=True))

    @rule(
        pod=st.sampled_from(PODS),
        hashes=st.lists(engine_hashes, min_size=1, max_size=4),
        parent=st.one_of(st.none(), engine_hashes),
        data=st.data(),
        medium=st.sampled_from(MEDIA),
    )
    def store(
        self,
        pod: str,
        hashes: list[int],
        parent: int | None,
        data: st.DataObject,
        medium: str | None,
    ) -> None:
        engine_block = self.engine_blocks[pod]
        block_tokens = data.draw(
            st.lists(
                tokens, min_size=len(hashes) * engine_block, max_size=len(hashes) * engine_block
            )
        )
        self._store(pod, hashes, parent, engine_block, block_tokens, medium)

    def _store(
        self,
        pod: str,
        hashes: list[int],
        parent: int | None,
        engine_block: int,
        block_tokens: list[int],
        medium: str | None,
    ) -> None:
        applied = self.table.apply_stored(
            pod,
            Stored(hashes, parent, block_tokens, block_size=engine_block, medium=medium),
        )
        model = self.model[pod]
        if parent is None:
            prefix: tuple[int, ...] = ()
        else:
            parent_entry = model.lookup(parent)
            misaligned = parent_entry is not None and (
                engine_block >= BLOCK and len(parent_entry.prefix) % BLOCK
            )
            if parent_entry is None or misaligned:  # unknown parent, or one mid-gateway-block
                assert applied == 0
                return
            prefix = parent_entry.prefix
        assert applied == len(hashes)
        tier_entries = model.tiers[Tier.from_medium(medium)]
        for i, engine_hash in enumerate(hashes):
            prefix = prefix + tuple(block_tokens[i * engine_block : (i + 1) * engine_block])
            old = tier_entries.get(engine_hash)
            if old is not None and stands_for_the_same(old, prefix, engine_block):
                old.copies += 1
            else:
                tier_entries[engine_hash] = Entry(prefix, engine_block, parent)
                # a stored block confirms, there and then, what the router expected
                for end in boundaries(len(prefix), engine_block):
                    self.expected[pod].pop(prefix[:end], None)
            parent = engine_hash
        if len(self.prompts) < 40:
            self.prompts.append(prefix)

    def _existing(self, data: st.DataObject) -> tuple[str, Tier, int, Entry] | None:
        entries = [
            (pod, tier, engine_hash, entry)
            for pod, model in self.model.items()
            for tier, tier_entries in model.tiers.items()
            for engine_hash, entry in tier_entries.items()
        ]
        return data.draw(st.sampled_from(entries)) if entries else None

    @rule(data=st.data())
    def store_again(self, data: st.DataObject) -> None:
        """Re-send a block a pod holds: a recomputed block, i.e. another copy."""
        existing = self._existing(data)
        if existing is None:
            return
        pod, tier, engine_hash, entry = existing
        medium = {Tier.GPU: "GPU", Tier.CPU: "CPU", Tier.STORAGE: "STORAGE"}[tier]
        block_tokens = list(entry.prefix[-entry.engine_block :])
        self._store(pod, [engine_hash], entry.parent, entry.engine_block, block_tokens, medium)

    @rule(data=st.data())
    def remove_existing(self, data: st.DataObject) -> None:
        existing = self._existing(data)
        if existing is None:
            return
        pod, tier, engine_hash, _ = existing
        self.remove(pod, [engine_hash], {Tier.GPU: "GPU", Tier.CPU: "CPU"}.get(tier, "STORAGE"))

    @rule(
        pod=st.sampled_from(PODS),
        hashes=st.lists(engine_hashes, min_size=1, max_size=4),
        medium=st.sampled_from(MEDIA),
    )
    def remove(self, pod: str, hashes: list[int], medium: str | None) -> None:
        self.table.apply_removed(pod, hashes, medium)
        tier_entries = self.model[pod].tiers[Tier.from_medium(medium)]
        for engine_hash in hashes:
            entry = tier_entries.get(engine_hash)
            if entry is None:
                continue
            entry.copies -= 1
            if entry.copies == 0:
                del tier_entries[engine_hash]

    @rule(pod=st.sampled_from(PODS))
    def clear(self, pod: str) -> None:
        self.table.apply_cleared(pod)
        self.model[pod] = PodModel()
        self.expected[pod] = {}

    @precondition(lambda self: self.prompts)
    @rule(pod=st.sampled_from(PODS), data=st.data(), ttl=st.sampled_from((1.0, 5.0)))
    def expect(self, pod: str, data: st.DataObject, ttl: float) -> None:
        """The router sent a prompt to `pod` and records the blocks it expects there."""
        prompt = data.draw(st.sampled_from(self.prompts))
        self.table.add_prefix(pod, CTX, self.table.prefix_hashes(prompt), ttl=ttl)
        held = self.model[pod].held()
        for end in range(BLOCK, len(prompt) + 1, BLOCK):
            if prompt[:end] not in held:
                self.expected[pod][prompt[:end]] = self.clock.now + ttl

    @rule(seconds=st.sampled_from((0.5, 1.0, 3.0)))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        for entries in self.expected.values():
            for prefix in [p for p, expiry in entries.items() if expiry <= self.clock.now]:
                del entries[prefix]

    @precondition(lambda self: len(self.model) > 1)
    @rule(pod=st.sampled_from(PODS))
    def remove_pod(self, pod: str) -> None:
        self.table.remove_pod(pod)
        self.table.register_pod(pod, "m")  # and it comes back empty, reusing its bit
        self.model[pod] = PodModel()
        self.expected[pod] = {}

    @rule(prompt=st.lists(tokens, min_size=0, max_size=10))
    def remember_prompt(self, prompt: list[int]) -> None:
        if len(self.prompts) < 40:
            self.prompts.append(tuple(prompt))

    @invariant()
    def dump_matches_model(self) -> None:
        for pod, model in self.model.items():
            for tier in (Tier.GPU, Tier.CPU, Tier.STORAGE):
                assert self.table.dump_tiers(pod)[tier] == set(model.tiers[tier]), (pod, tier)

    @invariant()
    def sizes_match_model(self) -> None:
        stats = self.table.stats()
        helds = [model.held() for model in self.model.values()]
        assert stats.pairs == sum(len(held) for held in helds)
        assert stats.expected == sum(len(entries) for entries in self.expected.values())
        assert stats.blocks == len(set().union(*helds, *self.expected.values()))
        assert stats.engine_entries == sum(
            len(entries) for m in self.model.values() for entries in m.tiers.values()
        )

    @invariant()
    def match_agrees_with_model(self) -> None:
        helds = {pod: model.held() for pod, model in self.model.items()}
        for pod, entries in self.expected.items():
            for prefix in entries:
                helds[pod].setdefault(prefix, Tier.EXPECTED)
        for prompt in self.prompts:
            result = self.table.match(CTX, self.table.prefix_hashes(prompt), PODS)
            names = (*reversed(PODS), "not-a-candidate")
            held = result.held_tokens(names, 0.5)  # from the walk's ends, before any table
            lengths = result.lengths()
            assert held == [lengths.get(name, 0) * 0.5 for name in names], prompt
            assert result.longest() == max(lengths.values(), default=0), prompt
            for pod in PODS:
                expected_tiers = []
                for end in range(BLOCK, len(prompt) + 1, BLOCK):
                    tier = helds[pod].get(prompt[:end])
                    if tier is None:
                        break
                    expected_tiers.append(tier)
                assert result.matched(pod) == len(expected_tiers), (pod, prompt)
                assert result.tiers(pod) == expected_tiers, (pod, prompt)
                counts = result.tier_counts(pod)  # its fast path when all on GPU
                assert counts == {t: expected_tiers.count(t) for t in Tier}, (pod, prompt)
                assert result.tiered(pod) or set(expected_tiers) <= {Tier.GPU}, (pod, prompt)
                # what costs a load to reuse (a block on CPU or STORAGE, not on GPU) is never
                # missed: a pod not `offloaded_for` is priced from its length alone
                if {Tier.CPU, Tier.STORAGE} & set(expected_tiers):
                    assert result.offloaded_for(pod), (pod, prompt)


IndexMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestIndexAgainstReference = IndexMachine.TestCase
