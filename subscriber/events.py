"""KV cache events as vLLM and SGLang publish them, and their msgpack payload codec.

A payload (the third frame of a PUB message) is one batch:

- array ``[ts, events, data_parallel_rank]`` (vLLM, SGLang; the rank may be missing), or
  map ``{"ts", "events", "data_parallel_rank" | "attn_dp_rank"}`` (msgspec without
  ``array_like``);
- each event is a map ``{"type": "BlockStored", ...}`` (vLLM >= 0.24, current SGLang) or a
  positional array ``["BlockStored", ...]`` (vLLM <= 0.23: 12 elements for BlockStored;
  older SGLang: 6; SGLang with a cache salt: 8, the last one a ``{"cache_salt"}`` map).

Decoding is strict about what the gateway reads and lenient about everything else: missing
optional fields take their defaults, unknown map keys and trailing array elements are
ignored, and any other deviation rejects the whole batch with a `DecodeError` whose
`reason` is one of `DECODE_REASONS`:

==================== =====================================================================
reason               the payload ...
==================== =====================================================================
too_large            is longer than `DecodeLimits.max_payload_bytes`
msgpack              is not one msgpack object within the limits (truncated, trailing
                     bytes, invalid UTF-8, ext types, a container or string too long)
bad_batch            is not a batch: not an array/map, too short, ``events`` not an array
bad_timestamp        has a ``ts`` that is not a finite number
bad_event            has an event that is not an array/map, has no string type tag, or
                     lacks a required field
unknown_event_type   has an event whose type is not BlockStored, BlockRemoved or
                     AllBlocksCleared
bad_hash             has ``block_hashes`` not an array, or a hash (or parent hash) that is
                     neither a 64-bit int (signed or unsigned) nor 1..64 bytes
bad_tokens           has ``token_ids`` not an array of ints in [0, 2**32) (msgpack
                     true/false are not ints here, nor anywhere else)
token_count_mismatch has a BlockStored with ``len(token_ids) != len(block_hashes) *
                     block_size``
bad_field            has any other field of the wrong type or range (block_size < 1,
                     medium/lora_name/kv_cache_spec_kind not str, lora_id not int,
                     group_idx or data_parallel_rank < 0, extra_keys not one hashable
                     entry per block)
==================== =====================================================================

`subscriber.frames` adds ``frame_count``, ``bad_frame`` and ``bad_seq`` for the ZMQ frames.

An unknown event type rejects the whole batch: such an event may change residency (a new
kind of move or eviction), and applying the rest of the batch while dropping it would
leave the index silently wrong; rejecting it makes the protocol drift visible in the
per-pod rejection counters. A batch is atomic: it is either fully decoded or rejected.
"""

from __future__ import annotations

import math
from array import array
from dataclasses import dataclass
from typing import Any, Final, Literal, TypeAlias, get_args

import msgpack

from indexer import EngineHash

DecodeReason: TypeAlias = Literal[
    "too_large",
    "msgpack",
    "bad_batch",
    "bad_timestamp",
    "bad_event",
    "unknown_event_type",
    "bad_hash",
    "bad_tokens",
    "token_count_mismatch",
    "bad_field",
    "frame_count",
    "bad_frame",
    "bad_seq",
]
DECODE_REASONS: Final[frozenset[str]] = frozenset(get_args(DecodeReason))

MIN_HASH_INT: Final = -(2**63)
MAX_HASH_INT: Final = 2**64 - 1
MAX_HASH_BYTES: Final = 64
MAX_TOKEN_ID: Final = 2**32 - 1
MAX_DETAIL_CHARS: Final = 200


class DecodeError(ValueError):
    """A frame or payload that cannot be decoded; `reason` is one of `DECODE_REASONS`."""

    def __init__(self, reason: DecodeReason, detail: str) -> None:
        detail = detail[:MAX_DETAIL_CHARS]  # it may quote hostile input
        super().__init__(reason, detail)
        self.reason: DecodeReason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}"


@dataclass(frozen=True, slots=True)
class BlockStored:
    """Full blocks that became resident on the engine, a chain under `parent_block_hash`.

    Invariant (checked by the decoder): ``len(token_ids) == len(block_hashes) * block_size``.
    `extra_keys`, when present, has one entry (None or a tuple) per block.
    """

    block_hashes: tuple[EngineHash, ...]
    parent_block_hash: EngineHash | None
    token_ids: tuple[int, ...]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None
    extra_keys: tuple[object, ...] | None = None
    group_idx: int = 0
    kv_cache_spec_kind: str | None = None


@dataclass(frozen=True, slots=True)
class BlockRemoved:
    """Blocks that left `medium` (vLLM sends one hash per event, many events per batch)."""

    block_hashes: tuple[EngineHash, ...]
    medium: str | None = None
    group_idx: int = 0


@dataclass(frozen=True, slots=True)
class AllBlocksCleared:
    """The engine dropped its whole prefix cache (published at the step after a reset)."""


KVEvent: TypeAlias = BlockStored | BlockRemoved | AllBlocksCleared


@dataclass(frozen=True, slots=True)
class KVEventBatch:
    """One published batch: the events of one engine step, in order."""

    ts: float
    events: tuple[KVEvent, ...]
    data_parallel_rank: int | None = None


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """Bounds on the work and memory one payload may cost.

    Container and string lengths are also capped at the payload's length, so a short
    hostile payload cannot make msgpack preallocate a large container.
    """

    max_payload_bytes: int = 64 * 1024 * 1024
    max_array_len: int = 4 * 1024 * 1024
    max_map_len: int = 1024
    max_str_len: int = 1024 * 1024
    max_bin_len: int = 1024 * 1024

    def __post_init__(self) -> None:
        for name in self.__slots__:
            value = getattr(self, name)
            if type(value) is not int or value < 1:
                raise ValueError(f"DecodeLimits.{name} must be a positive int, got {value!r}")


DEFAULT_LIMITS: Final = DecodeLimits()
_U32: Final = next(code for code in "IL" if array(code).itemsize == 4)
_CLEARED: Final = AllBlocksCleared()


def decode_batch(payload: bytes, *, limits: DecodeLimits = DEFAULT_LIMITS) -> KVEventBatch:
    """Decode one msgpack payload into a batch, or raise `DecodeError` (never anything else)."""
    obj = _unpack(payload, limits)
    if type(obj) is tuple:
        if len(obj) < 2:
            raise DecodeError("bad_batch", f"batch array has {len(obj)} elements, expected 2-3")
        ts, raw_events = obj[0], obj[1]
        rank = obj[2] if len(obj) > 2 else None
    elif type(obj) is dict:
        if "ts" not in obj or "events" not in obj:
            raise DecodeError("bad_batch", "batch map without 'ts' or 'events'")
        ts, raw_events = obj["ts"], obj["events"]
        rank = obj.get("data_parallel_rank", obj.get("attn_dp_rank"))
    else:
        raise DecodeError("bad_batch", f"payload is a {_kind(obj)}, not a batch array")
    if type(ts) is not float and type(ts) is not int:
        raise DecodeError("bad_timestamp", f"ts is a {_kind(ts)}")
    if not math.isfinite(ts):
        raise DecodeError("bad_timestamp", f"ts is {ts!r}")
    if type(raw_events) is not tuple:
        raise DecodeError("bad_batch", f"events is a {_kind(raw_events)}, not an array")
    if rank is not None and (type(rank) is not int or rank < 0):
        raise DecodeError("bad_field", f"data_parallel_rank is {rank!r}")
    events: list[KVEvent] = []
    append = events.append
    for index, raw in enumerate(raw_events):
        try:
            append(_decode_event(raw))
        except DecodeError as exc:
            raise DecodeError(exc.reason, f"event {index}: {exc.detail}") from None
    if b"\xc3" in payload or b"\xc2" in payload:
        # msgpack true/false may be hiding among the token ids (bool is an int subclass)
        _check_no_bool_tokens(events)
    return KVEventBatch(float(ts), tuple(events), rank)


def _unpack(payload: bytes, limits: DecodeLimits) -> Any:
    size = len(payload)
    if size > limits.max_payload_bytes:
        raise DecodeError("too_large", f"{size} bytes > {limits.max_payload_bytes}")
    try:
        return msgpack.unpackb(
            payload,
            raw=False,
            use_list=False,
            strict_map_key=True,
            max_str_len=min(size, limits.max_str_len),
            max_bin_len=min(size, limits.max_bin_len),
            max_array_len=min(size, limits.max_array_len),
            max_map_len=min(size // 2, limits.max_map_len),
            max_ext_len=0,
        )
    except (ValueError, TypeError, OverflowError, RecursionError, msgpack.UnpackException) as exc:
        # msgpack's errors are ValueError subclasses (incl. UnicodeDecodeError) but for
        # a few corner cases; map them all at this boundary.
        raise DecodeError("msgpack", f"{type(exc).__name__}: {exc}") from None


def _decode_event(raw: Any) -> KVEvent:
    if type(raw) is dict:
        tag = raw.get("type")
        fields: dict[str, Any] = raw
        if tag == "BlockStored":
            return _stored(
                _required(fields, "block_hashes", tag),
                fields.get("parent_block_hash"),
                _required(fields, "token_ids", tag),
                _required(fields, "block_size", tag),
                fields.get("lora_id"),
                fields.get("medium"),
                fields.get("lora_name"),
                fields.get("extra_keys"),
                fields.get("group_idx"),
                fields.get("kv_cache_spec_kind"),
            )
        if tag == "BlockRemoved":
            return _removed(
                _required(fields, "block_hashes", tag),
                fields.get("medium"),
                fields.get("group_idx"),
            )
    elif type(raw) is tuple:
        n = len(raw)
        if n == 0:
            raise DecodeError("bad_event", "empty event array")
        tag = raw[0]
        if tag == "BlockStored":
            if n < 5:
                raise DecodeError("bad_event", f"BlockStored array has {n} elements, need 5+")
            if n < 11:
                raw = raw + (None,) * (11 - n)
            lora_name = raw[7]
            if type(lora_name) is dict:
                # SGLang's BlockStoredWithMetadata: [..., medium, {"cache_salt": ...}]
                lora_name = None
            return _stored(
                raw[1], raw[2], raw[3], raw[4], raw[5], raw[6], lora_name, raw[8], raw[9], raw[10]
            )
        if tag == "BlockRemoved":
            if n < 2:
                raise DecodeError("bad_event", "BlockRemoved array without block_hashes")
            return _removed(raw[1], raw[2] if n > 2 else None, raw[3] if n > 3 else None)
    else:
        raise DecodeError("bad_event", f"event is a {_kind(raw)}, not an array or map")
    if tag == "AllBlocksCleared":
        return _CLEARED
    if type(tag) is not str:
        raise DecodeError("bad_event", f"event type tag is a {_kind(tag)}")
    raise DecodeError("unknown_event_type", f"event type {tag[:64]!r}")


def _required(fields: dict[str, Any], key: str, tag: str) -> Any:
    try:
        return fields[key]
    except KeyError:
        raise DecodeError("bad_event", f"{tag} without {key!r}") from None


def _stored(
    hashes: Any,
    parent: Any,
    tokens: Any,
    block_size: Any,
    lora_id: Any,
    medium: Any,
    lora_name: Any,
    extra_keys: Any,
    group_idx: Any,
    spec_kind: Any,
) -> BlockStored:
    _check_hashes(hashes)
    if parent is not None:
        _check_hashes((parent,), "parent_block_hash")
    _check_tokens(tokens)
    if type(block_size) is not int or block_size < 1:
        raise DecodeError("bad_field", f"block_size is {block_size!r}")
    if len(tokens) != len(hashes) * block_size:
        raise DecodeError(
            "token_count_mismatch",
            f"{len(tokens)} tokens for {len(hashes)} blocks of {block_size}",
        )
    if lora_id is not None and type(lora_id) is not int:
        raise DecodeError("bad_field", f"lora_id is a {_kind(lora_id)}")
    _check_optional_str(medium, "medium")
    _check_optional_str(lora_name, "lora_name")
    _check_optional_str(spec_kind, "kv_cache_spec_kind")
    if extra_keys is not None:
        _check_extra_keys(extra_keys, len(hashes))
    return BlockStored(
        hashes,
        parent,
        tokens,
        block_size,
        lora_id,
        medium,
        lora_name,
        extra_keys,
        _group_idx(group_idx),
        spec_kind,
    )


def _removed(hashes: Any, medium: Any, group_idx: Any) -> BlockRemoved:
    _check_hashes(hashes)
    _check_optional_str(medium, "medium")
    return BlockRemoved(hashes, medium, _group_idx(group_idx))


def _check_hashes(hashes: Any, what: str = "block_hashes") -> None:
    if type(hashes) is not tuple:
        raise DecodeError("bad_hash", f"{what} is a {_kind(hashes)}, not an array")
    for h in hashes:
        kind = type(h)
        if kind is int:
            if h < MIN_HASH_INT or h > MAX_HASH_INT:
                raise DecodeError("bad_hash", f"{what} has an int outside 64 bits")
        elif kind is bytes:
            if not 1 <= len(h) <= MAX_HASH_BYTES:
                raise DecodeError("bad_hash", f"{what} has a {len(h)}-byte hash")
        else:
            raise DecodeError("bad_hash", f"{what} has a {_kind(h)}")


def _check_tokens(tokens: Any) -> None:
    if type(tokens) is not tuple:
        raise DecodeError("bad_tokens", f"token_ids is a {_kind(tokens)}, not an array")
    try:
        # C-speed check that every token is an int in [0, 2**32) (4-byte unsigned items);
        # bools pass it and are caught by _check_no_bool_tokens.
        array(_U32, tokens)
    except (TypeError, OverflowError):
        raise DecodeError(
            "bad_tokens", "token_ids holds a non-int or one outside [0, 2**32)"
        ) from None


def _check_no_bool_tokens(events: list[KVEvent]) -> None:
    for index, event in enumerate(events):
        if type(event) is BlockStored:
            tokens = event.token_ids
            if (1 in tokens or 0 in tokens) and bool in set(map(type, tokens)):
                raise DecodeError("bad_tokens", f"event {index}: token_ids holds a bool")


def _check_optional_str(value: Any, what: str) -> None:
    if value is not None and type(value) is not str:
        raise DecodeError("bad_field", f"{what} is a {_kind(value)}")


def _check_extra_keys(extra_keys: Any, blocks: int) -> None:
    if type(extra_keys) is not tuple or len(extra_keys) != blocks:
        raise DecodeError("bad_field", f"extra_keys is not an array of {blocks} entries")
    for entry in extra_keys:
        if entry is not None and type(entry) is not tuple:
            raise DecodeError("bad_field", f"extra_keys entry is a {_kind(entry)}")
    try:
        hash(extra_keys)
    except TypeError:
        raise DecodeError("bad_field", "extra_keys holds a map") from None


def _group_idx(value: Any) -> int:
    if value is None:
        return 0
    if type(value) is not int or value < 0:
        raise DecodeError("bad_field", f"group_idx is {value!r}")
    return value


def _kind(value: object) -> str:
    return {
        tuple: "array",
        dict: "map",
        str: "str",
        bytes: "bin",
        int: "int",
        float: "float",
        bool: "bool",
    }.get(type(value), "nil" if value is None else type(value).__name__)


# -- encoding (tests, benchmarks, the simulated publisher) ----------------------------------


def encode_batch(batch: KVEventBatch, encoding: Literal["map", "array"] = "map") -> bytes:
    """Encode `batch` exactly as vLLM does: "map" as 0.32 (msgspec, ``omit_defaults``), "array"
    as <= 0.23 (12-element BlockStored). The batch is ``[ts, events, rank]``, the rank omitted
    when None. Values are not validated: out-of-range ints raise msgpack's OverflowError.
    """
    events: list[Any]
    if encoding == "map":
        events = [_event_map(e) for e in batch.events]
    elif encoding == "array":
        events = [_event_array(e) for e in batch.events]
    else:
        raise ValueError(f"encoding must be 'map' or 'array', got {encoding!r}")
    body: list[Any] = [float(batch.ts), events]
    if batch.data_parallel_rank is not None:
        body.append(batch.data_parallel_rank)
    packed: bytes = msgpack.packb(body, use_bin_type=True)
    return packed


def _event_map(event: KVEvent) -> dict[str, Any]:
    if isinstance(event, BlockStored):
        # lora_id, medium and lora_name have no default in vLLM, so they are always written;
        # group_idx is int-valued in vLLM 0.32 and written even when 0.
        fields: dict[str, Any] = {
            "type": "BlockStored",
            "block_hashes": event.block_hashes,
            "parent_block_hash": event.parent_block_hash,
            "token_ids": event.token_ids,
            "block_size": event.block_size,
            "lora_id": event.lora_id,
            "medium": event.medium,
            "lora_name": event.lora_name,
        }
        if event.extra_keys is not None:
            fields["extra_keys"] = event.extra_keys
        fields["group_idx"] = event.group_idx
        if event.kv_cache_spec_kind is not None:
            fields["kv_cache_spec_kind"] = event.kv_cache_spec_kind
        return fields
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": event.block_hashes,
            "medium": event.medium,
            "group_idx": event.group_idx,
        }
    return {"type": "AllBlocksCleared"}


def _event_array(event: KVEvent) -> list[Any]:
    if isinstance(event, BlockStored):
        return [
            "BlockStored",
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
            event.medium,
            event.lora_name,
            event.extra_keys,
            event.group_idx,
            event.kv_cache_spec_kind,
            None,  # kv_cache_spec_sliding_window
        ]
    if isinstance(event, BlockRemoved):
        return ["BlockRemoved", event.block_hashes, event.medium, event.group_idx]
    return ["AllBlocksCleared"]
