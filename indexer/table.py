"""The sync prefix-hash table: which pod holds which prompt prefix, fleet-wide.

ModelContext -> PrefixStore (gateway hash -> Block: holder bit masks per tier, last
access); per pod, engine hash -> gateway block(s) for each tier. Engine hashes are
opaque and per pod; the gateway computes its own chained hashes from the events' token
ids, so one prompt hashes the same whatever pod (or engine kind) holds it.

Pure and synchronous: no I/O, no locks — the owner calls it from one thread (the
gateway's event loop). Time comes from the injected clock.
"""

from __future__ import annotations

import heapq
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from itertools import islice
from operator import attrgetter

from indexer.block import Block, PrefixStore
from indexer.config import IndexConfig
from indexer.hashing import PrefixHasher
from indexer.match import IndexStats, MatchResult
from indexer.pod import Partial, PodState, Target, blocks_of
from indexer.snapshot import EntryGroup, EntryRecord, PartialRecord, PodIndexState
from indexer.types import (
    EngineHash,
    ModelContext,
    StoredBlocksEvent,
    Tier,
    UnknownPodError,
)

_GPU, _EXPECTED = Tier.GPU, Tier.EXPECTED
_REAL = (Tier.GPU, Tier.CPU, Tier.STORAGE)
_EVICT_TO = 0.9  # a store over its cap is trimmed to 90% of it, so trims are rare
_last_access = attrgetter("last_access")


def _stands_for(target: Target, gateway_hashes: list[int], first: int, count: int) -> bool:
    """Whether an indexed engine entry stands for gateway_hashes[first:first+count]."""
    if isinstance(target, Block):
        return count == 1 and target.store is not None and target.gw_hash == gateway_hashes[first]
    return len(target) == count and all(
        block.store is not None and block.gw_hash == gateway_hashes[first + j]
        for j, block in enumerate(target)
    )


class SyncPrefixHashTable:
    """Fleet-wide prefix index fed by KV events (see module docstring)."""

    def __init__(
        self,
        config: IndexConfig | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config or IndexConfig()
        self.hasher = PrefixHasher(self.config.block_size, self.config.hash_seed)
        self._limits = self.config.limits
        self._clock = clock
        self._stores: dict[ModelContext, PrefixStore] = {}
        self._pods: dict[str, PodState] = {}
        self._by_bit: dict[int, PodState] = {}
        self._free_bits: list[int] = []
        self._next_bit_index = 0
        # Router-side entries by expiry: (expiry, tiebreak, pod, block). Entries whose pod
        # or expiry changed since are skipped when popped.
        self._expiries: list[tuple[float, int, PodState, Block]] = []
        self._expiry_seq = 0
        self._expected_count = 0
        self._next_eviction = clock() + self._limits.eviction_interval_s
        self._pairs = 0
        self._broken_events = 0
        self._rejected: Counter[str] = Counter()
        self._unknown_removals = 0
        self._remapped = 0
        self._evicted_blocks = 0
        self._evicted_contexts = 0
        self._expired = 0
        self._eviction_runs = 0
        self._epochs = 0  # source of PodState.epoch: bumped on every registration and clear

    # -- pods ---------------------------------------------------------------------------

    def register_pod(
        self,
        pod: str,
        model: str,
        *,
        publishes_events: bool = True,
        lora_names: Mapping[int, str] | None = None,
    ) -> None:
        """Start indexing `pod`. Re-registering with another model drops what it had."""
        state = self._pods.get(pod)
        if state is not None and state.model != model:
            self.remove_pod(pod)
            state = None
        if state is not None:
            state.publishes_events = publishes_events
            state.lora_names = dict(lora_names or {})
            return
        if self._free_bits:
            index = heapq.heappop(self._free_bits)
        else:
            index = self._next_bit_index
            self._next_bit_index += 1
        state = PodState(
            pod,
            1 << index,
            model,
            publishes_events=publishes_events,
            lora_names=lora_names or {},
        )
        self._pods[pod] = state
        self._by_bit[state.bit] = state
        self._epochs += 1
        state.epoch = self._epochs

    def remove_pod(self, pod: str) -> None:
        """Forget `pod` entirely, in time proportional to what it held."""
        state = self._pods.pop(pod, None)
        if state is None:
            return
        self._clear_state(state)
        del self._by_bit[state.bit]
        heapq.heappush(self._free_bits, state.bit.bit_length() - 1)

    def pods(self) -> list[str]:
        return list(self._pods)

    def has_pod(self, pod: str) -> bool:
        return pod in self._pods

    # -- events -------------------------------------------------------------------------

    def apply_stored(self, pod: str, event: StoredBlocksEvent) -> int:
        """Index a BlockStored event of `pod`; returns how many engine blocks were applied.

        A block whose parent this pod is not known to hold is a broken chain: its gateway
        hash cannot be computed, so the event is counted and not inserted (never re-rooted).
        """
        state = self._state(pod)
        now = self._clock()
        self._tick(now)
        engine_hashes = event.block_hashes
        count = len(engine_hashes)
        if count == 0:
            return 0
        engine_block = event.block_size or self.config.block_size
        tokens = event.token_ids
        if len(tokens) != count * engine_block:
            return self._reject(state, "token_count_mismatch", count)
        gateway_block = self.config.block_size
        if engine_block % gateway_block and gateway_block % engine_block:
            return self._reject(state, "block_size_mismatch", count)
        parent = event.parent_block_hash
        chain = (self.hasher.seed, ()) if parent is None else state.lookup_chain(parent)
        if chain is None or (engine_block >= gateway_block and chain[1]):
            self._broken_events += 1
            return self._reject(state, "broken_chain", count)
        if engine_block < gateway_block:
            return self._apply_small_blocks(state, event, engine_block, chain, now)
        per_engine = engine_block // gateway_block
        parent_gw = chain[0]
        try:
            gateway_hashes = self.hasher.chain(parent_gw, tokens)
        except ValueError:
            return self._reject(state, "bad_token_ids", count)

        tier = Tier.from_medium(event.medium)
        store = self._store_for(state.context(event.lora_id, event.lora_name), now)
        entries = state.entries[tier]
        copies = state.copies[tier]
        blocks = store.blocks
        get_block = blocks.get
        on_gpu = tier is _GPU
        bit = state.bit
        room = self._limits.max_blocks_per_pod - state.size
        partials = state.partials[tier]
        applied = 0
        for i, engine_hash in enumerate(engine_hashes):
            if partials and partials.pop(engine_hash, None) is not None:  # partial → full
                self._remapped += 1
                copies.pop(engine_hash, None)
                room += 1
            old = entries.get(engine_hash)
            if old is not None:
                first = i * per_engine
                if _stands_for(old, gateway_hashes, first, per_engine):
                    copies[engine_hash] = copies.get(engine_hash, 0) + 1  # another copy
                    for block in blocks_of(old):
                        block.last_access = now
                    applied += 1
                    continue
                # The engine stored this hash again for other content (a hash collision, or
                # an engine that hashes pages without their parents): the old entry goes
                # first, so a block it shares with the new content is not dropped under it.
                self._remapped += 1
                self._drop_entry(state, tier, engine_hash, old)
                room += 1
            if room <= 0:
                self._reject(state, "pod_limit", count - i)
                break
            room -= 1
            target: Target
            if per_engine == 1:
                gw_hash = gateway_hashes[i]
                existing = get_block(gw_hash)
                if existing is None:
                    block = blocks[gw_hash] = Block(gw_hash, store, now)
                else:
                    block = existing
                    block.last_access = now
                entries[engine_hash] = block
                if on_gpu and block.masks is None and not block.held & bit:
                    # The common case, inlined: a block new to this pod, on GPU only.
                    block.held |= bit
                    self._pairs += 1
                    applied += 1
                    continue
                target = block
            else:
                target = tuple(
                    store.get_or_create(h, now)
                    for h in gateway_hashes[i * per_engine : (i + 1) * per_engine]
                )
                for block in target:
                    block.last_access = now
                entries[engine_hash] = target
            self._link(state, target, tier)
            applied += 1
        state.size = self._limits.max_blocks_per_pod - room  # _drop_entry's updates included
        store.last_access = now
        if len(store.blocks) > self._limits.max_prefixes_per_context:
            self._trim(store)
        return applied

    def _apply_small_blocks(
        self,
        state: PodState,
        event: StoredBlocksEvent,
        engine_block: int,
        chain: tuple[int, tuple[int, ...]],
        now: float,
    ) -> int:
        """Engine blocks smaller than gateway blocks: every `gateway / engine` of them make one
        gateway block; the ones in between are kept as partials so their children chain on."""
        tokens = event.token_ids
        count = len(event.block_hashes)
        try:
            self.hasher.chain(0, tokens, block_size=len(tokens))  # validates every token id
        except ValueError:
            return self._reject(state, "bad_token_ids", count)
        tier = Tier.from_medium(event.medium)
        store = self._store_for(state.context(event.lora_id, event.lora_name), now)
        entries, partials, copies = state.entries[tier], state.partials[tier], state.copies[tier]
        gateway_block = self.config.block_size
        parent_gw, pending = chain
        applied = 0
        limit = self._limits.max_blocks_per_pod
        for i, engine_hash in enumerate(event.block_hashes):
            if state.size >= limit and engine_hash not in entries and engine_hash not in partials:
                self._reject(state, "pod_limit", count - i)
                break
            pending = pending + tuple(tokens[i * engine_block : (i + 1) * engine_block])
            record: Block | Partial
            if len(pending) == gateway_block:
                record = store.get_or_create(self.hasher.chain(parent_gw, pending)[0], now)
                record.last_access = now
                parent_gw, pending = record.gw_hash, ()
                same = entries.get(engine_hash) is record
            else:
                record = Partial(parent_gw, pending)
                same = partials.get(engine_hash) == record
            if same:
                copies[engine_hash] = copies.get(engine_hash, 0) + 1
                applied += 1
                continue
            old = entries.get(engine_hash)
            if old is not None:
                self._remapped += 1
                self._drop_entry(state, tier, engine_hash, old)
            elif partials.pop(engine_hash, None) is not None:
                self._remapped += 1
                copies.pop(engine_hash, None)
                state.size -= 1
            state.size += 1
            if isinstance(record, Block):
                entries[engine_hash] = record
                self._link(state, record, tier)
            else:
                partials[engine_hash] = record
            applied += 1
        store.last_access = now
        if len(store.blocks) > self._limits.max_prefixes_per_context:
            self._trim(store)
        return applied

    def apply_removed(
        self, pod: str, block_hashes: Iterable[EngineHash], medium: str | None = None
    ) -> int:
        """Apply a BlockRemoved of `pod`; returns how many hashes it was known to hold.

        Only this pod is touched, and a hash it holds several copies of stays until the
        last copy goes.
        """
        state = self._state(pod)
        self._tick(self._clock())
        tier = Tier.from_medium(medium)
        entries = state.entries[tier]
        copies = state.copies[tier]
        known = 0
        partials = state.partials[tier]
        for engine_hash in block_hashes:
            target = entries.get(engine_hash)
            if target is None and engine_hash not in partials:
                self._unknown_removals += 1
                continue
            known += 1
            extra = copies.get(engine_hash)
            if extra:
                if extra == 1:
                    del copies[engine_hash]
                else:
                    copies[engine_hash] = extra - 1
                continue
            state.size -= 1
            if target is None:
                del partials[engine_hash]
                continue
            del entries[engine_hash]
            for block in blocks_of(target):
                self._unlink(state, block, tier)
        return known

    def apply_cleared(self, pod: str) -> None:
        """Apply AllBlocksCleared: the pod holds nothing any more (router-side entries too)."""
        state = self._state(pod)
        self._tick(self._clock())
        self._clear_state(state)

    # -- router-side entries --------------------------------------------------------------

    def add_prefix(
        self,
        pod: str,
        context: ModelContext,
        prefix_hashes: Sequence[int],
        ttl: float | None = None,
    ) -> int:
        """Record that `pod` is expected to hold these gateway blocks (a routing decision).

        Blocks the pod already holds for real are skipped. Entries expire after `ttl` —
        by default `expected_ttl_s` for pods that publish events (a BlockStored should
        confirm them well before) and `eviction_duration_s` for pods that do not (their
        approximate index) — and the oldest go when a pod has too many. Returns the number
        of expected entries added or refreshed.
        """
        state = self._state(pod)
        now = self._clock()
        self._tick(now)
        if ttl is None:
            limits = self._limits
            ttl = limits.expected_ttl_s if state.publishes_events else limits.eviction_duration_s
        expiry = now + ttl
        store = self._store_for(context, now)
        bit = state.bit
        expected = state.expected
        refreshed = 0
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
                self._expected_count += 1
            expected[block] = expiry
            self._expiry_seq += 1
            heapq.heappush(self._expiries, (expiry, self._expiry_seq, state, block))
            refreshed += 1
        overflow = len(expected) - self._limits.max_expected_per_pod
        if overflow > 0:
            for block in list(islice(expected, overflow)):
                del expected[block]
                self._drop_expected_bit(block, bit)
        store.last_access = now
        if len(store.blocks) > self._limits.max_prefixes_per_context:
            self._trim(store)
        if len(self._expiries) > 4 * self._expected_count + 1024:
            self._compact_expiries()
        return refreshed

    # -- queries --------------------------------------------------------------------------

    def prefix_hashes(self, token_ids: Sequence[int]) -> list[int]:
        return self.hasher.prefix_hashes(token_ids)

    def match(
        self,
        context: ModelContext,
        prefix_hashes: Sequence[int],
        candidate_pods: Iterable[str],
    ) -> MatchResult:
        """For each candidate, how many blocks from the prompt's start it holds.

        Walks the prompt's blocks once, keeping the mask of candidates still matching, and
        stops as soon as none is.
        """
        now = self._clock()
        self._tick(now)
        pods = self._pods
        bits = {name: pods[name].bit if name in pods else 0 for name in candidate_pods}
        alive = 0
        for bit in bits.values():
            alive |= bit
        store = self._stores.get(context)
        if store is None or alive == 0 or not prefix_hashes:
            return MatchResult(len(prefix_hashes), dict.fromkeys(bits, 0), bits)
        store.last_access = now
        get = store.blocks.get
        ends: list[tuple[int, int]] = []  # (matched length, mask of pods that stop there)
        tiered: list[tuple[int, tuple[int, ...]]] = []
        index = 0
        for gw_hash in prefix_hashes:
            block = get(gw_hash)
            if block is None:
                break
            held = block.held & alive
            if held != alive:
                if not held:
                    break
                ends.append((index, alive ^ held))
                alive = held
            block.last_access = now
            if block.masks is not None:
                tiered.append((index, tuple(block.masks)))
            index += 1
        ends.append((index, alive))
        matched = dict.fromkeys(bits, 0)
        for name, bit in bits.items():
            for length, mask in ends:
                if mask & bit:
                    matched[name] = length
                    break
        return MatchResult(len(prefix_hashes), matched, bits, tuple(tiered))

    def dump(self, pod: str) -> set[EngineHash]:
        """Engine hashes the index believes `pod` holds, in any tier."""
        state = self._state(pod)
        held: set[EngineHash] = set()
        for tier in _REAL:
            held |= state.engine_hashes(tier)
        return held

    def dump_tiers(self, pod: str) -> dict[Tier, set[EngineHash]]:
        """Engine hashes the index believes `pod` holds, per real tier."""
        state = self._state(pod)
        return {tier: state.engine_hashes(tier) for tier in _REAL}

    def pod_epoch(self, pod: str) -> int:
        """Changes whenever the pod is (re-)registered or all its blocks are dropped
        (AllBlocksCleared, an engine restart, a lost event stream): whatever the engine
        held before, such as pins, may be gone."""
        return self._state(pod).epoch

    def engine_blocks(
        self, pod: str, context: ModelContext, token_ids: Sequence[int]
    ) -> list[tuple[EngineHash, Tier]]:
        """The engine hashes of `pod` that hold the longest prefix of `token_ids` it holds
        in a real tier, each once with its best tier, in prompt order (what a pin call
        needs).

        Engine blocks of k gateway blocks count when all k are in the prefix; engine blocks
        smaller than a gateway block (partials) count when their tokens are the prompt's,
        including those past the last full gateway block the pod holds. Costs one pass over
        the pod's engine entries: meant for pin calls, not for every request.
        """
        state = self._state(pod)
        store = self._stores.get(context)
        if store is None:
            return []
        size = self.config.block_size
        position: dict[Block, int] = {}
        for index, gw_hash in enumerate(self.hasher.prefix_hashes(token_ids)):
            block = store.blocks.get(gw_hash)
            if block is None or not block.real_mask() & state.bit:
                break
            position[block] = index
        # The partials of every held block, and of the first block past them (its tokens
        # may be held in part): Partial(parent gateway hash, tokens since it) -> order key.
        wanted: dict[Partial, tuple[int, int]] = {}
        hashes = [block.gw_hash for block in position]
        for index in range(len(hashes) + 1):
            parent = hashes[index - 1] if index else self.hasher.seed
            tokens = tuple(token_ids[index * size : (index + 1) * size])
            for length in range(1, min(len(tokens) + 1, size)):
                wanted[Partial(parent, tokens[:length])] = (index, length)
        found: dict[EngineHash, tuple[tuple[int, int], Tier]] = {}
        for tier in _REAL:
            keyed: list[tuple[EngineHash, tuple[int, int]]] = []
            for engine_hash, target in state.entries[tier].items():
                if isinstance(target, Block):
                    at = position.get(target)
                    if at is not None and target.store is not None:
                        keyed.append((engine_hash, (at, size)))
                elif all(block in position and block.store is not None for block in target):
                    keyed.append((engine_hash, (position[target[-1]], size)))
            for engine_hash, partial in state.partials[tier].items():
                key = wanted.get(partial)
                if key is not None:
                    keyed.append((engine_hash, key))
            for engine_hash, key in keyed:
                if engine_hash not in found:  # tiers are visited best first
                    found[engine_hash] = (key, tier)
        ordered = sorted(found.items(), key=lambda item: item[1][0])
        return [(engine_hash, tier) for engine_hash, (_, tier) in ordered]

    def held_tiers(self, pod: str, engine_hashes: Iterable[EngineHash]) -> dict[EngineHash, Tier]:
        """Of these engine hashes, the ones the index believes `pod` holds in a real tier,
        each with its best tier."""
        state = self._state(pod)
        held: dict[EngineHash, Tier] = {}
        for engine_hash in engine_hashes:
            for tier in _REAL:
                target = state.entries[tier].get(engine_hash)
                alive = target is not None and all(b.store is not None for b in blocks_of(target))
                if alive or engine_hash in state.partials[tier]:
                    held[engine_hash] = tier
                    break
        return held

    def rejected_blocks(self, pod: str) -> dict[str, int]:
        """Blocks of this pod's BlockStored events not indexed, by reason (broken_chain...),
        since it was registered."""
        return dict(self._state(pod).rejected)

    def stats(self) -> IndexStats:
        self._expire(self._clock())
        return IndexStats(
            pods=len(self._pods),
            contexts=len(self._stores),
            blocks=sum(len(store.blocks) for store in self._stores.values()),
            pairs=self._pairs,
            engine_entries=sum(state.size for state in self._pods.values()),
            expected=self._expected_count,
            broken_chain_events=self._broken_events,
            broken_chain_blocks=self._rejected["broken_chain"],
            rejected_blocks=dict(self._rejected),
            unknown_removals=self._unknown_removals,
            remapped=self._remapped,
            evicted_blocks=self._evicted_blocks,
            evicted_contexts=self._evicted_contexts,
            expired_expected=self._expired,
            eviction_runs=self._eviction_runs,
        )

    # -- snapshots ------------------------------------------------------------------------

    def export_pod(self, pod: str) -> PodIndexState:
        """What `pod` holds for real (router-side entries excluded), for `restore_pod` —
        in a snapshot file, a later process or another replica."""
        state = self._state(pod)
        groups: dict[tuple[Tier, str | None], list[EntryRecord]] = {}
        partials: list[PartialRecord] = []
        for tier in _REAL:
            copies = state.copies[tier]
            by_store: dict[PrefixStore, list[EntryRecord]] = {}  # keyed by identity: fast
            for engine_hash, target in state.entries[tier].items():
                if isinstance(target, Block):  # the common case, kept short: this runs on
                    store = target.store  # the event loop for every entry of the pod
                    gw_hashes: tuple[int, ...] = (target.gw_hash,)
                else:
                    store = target[0].store
                    if any(block.store is None for block in target):
                        continue
                    gw_hashes = tuple(block.gw_hash for block in target)
                if store is None:
                    continue  # evicted: not indexed any more
                records = by_store.get(store)
                if records is None:
                    records = by_store[store] = groups.setdefault((tier, store.context.lora), [])
                extra = copies.get(engine_hash, 0) if copies else 0
                records.append((engine_hash, gw_hashes, extra))
            for engine_hash, partial in state.partials[tier].items():
                extra = copies.get(engine_hash, 0)
                partials.append(
                    PartialRecord(tier, engine_hash, partial.parent_gw, partial.pending, extra)
                )
        return PodIndexState(
            tuple(EntryGroup(tier, lora, tuple(r)) for (tier, lora), r in groups.items()),
            tuple(partials),
        )

    def restore_pod(self, pod: str, index: PodIndexState) -> int:
        """Replace what `pod` holds with `index` (from `export_pod`); returns the engine
        entries restored. Restored blocks count as accessed now; caps apply as for events."""
        state = self._state(pod)
        now = self._clock()
        self._tick(now)
        self._clear_state(state)
        limit = self._limits.max_blocks_per_pod
        restored = 0
        for group in index.groups:
            store = self._store_for(state.context(None, group.lora), now)
            entries, copies = state.entries[group.tier], state.copies[group.tier]
            for engine_hash, gw_hashes, extra in group.records:
                if not gw_hashes or engine_hash in entries:
                    continue
                if state.size >= limit:
                    self._reject(state, "pod_limit", 1)
                    continue
                blocks = tuple(store.get_or_create(gw_hash, now) for gw_hash in gw_hashes)
                target: Target = blocks[0] if len(blocks) == 1 else blocks
                entries[engine_hash] = target
                if extra:
                    copies[engine_hash] = extra
                self._link(state, target, group.tier)
                state.size += 1
                restored += 1
            if len(store.blocks) > self._limits.max_prefixes_per_context:
                self._trim(store)
        for record in index.partials:
            partials = state.partials[record.tier]
            engine_hash = record.engine_hash
            if engine_hash in partials or engine_hash in state.entries[record.tier]:
                continue
            if state.size >= limit:
                self._reject(state, "pod_limit", 1)
                continue
            partials[engine_hash] = Partial(record.parent_gw, record.pending)
            if record.copies:
                state.copies[record.tier][engine_hash] = record.copies
            state.size += 1
            restored += 1
        return restored

    # -- eviction -------------------------------------------------------------------------

    def evict(self, now: float | None = None) -> None:
        """The eviction pass: expire router-side entries, enforce every cap.

        Runs by itself every `eviction_interval_s` (checked on each call into the table)
        and whenever a store crosses its cap; the gateway also calls it on a timer so an
        idle index is trimmed too.
        """
        now = self._clock() if now is None else now
        self._expire(now)
        cap = self._limits.max_prefixes_per_context
        for store in list(self._stores.values()):
            if len(store.blocks) > cap:
                self._trim(store)
        while len(self._stores) > self._limits.max_contexts:
            oldest = min(self._stores.values(), key=_last_access)
            self._drop_store(oldest)
        self._next_eviction = now + self._limits.eviction_interval_s
        self._eviction_runs += 1

    # -- internals ------------------------------------------------------------------------

    def _state(self, pod: str) -> PodState:
        state = self._pods.get(pod)
        if state is None:
            raise UnknownPodError(pod)
        return state

    def _tick(self, now: float) -> None:
        if now >= self._next_eviction:
            self.evict(now)
        elif self._expiries and self._expiries[0][0] <= now:
            self._expire(now)

    def _reject(self, state: PodState, reason: str, blocks: int) -> int:
        self._rejected[reason] += blocks
        state.rejected[reason] = state.rejected.get(reason, 0) + blocks
        return 0

    def _store_for(self, context: ModelContext, now: float) -> PrefixStore:
        store = self._stores.get(context)
        if store is None:
            store = self._stores[context] = PrefixStore(context, now)
            while len(self._stores) > self._limits.max_contexts:
                oldest = min((s for s in self._stores.values() if s is not store), key=_last_access)
                self._drop_store(oldest)
        return store

    def _link(self, state: PodState, target: Target, tier: Tier) -> None:
        bit = state.bit
        for block in blocks_of(target):
            if block.masks is None and tier is _GPU:
                if block.held & bit:
                    self._add_extra_ref(state, block, tier)
                else:
                    block.held |= bit
                    self._pairs += 1
                continue
            masks = block.tier_masks()
            if masks[tier] & bit:
                self._add_extra_ref(state, block, tier)
                continue
            if not block.real_mask() & bit:
                self._pairs += 1
            masks[tier] |= bit
            if masks[_EXPECTED] & bit:  # a BlockStored confirmed the router's expectation
                masks[_EXPECTED] &= ~bit
                del state.expected[block]
                self._expected_count -= 1
            block.refresh()

    @staticmethod
    def _add_extra_ref(state: PodState, block: Block, tier: Tier) -> None:
        refs = state.extra_refs[tier]
        refs[block] = refs.get(block, 0) + 1

    def _unlink(self, state: PodState, block: Block, tier: Tier) -> None:
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
            self._pairs -= 1
        else:
            block.masks[tier] &= ~bit
            if not block.real_mask() & bit:
                self._pairs -= 1
            block.refresh()
        if not block.held:
            self._forget(block)

    def _drop_entry(
        self, state: PodState, tier: Tier, engine_hash: EngineHash, old: Target
    ) -> None:
        del state.entries[tier][engine_hash]
        state.copies[tier].pop(engine_hash, None)
        state.size -= 1
        for block in blocks_of(old):
            self._unlink(state, block, tier)

    def _drop_expected_bit(self, block: Block, bit: int) -> None:
        if block.store is None or block.masks is None:
            return
        block.masks[_EXPECTED] &= ~bit
        block.refresh()
        self._expected_count -= 1
        if not block.held:
            self._forget(block)

    def _forget(self, block: Block) -> None:
        """Drop a block nobody holds from its store."""
        store = block.store
        if store is not None:
            del store.blocks[block.gw_hash]
            block.store = None

    def _clear_state(self, state: PodState) -> None:
        bit = state.bit
        for tier in _REAL:
            for target in state.entries[tier].values():
                for block in blocks_of(target):
                    self._drop_bit(block, bit)
        for block in state.expected:
            self._drop_bit(block, bit)
        state.clear()
        self._epochs += 1
        state.epoch = self._epochs

    def _drop_bit(self, block: Block, bit: int) -> None:
        """Remove the pod with `bit` from `block` in every tier (idempotent)."""
        if block.store is None or not block.held & bit:
            return
        if block.masks is None:
            block.held &= ~bit
            self._pairs -= 1
        else:
            masks = block.masks
            if block.real_mask() & bit:
                self._pairs -= 1
            if masks[_EXPECTED] & bit:
                self._expected_count -= 1
            for tier in Tier:
                masks[tier] &= ~bit
            block.refresh()
        if not block.held:
            self._forget(block)

    def _kill(self, block: Block) -> int:
        """Evict a block for every pod (a cap was crossed); returns how many pods' entries
        now point at it (to be swept)."""
        holders = block.real_mask().bit_count()
        self._pairs -= holders
        if block.masks is not None:
            expected = block.masks[_EXPECTED]
            while expected:
                low = expected & -expected
                expected ^= low
                self._by_bit[low].expected.pop(block, None)
                self._expected_count -= 1
        block.held = 0
        block.masks = None
        self._forget(block)
        self._evicted_blocks += 1
        return holders

    def _trim(self, store: PrefixStore) -> None:
        keep = int(self._limits.max_prefixes_per_context * _EVICT_TO)
        excess = len(store.blocks) - keep
        if excess <= 0:
            return
        # Oldest first; among equally old blocks the newest inserted first, which takes a
        # chain from its tail (children are created after their parents): a tail left
        # without its root could never be matched.
        newest_first = reversed(store.blocks.values())
        orphaned = sum(
            self._kill(block) for block in heapq.nsmallest(excess, newest_first, key=_last_access)
        )
        if orphaned:
            self._sweep_dead_refs()

    def _drop_store(self, store: PrefixStore) -> None:
        orphaned = sum(self._kill(block) for block in list(store.blocks.values()))
        del self._stores[store.context]
        self._evicted_contexts += 1
        if orphaned:
            self._sweep_dead_refs()

    def _sweep_dead_refs(self) -> None:
        """Drop pod entries that point at evicted blocks, so memory stays bounded."""
        for state in self._pods.values():
            for tier in _REAL:
                entries = state.entries[tier]
                dead = [h for h, t in entries.items() if any(b.store is None for b in blocks_of(t))]
                for engine_hash in dead:
                    target = entries.pop(engine_hash)
                    state.copies[tier].pop(engine_hash, None)
                    state.size -= 1
                    for block in blocks_of(target):
                        if block.store is not None:  # a multi-block entry partly evicted
                            self._unlink(state, block, tier)
                refs = state.extra_refs[tier]
                for block in [b for b in refs if b.store is None]:
                    del refs[block]

    def _expire(self, now: float) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now:
            expiry, _, state, block = heapq.heappop(expiries)
            if self._pods.get(state.name) is not state or state.expected.get(block) != expiry:
                continue  # refreshed, confirmed, evicted, or the pod went
            del state.expected[block]
            self._drop_expected_bit(block, state.bit)
            self._expired += 1

    def _compact_expiries(self) -> None:
        live = [
            (expiry, seq, state, block)
            for expiry, seq, state, block in self._expiries
            if self._pods.get(state.name) is state and state.expected.get(block) == expiry
        ]
        heapq.heapify(live)
        self._expiries = live
