"""Index configuration: block size, hash seed and limits (the seed's AIBRIX_* names)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from indexer.hashing import DEFAULT_HASH_SEED


class ConfigError(ValueError):
    """An invalid setting: names the variable, the value and what is allowed."""

    def __init__(self, variable: str, value: object, allowed: str) -> None:
        super().__init__(f"{variable}={value!r} is invalid: expected {allowed}")
        self.variable = variable
        self.value = value
        self.allowed = allowed


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
                raise ConfigError(spec.name, value, "a positive number")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> IndexLimits:
        """Read the limits from environment-style settings; unset names keep defaults."""
        values: dict[str, Any] = {}
        for variable, (name, parse, allowed) in _ENV.items():
            raw = env.get(variable)
            if raw is None or raw.strip() == "":
                continue
            try:
                value = parse(raw.strip())
            except ValueError:
                raise ConfigError(variable, raw, allowed) from None
            if not value > 0:
                raise ConfigError(variable, raw, allowed)
            values[name] = value
        return cls(**values)


def _minutes(raw: str) -> float:
    return float(raw) * 60.0


_ENV: dict[str, tuple[str, Callable[[str], float | int], str]] = {
    "AIBRIX_SYNC_MAX_CONTEXTS": ("max_contexts", int, "a positive integer"),
    "AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT": (
        "max_prefixes_per_context",
        int,
        "a positive integer",
    ),
    "AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS": (
        "eviction_interval_s",
        float,
        "a positive number of seconds",
    ),
    "AIBRIX_SYNC_EVICTION_DURATION_MINUTES": (
        "eviction_duration_s",
        _minutes,
        "a positive number of minutes",
    ),
    "KVGATE_INDEX_MAX_BLOCKS_PER_POD": ("max_blocks_per_pod", int, "a positive integer"),
    "KVGATE_INDEX_MAX_EXPECTED_PER_POD": ("max_expected_per_pod", int, "a positive integer"),
    "KVGATE_INDEX_EXPECTED_TTL_SECONDS": ("expected_ttl_s", float, "a positive number of seconds"),
}


@dataclass(frozen=True, slots=True)
class IndexConfig:
    """Everything a `SyncPrefixHashTable` is built from."""

    block_size: int = 16
    """Gateway block size in tokens (AIBRIX_PREFIX_CACHE_BLOCK_SIZE)."""
    hash_seed: int = DEFAULT_HASH_SEED
    """Seed of the chained hash (KVGATE_HASH_SEED); identical on every replica."""
    limits: IndexLimits = IndexLimits()

    def __post_init__(self) -> None:
        if self.block_size < 1:
            raise ConfigError("block_size", self.block_size, "a positive number of tokens")
        if not 0 <= self.hash_seed < 2**64:
            raise ConfigError("hash_seed", self.hash_seed, "an unsigned 64-bit integer")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> IndexConfig:
        values: dict[str, Any] = {"limits": IndexLimits.from_env(env)}
        raw = env.get("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "").strip()
        if raw:
            if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:  # "²" is a digit too
                raise ConfigError(
                    "AIBRIX_PREFIX_CACHE_BLOCK_SIZE", raw, "a positive integer number of tokens"
                )
            values["block_size"] = int(raw)
        raw = env.get("KVGATE_HASH_SEED", "").strip()
        if raw:
            try:
                seed = int(raw, 0)
            except ValueError:
                seed = -1
            if not 0 <= seed < 2**64:
                raise ConfigError(
                    "KVGATE_HASH_SEED", raw, "an unsigned 64-bit integer (decimal or 0x hex)"
                )
            values["hash_seed"] = seed
        return cls(**values)
