"""Value types shared by the indexer's modules and its callers."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

EngineHash = int | bytes
"""An engine's own block hash: opaque, unique only within one pod (ints or raw bytes)."""


class Tier(IntEnum):
    """Where a pod holds a block, best first.

    EXPECTED is not a storage medium: it marks a router-side entry (the router sent a
    request there and expects the block to be stored, or the pod publishes no events).
    """

    GPU = 0
    CPU = 1
    STORAGE = 2
    EXPECTED = 3

    @classmethod
    def from_medium(cls, medium: str | None) -> Tier:
        """Map an event's `medium` to a tier; None means GPU (vLLM's default).

        Unknown media are treated as STORAGE: somewhere off the GPU and off host memory,
        the slowest tier we know, so they never outrank a real GPU hit.
        """
        if medium is None:
            return cls.GPU
        return _MEDIA.get(medium.upper(), cls.STORAGE)


_MEDIA: dict[str, Tier] = {
    "GPU": Tier.GPU,
    "CUDA": Tier.GPU,
    "DEVICE": Tier.GPU,
    "CPU": Tier.CPU,
    "CPU_PINNED": Tier.CPU,  # SGLang's pinned host memory
    "HOST": Tier.CPU,
    "STORAGE": Tier.STORAGE,
    "DISK": Tier.STORAGE,
}

REAL_TIERS: tuple[Tier, Tier, Tier] = (Tier.GPU, Tier.CPU, Tier.STORAGE)


@dataclass(frozen=True, slots=True)
class ModelContext:
    """The namespace of a prefix: blocks of different models or LoRA adapters never match."""

    model: str
    lora: str | None = None


class StoredBlocksEvent(Protocol):
    """What `SyncPrefixHashTable.apply_stored` reads from a BlockStored event.

    `subscriber.events.BlockStored` satisfies it; the field names are vLLM's.
    """

    @property
    def block_hashes(self) -> Sequence[EngineHash]: ...
    @property
    def parent_block_hash(self) -> EngineHash | None: ...
    @property
    def token_ids(self) -> Sequence[int]: ...
    @property
    def block_size(self) -> int: ...
    @property
    def lora_id(self) -> int | None: ...
    @property
    def lora_name(self) -> str | None: ...
    @property
    def medium(self) -> str | None: ...


class IndexerError(Exception):
    """Base of the indexer's errors."""


class UnknownPodError(IndexerError, KeyError):
    """An operation named a pod that was never registered (or was removed)."""

    def __init__(self, pod: str) -> None:
        super().__init__(pod)
        self.pod = pod

    def __str__(self) -> str:
        return f"unknown pod {self.pod!r}: register it before applying its events"
