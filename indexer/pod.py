"""What the index knows about one pod: its engine-hash maps and router-side entries."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from indexer.block import PrefixStore
from indexer.native import BlockMap
from indexer.types import EngineHash, ModelContext, Tier

_Key = TypeVar("_Key", bound=Hashable)


def release_extra(extras: dict[_Key, int], key: _Key) -> bool:
    """One copy of `key` beyond its first goes, if it has any (`extras` counts only those
    beyond the first: a key at 0 is absent); True when one did."""
    extra = extras.get(key)
    if not extra:
        return False
    if extra == 1:
        del extras[key]
    else:
        extras[key] = extra - 1
    return True


class OtherContext:
    """An engine entry outside the pod's base context (a LoRA adapter): its store and
    gateway hashes. Rare, so an object each is fine."""

    __slots__ = ("hashes", "store")

    def __init__(self, store: PrefixStore, hashes: tuple[int, ...]) -> None:
        self.store = store
        self.hashes = hashes


Target = int | tuple[int, ...] | OtherContext
"""What one engine block stands for: one gateway block of the pod's base store (an int,
the common case), several (when the engine's blocks are a multiple of the gateway's
block size), or gateway blocks of another context."""

Key = int | tuple[PrefixStore, int]
"""A gateway block in a pod's own maps: its hash in the base store, (store, hash) else."""


@dataclass(frozen=True, slots=True)
class Partial:
    """An engine block smaller than a gateway block that does not complete one (SGLang
    with page size 1 sends a block per token): the gateway hash it chains from, and the
    tokens since that boundary. The engine block that completes the gateway block maps to
    it like any other entry."""

    parent_gw: int
    pending: tuple[int, ...]


class IndexedPod:
    """One registered pod.

    `entries[tier]` maps each engine hash the pod holds in that tier to its gateway
    block(s); it is also the reverse index that lets a BlockRemoved find its block in
    O(1). The engine may hold several copies of one hash (vLLM recomputes a block it
    already has): `copies` counts the copies beyond the first. Several engine hashes may
    stand for the same gateway block: `extra_refs` counts the references beyond the first,
    so the pod's bit is cleared only when the last of them goes.
    """

    __slots__ = (
        "base",
        "base_context",
        "bit",
        "copies",
        "entries",
        "epoch",
        "expected",
        "extra_refs",
        "generation",
        "lora_names",
        "model",
        "name",
        "partials",
        "publishes_events",
        "rejected",
        "size",
    )

    def __init__(
        self,
        name: str,
        bit: int,
        model: str,
        *,
        publishes_events: bool,
        lora_names: Mapping[int, str],
        new_map: Callable[[], BlockMap[EngineHash, Target]],
    ) -> None:
        self.name = name
        self.bit = bit
        self.model = model
        self.base_context = ModelContext(model)
        self.publishes_events = publishes_events
        self.lora_names = dict(lora_names)
        # The big maps (one item per engine block): dicts, or compiled maps that keep int
        # keys and values unboxed (see indexer/native.py).
        self.entries: tuple[BlockMap[EngineHash, Target], ...] = (new_map(), new_map(), new_map())
        self.partials: tuple[dict[EngineHash, Partial], ...] = ({}, {}, {})
        self.copies: tuple[dict[EngineHash, int], ...] = ({}, {}, {})
        self.extra_refs: tuple[dict[Key, int], ...] = ({}, {}, {})
        self.expected: dict[Key, float] = {}
        self.base: PrefixStore | None = None
        """The store of the base context, once the pod has used it (see `use_store`)."""
        self.size = 0
        self.rejected: dict[str, int] = {}
        self.epoch = 0
        self.generation = 0
        """Counts the events applied to the pod (see `SyncPrefixHashTable.pod_generation`)."""
        """Set by the table when the pod is registered or cleared, so that a caller that
        remembers it can tell the pod's blocks were all dropped since (a pin ledger)."""

    def context(self, lora_id: int | None, lora_name: str | None) -> ModelContext:
        if lora_name:
            return ModelContext(self.model, lora_name)
        if lora_id:
            return ModelContext(self.model, self.lora_names.get(lora_id, f"lora-{lora_id}"))
        return self.base_context

    def use_store(self, store: PrefixStore) -> None:
        """Called with every store the pod is about to write into: remembers its base."""
        context = store.context
        if store is not self.base and context.lora is None and context.model == self.model:
            self.base = store

    def key(self, store: PrefixStore, gw_hash: int) -> Key:
        return gw_hash if store is self.base else (store, gw_hash)

    def unkey(self, key: Key) -> tuple[PrefixStore, int]:
        if type(key) is int:
            base = self.base
            assert base is not None
            return base, key
        assert isinstance(key, tuple)
        return key

    def resolve(self, target: Target) -> tuple[PrefixStore, tuple[int, ...]]:
        """The store and gateway hashes an engine entry stands for."""
        if type(target) is int:
            base = self.base
            assert base is not None
            return base, (target,)
        if isinstance(target, OtherContext):
            return target.store, target.hashes
        base = self.base
        assert base is not None and isinstance(target, tuple)
        return base, target

    def target(self, store: PrefixStore, hashes: tuple[int, ...]) -> Target:
        if store is not self.base:
            return OtherContext(store, hashes)
        return hashes[0] if len(hashes) == 1 else hashes

    def lookup_chain(self, engine_hash: EngineHash) -> tuple[int, tuple[int, ...]] | None:
        """Where a child of this engine block chains from: the last gateway hash and the
        tokens since it (none unless the block is a partial), in whatever tier it is held."""
        for entries, partials in zip(self.entries, self.partials, strict=True):
            target = entries.get(engine_hash)
            if target is not None:
                return last_hash(target), ()
            partial = partials.get(engine_hash)
            if partial is not None:
                return partial.parent_gw, partial.pending
        return None

    def alive(self, target: Target) -> bool:
        """Whether every gateway block of an entry is still indexed."""
        store, hashes = self.resolve(target)
        return store.alive and all(h in store.held for h in hashes)

    def engine_hashes(self, tier: Tier) -> set[EngineHash]:
        """Engine hashes held in `tier` whose gateway blocks are still indexed (partial
        blocks included)."""
        alive = self.alive
        held = {engine_hash for engine_hash, target in self.entries[tier].items() if alive(target)}
        held.update(self.partials[tier])
        return held

    def clear(self) -> None:
        for maps in (self.entries, self.partials, self.copies, self.extra_refs):
            for mapping in maps:
                mapping.clear()
        self.expected.clear()
        self.size = 0


def last_hash(target: Target) -> int:
    if type(target) is int:
        return target
    if isinstance(target, OtherContext):
        return target.hashes[-1]
    assert isinstance(target, tuple)
    return target[-1]
