"""Read-only views of what one pod holds, for pinning, consistency checks and snapshots.

Each costs a pass over some of the pod's engine entries: they serve admin, pin and
snapshot calls, never the per-request path.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from indexer.block import Block, PrefixStore
from indexer.hashing import PrefixHasher
from indexer.pod import Partial, PodState, blocks_of
from indexer.snapshot import EntryGroup, EntryRecord, PartialRecord, PodIndexState
from indexer.types import REAL_TIERS, EngineHash, Tier


def held_hashes(state: PodState) -> set[EngineHash]:
    """Engine hashes `state` holds in any real tier (see `PodState.engine_hashes`)."""
    held: set[EngineHash] = set()
    for tier in REAL_TIERS:
        held |= state.engine_hashes(tier)
    return held


def held_hashes_by_tier(state: PodState) -> dict[Tier, set[EngineHash]]:
    return {tier: state.engine_hashes(tier) for tier in REAL_TIERS}


def held_tiers(state: PodState, engine_hashes: Iterable[EngineHash]) -> dict[EngineHash, Tier]:
    """Of these engine hashes, the ones `state` holds in a real tier, with its best tier."""
    held: dict[EngineHash, Tier] = {}
    for engine_hash in engine_hashes:
        for tier in REAL_TIERS:
            target = state.entries[tier].get(engine_hash)
            alive = target is not None and all(b.store is not None for b in blocks_of(target))
            if alive or engine_hash in state.partials[tier]:
                held[engine_hash] = tier
                break
    return held


def engine_blocks(
    state: PodState, store: PrefixStore, hasher: PrefixHasher, token_ids: Sequence[int]
) -> list[tuple[EngineHash, Tier]]:
    """The engine hashes of `state` that hold the longest prefix of `token_ids` it holds
    in a real tier of `store`, each once with its best tier, in prompt order (see
    `SyncPrefixHashTable.engine_blocks`)."""
    size = hasher.block_size
    position: dict[Block, int] = {}
    for index, gw_hash in enumerate(hasher.prefix_hashes(token_ids)):
        block = store.blocks.get(gw_hash)
        if block is None or not block.real_mask() & state.bit:
            break
        position[block] = index
    # The partials of every held block, and of the first block past them (its tokens
    # may be held in part): Partial(parent gateway hash, tokens since it) -> order key.
    wanted: dict[Partial, tuple[int, int]] = {}
    hashes = [block.gw_hash for block in position]
    for index in range(len(hashes) + 1):
        parent = hashes[index - 1] if index else hasher.seed
        tokens = tuple(token_ids[index * size : (index + 1) * size])
        for length in range(1, min(len(tokens) + 1, size)):
            wanted[Partial(parent, tokens[:length])] = (index, length)
    found: dict[EngineHash, tuple[tuple[int, int], Tier]] = {}
    for tier in REAL_TIERS:
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


def export_entries(state: PodState) -> PodIndexState:
    """What `state` holds for real (router-side entries excluded), for a snapshot."""
    groups: dict[tuple[Tier, str | None], list[EntryRecord]] = {}
    partials: list[PartialRecord] = []
    for tier in REAL_TIERS:
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
