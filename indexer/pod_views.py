"""Read-only views of what one pod holds, for pinning, consistency checks and snapshots.

Each costs a pass over some of the pod's engine entries: they serve admin, pin and
snapshot calls, never the per-request path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from indexer.block import PrefixStore
from indexer.hashing import PrefixHasher
from indexer.pod import IndexedPod, Partial
from indexer.snapshot import EntryGroup, EntryRecord, PartialRecord, PodIndexState
from indexer.types import REAL_TIERS, EngineHash, Tier


def held_hashes(state: IndexedPod) -> set[EngineHash]:
    """Engine hashes `state` holds in any real tier (see `IndexedPod.engine_hashes`)."""
    held: set[EngineHash] = set()
    for tier in REAL_TIERS:
        held |= state.engine_hashes(tier)
    return held


def held_hashes_by_tier(state: IndexedPod) -> dict[Tier, set[EngineHash]]:
    return {tier: state.engine_hashes(tier) for tier in REAL_TIERS}


def held_tiers(state: IndexedPod, engine_hashes: Iterable[EngineHash]) -> dict[EngineHash, Tier]:
    """Of these engine hashes, the ones `state` holds in a real tier, with its best tier."""
    held: dict[EngineHash, Tier] = {}
    for engine_hash in engine_hashes:
        for tier in REAL_TIERS:
            target = state.entries[tier].get(engine_hash)
            alive = target is not None and state.alive(target)
            if alive or engine_hash in state.partials[tier]:
                held[engine_hash] = tier
                break
    return held


def engine_blocks(
    state: IndexedPod, store: PrefixStore, hasher: PrefixHasher, token_ids: Sequence[int]
) -> list[tuple[EngineHash, Tier]]:
    """The engine hashes of `state` that hold the longest prefix of `token_ids` it holds
    in a real tier of `store`, each once with its best tier, in prompt order (see
    `SyncPrefixHashTable.engine_blocks`)."""
    size = hasher.block_size
    position: dict[int, int] = {}
    for index, gw_hash in enumerate(hasher.prefix_hashes(token_ids)):
        if not store.real_mask(gw_hash) & state.bit:
            break
        position[gw_hash] = index
    # The partials of every held block, and of the first block past them (its tokens
    # may be held in part): Partial(parent gateway hash, tokens since it) -> order key.
    wanted: dict[Partial, tuple[int, int]] = {}
    hashes = list(position)
    for index in range(len(hashes) + 1):
        parent = hashes[index - 1] if index else hasher.seed
        tokens = tuple(token_ids[index * size : (index + 1) * size])
        for length in range(1, min(len(tokens) + 1, size)):
            wanted[Partial(parent, tokens[:length])] = (index, length)
    found: dict[EngineHash, tuple[tuple[int, int], Tier]] = {}
    for tier in REAL_TIERS:
        keyed: list[tuple[EngineHash, tuple[int, int]]] = []
        for engine_hash, target in state.entries[tier].items():
            where, gw_hashes = state.resolve(target)
            if where is store and all(h in position for h in gw_hashes):
                keyed.append((engine_hash, (position[gw_hashes[-1]], size)))
        for engine_hash, partial in state.partials[tier].items():
            key = wanted.get(partial)
            if key is not None:
                keyed.append((engine_hash, key))
        for engine_hash, key in keyed:
            if engine_hash not in found:  # tiers are visited best first
                found[engine_hash] = (key, tier)
    ordered = sorted(found.items(), key=lambda item: item[1][0])
    return [(engine_hash, tier) for engine_hash, (_, tier) in ordered]


def export_entries(state: IndexedPod) -> PodIndexState:
    """What `state` holds for real (router-side entries excluded), for a snapshot."""
    groups: dict[tuple[Tier, str | None], list[EntryRecord]] = {}
    partials: list[PartialRecord] = []
    for tier in REAL_TIERS:
        copies = state.copies[tier]
        base = state.base
        base_records = None
        if base is not None and base.alive:
            base_records = groups.setdefault((tier, base.context.lora), [])
        for engine_hash, target in state.entries[tier].items():
            if type(target) is int:  # the common case, kept short: this runs on the
                if base_records is None:  # event loop for every entry of the pod
                    continue
                records = base_records
                gw_hashes: tuple[int, ...] = (target,)
            else:
                store, gw_hashes = state.resolve(target)
                if not store.alive or not all(h in store.held for h in gw_hashes):
                    continue  # evicted: not indexed any more
                records = groups.setdefault((tier, store.context.lora), [])
            extra = copies.get(engine_hash, 0) if copies else 0
            records.append((engine_hash, gw_hashes, extra))
        for engine_hash, partial in state.partials[tier].items():
            extra = copies.get(engine_hash, 0)
            partials.append(
                PartialRecord(tier, engine_hash, partial.parent_gw, partial.pending, extra)
            )
    return PodIndexState(
        tuple(EntryGroup(tier, lora, tuple(r)) for (tier, lora), r in groups.items() if r),
        tuple(partials),
    )
