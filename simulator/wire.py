"""vLLM KV-event wire format: typed events, the msgpack encoder and a decoder for both encodings.

Payload = msgpack array `[ts, events, data_parallel_rank]`. Events are tagged maps (vLLM ≥ 0.24,
current SGLang) or tagged arrays (vLLM ≤ 0.23: 12 elements for BlockStored; older SGLang: the
first 6; a missing medium means GPU). Map keys and their order follow the vLLM 0.32 capture;
`lora_id`, `lora_name` and `extra_keys` are written as nulls, `extra_keys` one null per block.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import msgpack

from simulator.block_hash import to_signed64, to_unsigned64
from simulator.cache_types import Block, Tier

EventEncoding = Literal["map", "array"]
HashFormat = Literal["int", "bytes"]
Flavor = Literal["vllm", "sglang"]
EngineHash = int | bytes


@dataclass(frozen=True, slots=True)
class BlockStored:
    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    medium: str | None = "GPU"
    lora_id: int | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    block_hashes: tuple[EngineHash, ...]
    medium: str | None = "GPU"


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    pass


KVEvent = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class EventBatch:
    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = 0


class WireFormatError(ValueError):
    """A payload that is not a vLLM/SGLang KV event batch."""


class HashCodec:
    """How an engine publishes a block's identity: uint64 / int64 ints or raw digest bytes."""

    def __init__(self, hash_format: HashFormat, flavor: Flavor) -> None:
        self.hash_format = hash_format
        self.flavor = flavor

    def publish(self, block: Block) -> EngineHash:
        if self.hash_format == "bytes":
            return block.digest
        return to_signed64(block.key) if self.flavor == "sglang" else block.key

    def to_json(self, block: Block) -> int | str:
        value = self.publish(block)
        return value.hex() if isinstance(value, bytes) else value

    def key_from_json(self, value: object) -> int | None:
        """The cache key of a published hash given as JSON (int, or hex string for bytes)."""
        if isinstance(value, bool):
            return None
        if isinstance(value, int):
            return to_unsigned64(value)
        if isinstance(value, str):
            try:
                raw = bytes.fromhex(value)
            except ValueError:
                return None
            return int.from_bytes(raw[-8:], "big") if raw else None
        return None


class EventEncoder:
    def __init__(self, encoding: EventEncoding, flavor: Flavor) -> None:
        self.encoding = encoding
        self.flavor = flavor

    def encode(self, batch: EventBatch) -> bytes:
        events = [self._event(e) for e in batch.events]
        payload: bytes = msgpack.packb([batch.ts, events, batch.data_parallel_rank])
        return payload

    def _event(self, event: KVEvent) -> Any:
        if isinstance(event, BlockStored):
            hashes = list(event.block_hashes)
            if self.encoding == "array":
                head = ["BlockStored", hashes, event.parent_block_hash, list(event.token_ids)]
                head += [event.block_size, event.lora_id]
                if self.flavor == "sglang":  # older SGLang: 6 fields (+ medium off the GPU)
                    return head if event.medium == "GPU" else [*head, event.medium]
                return [*head, event.medium, None, [None] * len(hashes), 0, "full_attention", None]
            fields: dict[str, Any] = {
                "type": "BlockStored",
                "block_hashes": hashes,
                "parent_block_hash": event.parent_block_hash,
                "token_ids": list(event.token_ids),
                "block_size": event.block_size,
                "lora_id": event.lora_id,
                "medium": event.medium,
            }
            if self.flavor == "vllm":
                fields["lora_name"] = None
                fields["extra_keys"] = [None] * len(hashes)
                fields["group_idx"] = 0
                fields["kv_cache_spec_kind"] = "full_attention"
            return fields
        if isinstance(event, BlockRemoved):
            if self.encoding == "array":
                return ["BlockRemoved", list(event.block_hashes), event.medium]
            removed: dict[str, Any] = {
                "type": "BlockRemoved",
                "block_hashes": list(event.block_hashes),
                "medium": event.medium,
            }
            if self.flavor == "vllm":
                removed["group_idx"] = 0
            return removed
        return ["AllBlocksCleared"] if self.encoding == "array" else {"type": "AllBlocksCleared"}


def _hashes(value: Any) -> tuple[EngineHash, ...]:
    if not isinstance(value, list) or not all(isinstance(h, int | bytes) for h in value):
        raise WireFormatError(f"block_hashes must be a list of ints or bytes, got {value!r}")
    return tuple(value)


def _decode_event(raw: Any) -> KVEvent:
    if isinstance(raw, dict):
        kind = raw.get("type")
        get: Callable[[str, int], Any] = lambda key, _index: raw.get(key)  # noqa: E731
    elif isinstance(raw, list) and raw and isinstance(raw[0], str):
        kind = raw[0]
        get = lambda _key, index: raw[index] if index < len(raw) else None  # noqa: E731
    else:
        raise WireFormatError(f"event must be a tagged map or array, got {raw!r}")
    if kind == "BlockStored":
        tokens = get("token_ids", 3)
        if not isinstance(tokens, list):
            raise WireFormatError("BlockStored.token_ids must be a list")
        return BlockStored(
            block_hashes=_hashes(get("block_hashes", 1)),
            parent_block_hash=get("parent_block_hash", 2),
            token_ids=tuple(tokens),
            block_size=int(get("block_size", 4)),
            lora_id=get("lora_id", 5),
            medium=get("medium", 6) or "GPU",
        )
    if kind == "BlockRemoved":
        return BlockRemoved(_hashes(get("block_hashes", 1)), get("medium", 2) or "GPU")
    if kind == "AllBlocksCleared":
        return AllBlocksCleared()
    raise WireFormatError(f"unknown event type {kind!r}")


def decode_batch(payload: bytes) -> EventBatch:
    """Decode one PUB/replay payload in either encoding."""
    try:
        raw = msgpack.unpackb(payload, strict_map_key=False)
    except (ValueError, msgpack.UnpackException) as exc:
        raise WireFormatError(f"undecodable msgpack payload: {exc}") from exc
    if not isinstance(raw, list) or len(raw) < 2 or not isinstance(raw[1], list):
        raise WireFormatError(f"batch must be [ts, events, dp_rank], got {type(raw).__name__}")
    rank = raw[2] if len(raw) > 2 else None
    return EventBatch(float(raw[0]), tuple(_decode_event(e) for e in raw[1]), rank)


class EventCollector:
    """The cache's event sink: turns block changes into wire events for the next batch."""

    def __init__(self, codec: HashCodec, block_size: int, clock: Callable[[], float] = time.time):
        self._codec = codec
        self._block_size = block_size
        self._clock = clock
        self.pending: list[KVEvent] = []
        self.total_events = 0

    def block_stored(self, blocks: Sequence[Block], parent: Block | None, tier: Tier) -> None:
        tokens: list[int] = []
        for block in blocks:
            tokens.extend(block.tokens)
        parent_hash = self._codec.publish(parent) if parent is not None else None
        hashes = tuple(self._codec.publish(b) for b in blocks)
        self._add(BlockStored(hashes, parent_hash, tuple(tokens), self._block_size, tier.value))

    def block_removed(self, block: Block, tier: Tier) -> None:
        self._add(BlockRemoved((self._codec.publish(block),), tier.value))

    def all_cleared(self) -> None:
        self._add(AllBlocksCleared())

    def _add(self, event: KVEvent) -> None:
        self.pending.append(event)
        self.total_events += 1

    def take_batch(self) -> EventBatch | None:
        if not self.pending:
            return None
        batch = EventBatch(self._clock(), tuple(self.pending), 0)
        self.pending = []
        return batch
