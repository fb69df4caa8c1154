"""Applying what an engine reports about one pod to its entries: BlockStored and
BlockRemoved events, or a snapshot of the entries (`PodIndexState`).

Engine hashes are opaque and per pod; the gateway hashes come from the events' token
ids, chained from the gateway hash of the parent engine block, re-chunked to the gateway
block size (engine blocks may be a multiple of it, or a fraction: see `Partial`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Iterator

from indexer.block import PrefixStore
from indexer.config import IndexLimits
from indexer.eviction import Evictor
from indexer.hashing import PrefixHasher
from indexer.holdings import Holdings
from indexer.native import Native
from indexer.pod import IndexedPod, OtherContext, Partial, Target, release_extra
from indexer.snapshot import PodIndexState
from indexer.types import EngineHash, StoredBlocksEvent, Tier

_GPU = Tier.GPU


def _stands_for(
    state: IndexedPod,
    target: Target,
    store: PrefixStore,
    gateway_hashes: list[int],
    first: int,
    count: int,
) -> bool:
    """Whether an indexed engine entry stands for gateway_hashes[first:first+count] of
    `store`."""
    if type(target) is int:
        return (
            count == 1
            and store is state.base
            and target == gateway_hashes[first]
            and target in store.held
        )
    old_store, hashes = state.resolve(target)
    return (
        old_store is store
        and len(hashes) == count
        and list(hashes) == gateway_hashes[first : first + count]
        and all(h in store.held for h in hashes)
    )


class Ingest:
    """Writes pods' real entries, within the per-pod cap, and counts what it turns down."""

    __slots__ = (
        "_evictor",
        "_hasher",
        "_holdings",
        "_limits",
        "_release_run",
        "_store_run",
        "broken_events",
        "rejected",
        "remapped",
        "unknown_removals",
    )

    def __init__(
        self,
        hasher: PrefixHasher,
        limits: IndexLimits,
        holdings: Holdings,
        evictor: Evictor,
        native: Native | None = None,
    ) -> None:
        self._hasher = hasher
        # The compiled loops over the common cases (None on the pure-Python path).
        self._store_run = native.store_run if native is not None else None
        self._release_run = native.release_run if native is not None else None
        self._limits = limits
        self._holdings = holdings
        self._evictor = evictor
        self.rejected: Counter[str] = Counter()
        """Blocks not indexed, by reason, over all pods."""
        self.broken_events = 0
        self.remapped = 0
        """Engine hashes re-stored with other content (the old mapping was replaced)."""
        self.unknown_removals = 0

    def stored(self, state: IndexedPod, event: StoredBlocksEvent, now: float) -> int:
        """Index a BlockStored event of `state`; returns the engine blocks applied."""
        engine_hashes = event.block_hashes
        count = len(engine_hashes)
        if count == 0:
            return 0
        hasher = self._hasher
        gateway_block = hasher.block_size
        engine_block = event.block_size or gateway_block
        tokens = event.token_ids
        if len(tokens) != count * engine_block:
            return self.reject(state, "token_count_mismatch", count)
        if engine_block % gateway_block and gateway_block % engine_block:
            return self.reject(state, "block_size_mismatch", count)
        parent = event.parent_block_hash
        chain = (hasher.seed, ()) if parent is None else state.lookup_chain(parent)
        if chain is None or (engine_block >= gateway_block and chain[1]):
            self.broken_events += 1
            return self.reject(state, "broken_chain", count)
        if engine_block < gateway_block:
            return self._small_blocks(state, event, engine_block, chain, now)
        per_engine = engine_block // gateway_block
        parent_gw = chain[0]
        try:
            gateway_hashes = hasher.chain(parent_gw, tokens)
        except ValueError:
            return self.reject(state, "bad_token_ids", count)

        tier = Tier.from_medium(event.medium)
        store = self._evictor.store_for(state.context(event.lora_id, event.lora_name), now)
        state.use_store(store)
        entries = state.entries[tier]
        copies = state.copies[tier]
        held = store.held
        get_mask = held.get
        access = store.access
        tiers = store.tiers
        holdings = self._holdings
        link = holdings.link
        on_gpu = tier is _GPU
        in_base = store is state.base
        bit = state.bit
        room = self._limits.max_blocks_per_pod - state.size
        partials = state.partials[tier]
        applied = 0
        new_pairs = 0  # of the inlined common case; added to holdings.pairs after the loop
        pending: Iterable[tuple[int, EngineHash]] = enumerate(engine_hashes)
        compiled = [0]  # entries added by the compiled runs (each a new pair)
        run = self._store_run
        if (
            run is not None
            and per_engine == 1
            and in_base
            and on_gpu
            and not partials
            and room >= count  # then no block of the event can hit the pod's cap
            and bit >> 64 == 0
        ):
            steps = _compiled(
                lambda start: run(entries, held, engine_hashes, gateway_hashes, start, bit,
                                  tiers, now),
                count,
                compiled,
            )  # fmt: skip
            pending = ((i, engine_hashes[i]) for i in steps)
        for i, engine_hash in pending:
            if partials and partials.pop(engine_hash, None) is not None:  # partial → full
                self.remapped += 1
                copies.pop(engine_hash, None)
                room += 1
            old = entries.get(engine_hash)
            if old is not None:
                first = i * per_engine
                if _stands_for(state, old, store, gateway_hashes, first, per_engine):
                    copies[engine_hash] = copies.get(engine_hash, 0) + 1  # another copy
                    for gw_hash in gateway_hashes[first : first + per_engine]:
                        access[gw_hash] = now
                    applied += 1
                    continue
                # The engine stored this hash again for other content (a hash collision, or
                # an engine that hashes pages without their parents): the old entry goes
                # first, so a block it shares with the new content is not dropped under it.
                self.remapped += 1
                holdings.drop_entry(state, tier, engine_hash, old)
                room += 1
            if room <= 0:
                self.reject(state, "pod_limit", count - i)
                break
            room -= 1
            if per_engine == 1:
                gw_hash = gateway_hashes[i]
                mask = get_mask(gw_hash)
                access[gw_hash] = now
                if in_base:
                    entries[engine_hash] = gw_hash
                    if on_gpu and gw_hash not in tiers:
                        if mask is None:
                            # The common case, inlined: a block new to this pod, on GPU only.
                            held[gw_hash] = bit
                            new_pairs += 1
                            applied += 1
                            continue
                        if not mask & bit:
                            held[gw_hash] = mask | bit
                            new_pairs += 1
                            applied += 1
                            continue
                else:
                    entries[engine_hash] = OtherContext(store, (gw_hash,))
                if mask is None:
                    held[gw_hash] = 0
                link(state, store, (gw_hash,), tier)
            else:
                hashes = tuple(gateway_hashes[i * per_engine : (i + 1) * per_engine])
                for gw_hash in hashes:
                    store.touch(gw_hash, now)
                entries[engine_hash] = state.target(store, hashes)
                link(state, store, hashes, tier)
            applied += 1
        holdings.pairs += new_pairs + compiled[0]
        applied += compiled[0]
        room -= compiled[0]
        state.size = self._limits.max_blocks_per_pod - room  # drop_entry's updates included
        store.last_access = now
        if len(held) > self._limits.max_prefixes_per_context:
            self._evictor.trim(store)
        return applied

    def _small_blocks(
        self,
        state: IndexedPod,
        event: StoredBlocksEvent,
        engine_block: int,
        chain: tuple[int, tuple[int, ...]],
        now: float,
    ) -> int:
        """Engine blocks smaller than gateway blocks: every `gateway / engine` of them make one
        gateway block; the ones in between are kept as partials so their children chain on."""
        tokens = event.token_ids
        count = len(event.block_hashes)
        hasher = self._hasher
        try:
            hasher.chain(0, tokens, block_size=len(tokens))  # validates every token id
        except ValueError:
            return self.reject(state, "bad_token_ids", count)
        tier = Tier.from_medium(event.medium)
        store = self._evictor.store_for(state.context(event.lora_id, event.lora_name), now)
        state.use_store(store)
        entries, partials, copies = state.entries[tier], state.partials[tier], state.copies[tier]
        holdings = self._holdings
        gateway_block = hasher.block_size
        parent_gw, pending = chain
        applied = 0
        limit = self._limits.max_blocks_per_pod
        for i, engine_hash in enumerate(event.block_hashes):
            if state.size >= limit and engine_hash not in entries and engine_hash not in partials:
                self.reject(state, "pod_limit", count - i)
                break
            pending = pending + tuple(tokens[i * engine_block : (i + 1) * engine_block])
            record: int | Partial
            if len(pending) == gateway_block:
                record = hasher.chain(parent_gw, pending)[0]
                parent_gw, pending = record, ()
                old_target = entries.get(engine_hash)
                same = old_target is not None and _stands_for(
                    state, old_target, store, [record], 0, 1
                )
                if same:
                    store.access[record] = now
            else:
                record = Partial(parent_gw, pending)
                same = partials.get(engine_hash) == record
            if same:
                copies[engine_hash] = copies.get(engine_hash, 0) + 1
                applied += 1
                continue
            old = entries.get(engine_hash)
            if old is not None:
                self.remapped += 1
                holdings.drop_entry(state, tier, engine_hash, old)
            elif partials.pop(engine_hash, None) is not None:
                self.remapped += 1
                copies.pop(engine_hash, None)
                state.size -= 1
            state.size += 1
            if isinstance(record, int):
                store.touch(record, now)
                entries[engine_hash] = state.target(store, (record,))
                holdings.link(state, store, (record,), tier)
            else:
                partials[engine_hash] = record
            applied += 1
        store.last_access = now
        if len(store.held) > self._limits.max_prefixes_per_context:
            self._evictor.trim(store)
        return applied

    def removed(
        self, state: IndexedPod, block_hashes: Iterable[EngineHash], medium: str | None
    ) -> int:
        """Apply a BlockRemoved of `state`; returns how many hashes it was known to hold."""
        tier = Tier.from_medium(medium)
        entries = state.entries[tier]
        copies = state.copies[tier]
        holdings = self._holdings
        unlink = holdings.unlink
        unlink_target = holdings.unlink_target
        base = state.base
        # The common case, inlined below: a base-context block on GPU only, no extra refs.
        fast = base is not None and not state.extra_refs[tier]
        no_blocks: dict[int, int] = {}
        held = base.held if base is not None else no_blocks
        held_get = held.get
        base_tiers = base.tiers if base is not None else {}
        clear = ~state.bit
        pairs_dropped = 0
        known = 0
        partials = state.partials[tier]
        pending: Iterable[EngineHash] = block_hashes
        compiled = [0, 0]  # entries removed, pairs dropped by the compiled runs
        release = self._release_run
        if (
            release is not None
            and fast
            and not copies
            and state.bit >> 64 == 0
            and isinstance(block_hashes, list | tuple)
        ):
            hashes, bit = block_hashes, state.bit
            steps = _compiled(
                lambda start: release(entries, held, hashes, start, bit, base_tiers),
                len(hashes),
                compiled,
            )
            pending = (hashes[i] for i in steps)
        for engine_hash in pending:
            target = entries.get(engine_hash)
            if target is None and engine_hash not in partials:
                self.unknown_removals += 1
                continue
            known += 1
            if copies and release_extra(copies, engine_hash):
                continue
            state.size -= 1
            if target is None:
                del partials[engine_hash]
                continue
            del entries[engine_hash]
            if type(target) is int and base is not None:
                if fast and target not in base_tiers:
                    mask = held_get(target)
                    if mask is not None:
                        pairs_dropped += 1
                        mask &= clear
                        if mask:
                            held[target] = mask
                        else:
                            base.forget(target)
                    continue
                unlink(state, base, target, tier)
            else:
                unlink_target(state, target, tier)
        state.size -= compiled[0]
        holdings.pairs -= pairs_dropped + compiled[1]
        return known + compiled[0]

    def restore(self, state: IndexedPod, index: PodIndexState, now: float) -> int:
        """Add the entries of `index` to an empty `state`; returns the entries restored."""
        limit = self._limits.max_blocks_per_pod
        holdings = self._holdings
        restored = 0
        for group in index.groups:
            store = self._evictor.store_for(state.context(None, group.lora), now)
            state.use_store(store)
            entries, copies = state.entries[group.tier], state.copies[group.tier]
            for engine_hash, gw_hashes, extra in group.records:
                if not gw_hashes or engine_hash in entries:
                    continue
                if state.size >= limit:
                    self.reject(state, "pod_limit", 1)
                    continue
                for gw_hash in gw_hashes:
                    store.touch(gw_hash, now)
                entries[engine_hash] = state.target(store, gw_hashes)
                if extra:
                    copies[engine_hash] = extra
                holdings.link(state, store, gw_hashes, group.tier)
                state.size += 1
                restored += 1
            if len(store.held) > self._limits.max_prefixes_per_context:
                self._evictor.trim(store)
        for record in index.partials:
            partials = state.partials[record.tier]
            engine_hash = record.engine_hash
            if engine_hash in partials or engine_hash in state.entries[record.tier]:
                continue
            if state.size >= limit:
                self.reject(state, "pod_limit", 1)
                continue
            partials[engine_hash] = Partial(record.parent_gw, record.pending)
            if record.copies:
                state.copies[record.tier][engine_hash] = record.copies
            state.size += 1
            restored += 1
        return restored

    def reject(self, state: IndexedPod, reason: str, blocks: int) -> int:
        """Count `blocks` of `state` not indexed for `reason`; returns 0 (none applied)."""
        self.rejected[reason] += blocks
        state.rejected[reason] = state.rejected.get(reason, 0) + blocks
        return 0


def _compiled(
    step: Callable[[int], tuple[int, ...]], total: int, counts: list[int]
) -> Iterator[int]:
    """A compiled loop's runs over an event's `total` blocks: `step(start)` applies the
    common case from `start` on and returns where it stopped and what it counted (added to
    `counts`). Yields, in order, each index a run stops at, for the Python loop to apply
    before the next run starts after it."""
    start = 0
    while start < total:
        stop, *counted = step(start)
        for i, value in enumerate(counted):
            counts[i] += value
        if stop < total:
            yield stop
        start = stop + 1
