"""What the index knows about one pod: its engine-hash maps and router-side entries."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from indexer.block import Block
from indexer.types import EngineHash, ModelContext, Tier

Target = Block | tuple[Block, ...]
"""What one engine block stands for: one gateway block, or several when the engine's
blocks are a multiple of the gateway's block size."""


@dataclass(frozen=True, slots=True)
class Partial:
    """An engine block smaller than a gateway block that does not complete one (SGLang
    with page size 1 sends a block per token): the gateway hash it chains from, and the
    tokens since that boundary. The engine block that completes the gateway block maps to
    it like any other entry."""

    parent_gw: int
    pending: tuple[int, ...]


class PodState:
    """One registered pod.

    `entries[tier]` maps each engine hash the pod holds in that tier to its gateway
    block(s); it is also the reverse index that lets a BlockRemoved find its block in
    O(1). The engine may hold several copies of one hash (vLLM recomputes a block it
    already has): `copies` counts the copies beyond the first. Several engine hashes may
    stand for the same gateway block: `extra_refs` counts the references beyond the first,
    so the pod's bit is cleared only when the last of them goes.
    """

    __slots__ = (
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
    ) -> None:
        self.name = name
        self.bit = bit
        self.model = model
        self.base_context = ModelContext(model)
        self.publishes_events = publishes_events
        self.lora_names = dict(lora_names)
        self.entries: tuple[dict[EngineHash, Target], ...] = ({}, {}, {})
        self.partials: tuple[dict[EngineHash, Partial], ...] = ({}, {}, {})
        self.copies: tuple[dict[EngineHash, int], ...] = ({}, {}, {})
        self.extra_refs: tuple[dict[Block, int], ...] = ({}, {}, {})
        self.expected: dict[Block, float] = {}
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

    def lookup_chain(self, engine_hash: EngineHash) -> tuple[int, tuple[int, ...]] | None:
        """Where a child of this engine block chains from: the last gateway hash and the
        tokens since it (none unless the block is a partial), in whatever tier it is held."""
        for entries, partials in zip(self.entries, self.partials, strict=True):
            target = entries.get(engine_hash)
            if target is not None:
                gw_hash = target.gw_hash if isinstance(target, Block) else target[-1].gw_hash
                return gw_hash, ()
            partial = partials.get(engine_hash)
            if partial is not None:
                return partial.parent_gw, partial.pending
        return None

    def engine_hashes(self, tier: Tier) -> set[EngineHash]:
        """Engine hashes held in `tier` whose gateway blocks are still indexed (partial
        blocks included)."""
        held = {engine_hash for engine_hash, target in self.entries[tier].items() if _alive(target)}
        held.update(self.partials[tier])
        return held

    def clear(self) -> None:
        for maps in (self.entries, self.partials, self.copies, self.extra_refs):
            for mapping in maps:
                mapping.clear()
        self.expected.clear()
        self.size = 0


def _alive(target: Target) -> bool:
    if isinstance(target, Block):
        return target.store is not None
    return all(block.store is not None for block in target)


def blocks_of(target: Target) -> tuple[Block, ...]:
    return (target,) if isinstance(target, Block) else target
