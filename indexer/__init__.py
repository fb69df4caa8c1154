"""Prefix hashing and the sync prefix-hash table (pure, synchronous, no I/O)."""

from indexer.config import IndexConfig, IndexLimits, InvalidIndexConfig
from indexer.hashing import DEFAULT_HASH_SEED, PrefixHasher
from indexer.match import IndexStats, MatchResult
from indexer.snapshot import (
    PodIndexState,
    PodSnapshot,
    SnapshotError,
    decode_snapshot,
    encode_snapshot,
)
from indexer.table import SyncPrefixHashTable
from indexer.types import EngineHash, ModelContext, StoredBlocksEvent, Tier, UnknownPodError

__all__ = [
    "DEFAULT_HASH_SEED",
    "EngineHash",
    "IndexConfig",
    "IndexLimits",
    "IndexStats",
    "InvalidIndexConfig",
    "MatchResult",
    "ModelContext",
    "PodIndexState",
    "PodSnapshot",
    "PrefixHasher",
    "SnapshotError",
    "StoredBlocksEvent",
    "SyncPrefixHashTable",
    "Tier",
    "UnknownPodError",
    "decode_snapshot",
    "encode_snapshot",
]
