"""Types shared by the paged prefix cache, its event sink and its storage backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Protocol


class Tier(StrEnum):
    """Where a block's KV lives; the value is the `medium` published in events."""

    GPU = "GPU"
    CPU = "CPU"
    STORAGE = "STORAGE"


@dataclass(eq=False, slots=True)
class Block:
    """One full block of the prefix tree.

    `ref_count` counts running requests using the block (always GPU-resident while > 0);
    `pin_count` counts external pins; `protect` counts pinned blocks at or below this one,
    so a pin protects every ancestor. A block stays in the tree while any tier holds it.
    """

    key: int
    digest: bytes
    parent: Block | None
    tokens: tuple[int, ...]
    children: dict[int, Block] = field(default_factory=dict)
    tiers: set[Tier] = field(default_factory=set)
    ref_count: int = 0
    pin_count: int = 0
    protect: int = 0

    def has_child_in(self, tier: Tier) -> bool:
        return any(tier in child.tiers for child in self.children.values())

    def best_tier(self) -> Tier | None:
        for tier in (Tier.GPU, Tier.CPU, Tier.STORAGE):
            if tier in self.tiers:
                return tier
        return None


@dataclass(slots=True)
class Allocation:
    """A running request's hold on the cache: its referenced chain and reserved GPU slots.

    `blocks` is the request's chain from the root (matched then committed blocks); each holds
    one reference from this allocation. `reserved` GPU slots are set aside for blocks not yet
    full. `hits` counts the matched blocks by the tier they were found in.
    """

    blocks: list[Block]
    reserved: int
    hits: dict[Tier, int]
    released: bool = False

    @property
    def matched_blocks(self) -> int:
        return sum(self.hits.values())


class CacheEventSink(Protocol):
    """Receives every cache change, in order, as it happens."""

    def block_stored(self, blocks: Sequence[Block], parent: Block | None, tier: Tier) -> None: ...

    def block_removed(self, block: Block, tier: Tier) -> None: ...

    def all_cleared(self) -> None: ...


class StorageBackend(Protocol):
    """The persistent tier behind `Tier.STORAGE` (write-through; deletes on eviction)."""

    def write(self, block: Block) -> None: ...

    def delete(self, block: Block) -> None: ...

    def clear(self) -> None: ...


class RecordingSink:
    """A sink that keeps every change as a tuple; used by the engine's tests and tools."""

    def __init__(self) -> None:
        self.events: list[tuple[str, tuple[int, ...], int | None, str]] = []

    def block_stored(self, blocks: Sequence[Block], parent: Block | None, tier: Tier) -> None:
        parent_key = parent.key if parent is not None else None
        self.events.append(("stored", tuple(b.key for b in blocks), parent_key, tier.value))

    def block_removed(self, block: Block, tier: Tier) -> None:
        self.events.append(("removed", (block.key,), None, tier.value))

    def all_cleared(self) -> None:
        self.events.append(("cleared", (), None, ""))
