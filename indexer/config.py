"""Index configuration: block size, hash seed and limits. The gateway reads them from its
settings (`gateway/settings.py`, `INDEX_SETTINGS`: the seed's AIBRIX_* names)."""

from __future__ import annotations

from dataclasses import dataclass, fields

from indexer.hashing import DEFAULT_HASH_SEED


class InvalidIndexConfig(ValueError):
    """An index configuration that breaks an invariant (a field, its value, what is
    allowed). The gateway reads and checks its settings before they get here."""

    def __init__(self, name: str, value: object, allowed: str) -> None:
        super().__init__(f"{name}={value!r} is invalid: expected {allowed}")


@dataclass(frozen=True, slots=True)
class IndexLimits:
    """Bounds that keep the index's memory finite whatever the event stream.

    Event-backed entries mirror what engines really hold, so they are never aged out —
    only the caps evict them (least recently used first). Router-side entries (expected
    blocks, and everything of pods that publish no events) expire after their TTL.
    """

    max_contexts: int = 1000
    """Distinct (model, LoRA) contexts; beyond it the least recently used context goes."""
    max_prefixes_per_context: int = 2_000_000
    """Distinct gateway blocks per context; beyond it the least recently used 10% go.
    (The Go gateway defaulted to 10 000, less than one GPU's cache; a fleet needs more.)"""
    max_blocks_per_pod: int = 1_000_000
    """Engine blocks indexed per pod; stores beyond it are refused and counted."""
    max_expected_per_pod: int = 100_000
    """Router-side (expected) blocks per pod; the oldest go first."""
    eviction_interval_s: float = 60.0
    """How often the eviction pass runs (it also runs whenever a cap is crossed)."""
    eviction_duration_s: float = 20 * 60.0
    """Lifetime of router-side entries of pods that publish no events."""
    expected_ttl_s: float = 10.0
    """Lifetime of a router-side entry on a pod that publishes events, unless a
    BlockStored confirms it first."""

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if not value > 0:
                raise InvalidIndexConfig(spec.name, value, "a positive number")


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Everything a `SyncPrefixHashTable` is built from."""

    block_size: int = 16
    """Gateway block size in tokens (AIBRIX_PREFIX_CACHE_BLOCK_SIZE)."""
    hash_seed: int = DEFAULT_HASH_SEED
    """Seed of the chained hash (KVGATE_HASH_SEED); identical on every replica."""
    limits: IndexLimits = IndexLimits()
    pure_python: bool | None = None
    """Run on plain dicts and the xxhash package even where the compiled primitives
    (indexer/_native.c) are built (KVGATE_PURE_PYTHON); None: compiled when built, unless
    the process's KVGATE_PURE_PYTHON says otherwise (see indexer/native.py)."""

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise InvalidIndexConfig("block_size", self.block_size, "a positive number of tokens")
        if not 0 <= self.hash_seed < 2**64:
            raise InvalidIndexConfig("hash_seed", self.hash_seed, "an unsigned 64-bit integer")
