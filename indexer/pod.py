"""What the index knows about one pod: its engine-hash maps and router-side entries."""

from __future__ import annotations

from collections.abc import Mapping

from indexer.block import Block
from indexer.types import EngineHash, ModelContext, Tier

Target = Block | tuple[Block, ...]
"""What one engine block stands for: one gateway block, or several when the engine's
blocks are a multiple of the gateway's block size."""


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
        "expected",
        "extra_refs",
        "lora_names",
        "model",
        "name",
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
        self.copies: tuple[dict[EngineHash, int], ...] = ({}, {}, {})
        self.extra_refs: tuple[dict[Block, int], ...] = ({}, {}, {})
        self.expected: dict[Block, float] = {}
        self.size = 0
        self.rejected: dict[str, int] = {}

    def context(self, lora_id: int | None, lora_name: str | None) -> ModelContext:
        if lora_name:
            return ModelContext(self.model, lora_name)
        if lora_id:
            return ModelContext(self.model, self.lora_names.get(lora_id, f"lora-{lora_id}"))
        return self.base_context

    def lookup_gateway_hash(self, engine_hash: EngineHash) -> int | None:
        """The gateway hash an engine hash stands for, in whatever tier the pod holds it."""
        for entries in self.entries:
            target = entries.get(engine_hash)
            if target is not None:
                return target.gw_hash if isinstance(target, Block) else target[-1].gw_hash
        return None

    def engine_hashes(self, tier: Tier) -> set[EngineHash]:
        """Engine hashes held in `tier` whose gateway blocks are still indexed."""
        return {engine_hash for engine_hash, target in self.entries[tier].items() if _alive(target)}

    def clear(self) -> None:
        for maps in (self.entries, self.copies, self.extra_refs):
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
