"""One pod's index snapshot and its file format (pure: bytes in, bytes out).

A snapshot holds what the index needs to give one pod back its entries exactly, without
the events: per real tier, each engine hash with the gateway hash(es) it stands for (in
its LoRA context) and its extra copies, and the partial blocks; plus where the pod stood
in its engine's event stream (seq and digest of the last applied batch, and whether the
index was whole) so a subscriber can check the engine's replay still reaches back there.
Gateway hashes are stored, not token ids: they are what the index keeps, they are 8 bytes
instead of 4 × block size, and they only depend on the block size and hash seed, which
the snapshot records so a replica configured differently ignores it.

File: a 28-byte header, then a msgpack body.

    magic "KVGSNAP\\0" | version u16 | flags u16 (0) | body length u64 | xxh64 u64 | body

The checksum covers the header's first 20 bytes and the body, so a truncated, extended or
bit-flipped file is detected before anything in it is believed (`SnapshotError`).
"""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import msgpack
import xxhash

from indexer.hashing import HASH_VERSION
from indexer.types import EngineHash, IndexerError, Tier

MAGIC: Final = b"KVGSNAP\x00"
VERSION: Final = HASH_VERSION
"""The format version is the gateway hash definition's: a snapshot taken with another
definition holds gateway hashes this process would never compute, so it is refused."""
_HEADER = struct.Struct("<8sHHQQ")
HEADER_BYTES: Final = _HEADER.size
_MIN_ENGINE_INT, _MAX_ENGINE_INT = -(2**63), 2**64 - 1
_MAX_ENGINE_BYTES = 64
_MAX_U64 = 2**64 - 1
_MAX_TOKEN = 2**32 - 1
_REAL = (Tier.GPU, Tier.CPU, Tier.STORAGE)

EntryRecord = tuple[EngineHash, tuple[int, ...], int]
"""An engine hash, the gateway hash(es) it stands for (several when the engine's block is
a multiple of the gateway's), and its copies beyond the first."""


@dataclass(frozen=True, slots=True)
class EntryGroup:
    """The entries of one tier in one LoRA context (None: the base model)."""

    tier: Tier
    lora: str | None
    records: tuple[EntryRecord, ...]


@dataclass(frozen=True, slots=True)
class PartialRecord:
    """An engine block smaller than a gateway block that does not complete one."""

    tier: Tier
    engine_hash: EngineHash
    parent_gw: int
    pending: tuple[int, ...]
    copies: int


@dataclass(frozen=True, slots=True)
class PodIndexState:
    """What one pod holds in the index for real (router-side entries excluded)."""

    groups: tuple[EntryGroup, ...] = ()
    partials: tuple[PartialRecord, ...] = ()

    def entry_count(self) -> int:
        return sum(len(group.records) for group in self.groups) + len(self.partials)


@dataclass(frozen=True, slots=True)
class PodSnapshot:
    pod: str
    model: str
    endpoint: str
    """The engine's KV events endpoint when the snapshot was taken: another address is
    another engine process, whose history the snapshot says nothing about."""
    seq: int
    digest: int
    """xxh64 of the last applied batch's payload: with `seq`, identifies the engine's
    incarnation (the same seq with another digest is another history)."""
    whole: bool
    block_size: int
    hash_seed: int
    created_at: float
    """Wall-clock seconds when it was taken (for operators; never compared)."""
    index: PodIndexState


class SnapshotError(IndexerError):
    """Bytes that are not a valid snapshot; `reason` is one of `SNAPSHOT_ERRORS`."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


SNAPSHOT_ERRORS: Final = frozenset(
    {"truncated", "bad_magic", "unsupported_version", "checksum", "too_large", "malformed"}
)


def encode_snapshot(snapshot: PodSnapshot) -> bytes:
    index = snapshot.index
    body: bytes = msgpack.packb(
        {
            "pod": snapshot.pod,
            "model": snapshot.model,
            "endpoint": snapshot.endpoint,
            "seq": snapshot.seq,
            "digest": snapshot.digest,
            "whole": snapshot.whole,
            "block_size": snapshot.block_size,
            "hash_seed": snapshot.hash_seed,
            "created_at": snapshot.created_at,
            "groups": [
                [int(g.tier), g.lora, [[h, copies, *gw] for h, gw, copies in g.records]]
                for g in index.groups
            ],
            "partials": [
                [int(p.tier), p.engine_hash, p.parent_gw, list(p.pending), p.copies]
                for p in index.partials
            ],
        },
        use_bin_type=True,
    )
    head = _HEADER.pack(MAGIC, VERSION, 0, len(body), 0)[:20]
    checksum = xxhash.xxh64_intdigest(head + body)
    return head + checksum.to_bytes(8, "little") + body


def decode_snapshot(data: bytes, *, max_bytes: int | None = None) -> PodSnapshot:
    """Parse and check a snapshot file's bytes; raises `SnapshotError` for anything else."""
    if max_bytes is not None and len(data) > max_bytes:
        raise SnapshotError("too_large", f"{len(data)} bytes > limit {max_bytes}")
    if len(data) < HEADER_BYTES:
        raise SnapshotError("truncated", f"{len(data)} bytes, shorter than the header")
    magic, version, _flags, length, checksum = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise SnapshotError("bad_magic", "not a kvgate snapshot")
    if version != VERSION:
        raise SnapshotError(
            "unsupported_version",
            f"version {version}, expected {VERSION}: written by a kvgate with another "
            "gateway hash definition, whose hashes this one never computes",
        )
    if len(data) - HEADER_BYTES != length:
        reason = "truncated" if len(data) - HEADER_BYTES < length else "malformed"
        raise SnapshotError(
            reason, f"body of {len(data) - HEADER_BYTES} bytes, header says {length}"
        )
    body = data[HEADER_BYTES:]
    if xxhash.xxh64_intdigest(data[:20] + body) != checksum:
        raise SnapshotError("checksum", "the content does not match its checksum")
    try:
        raw = msgpack.unpackb(body, raw=False, strict_map_key=True)
        return _parse(raw)
    except SnapshotError:
        raise
    except (ValueError, TypeError, KeyError, IndexError, msgpack.UnpackException) as exc:
        raise SnapshotError("malformed", f"{type(exc).__name__}: {exc}"[:200]) from None


# -- validation of the body ---------------------------------------------------------------

T = TypeVar("T")


def _parse(raw: Any) -> PodSnapshot:
    if not isinstance(raw, dict):
        raise SnapshotError("malformed", "the body is not a map")
    groups = tuple(_group(item) for item in _list(raw["groups"]))
    partials = tuple(_partial(item) for item in _list(raw["partials"]))
    created_at = raw["created_at"]
    if (
        not isinstance(created_at, float | int)
        or isinstance(created_at, bool)
        or (isinstance(created_at, float) and not math.isfinite(created_at))
    ):
        raise SnapshotError("malformed", "created_at is not a finite number")
    return PodSnapshot(
        pod=_str(raw["pod"]),
        model=_str(raw["model"]),
        endpoint=_str(raw["endpoint"]),
        seq=_int(raw["seq"], 0, _MAX_U64),
        digest=_int(raw["digest"], 0, _MAX_U64),
        whole=_bool(raw["whole"]),
        block_size=_int(raw["block_size"], 1, _MAX_U64),
        hash_seed=_int(raw["hash_seed"], 0, _MAX_U64),
        created_at=float(created_at),
        index=PodIndexState(groups, partials),
    )


def _group(item: Any) -> EntryGroup:
    tier, lora, records = _fixed(item, 3)
    lora_name = None if lora is None else _str(lora)
    parsed: list[EntryRecord] = []
    append = parsed.append
    for record in _list(records):
        # Inlined checks of the common shape: this loop runs once per engine block.
        if type(record) is not list or len(record) < 3:
            raise SnapshotError("malformed", "an entry is not [engine hash, copies, gw...]")
        engine_hash, copies, *gw = record
        if not all(type(h) is int and 0 <= h <= _MAX_U64 for h in gw):
            raise SnapshotError("malformed", "a gateway hash is not an unsigned 64-bit integer")
        if type(engine_hash) is not int or not _MIN_ENGINE_INT <= engine_hash <= _MAX_ENGINE_INT:
            engine_hash = _engine_hash(engine_hash)
        if type(copies) is not int or not 0 <= copies <= _MAX_U64:
            copies = _int(copies, 0, _MAX_U64)
        append((engine_hash, tuple(gw), copies))
    return EntryGroup(_tier(tier), lora_name, tuple(parsed))


def _partial(item: Any) -> PartialRecord:
    tier, engine_hash, parent_gw, pending, copies = _fixed(item, 5)
    return PartialRecord(
        _tier(tier),
        _engine_hash(engine_hash),
        _int(parent_gw, 0, _MAX_U64),
        tuple(_int(t, 0, _MAX_TOKEN) for t in _list(pending)),
        _int(copies, 0, _MAX_U64),
    )


def _fixed(item: Any, size: int) -> list[Any]:
    fields = _list(item)
    if len(fields) != size:
        raise SnapshotError("malformed", f"a record of {len(fields)} fields, expected {size}")
    return fields


def _checked(value: Any, kind: type[T], ok: Callable[[T], bool], what: str) -> T:
    if not isinstance(value, kind) or not ok(value):
        raise SnapshotError("malformed", f"expected {what}, got {type(value).__name__}")
    return value


def _list(value: Any) -> list[Any]:
    return _checked(value, list, lambda _: True, "an array")


def _str(value: Any) -> str:
    return _checked(value, str, lambda _: True, "a string")


def _bool(value: Any) -> bool:
    return _checked(value, bool, lambda _: True, "a boolean")


def _int(value: Any, low: int, high: int) -> int:
    if isinstance(value, bool):
        raise SnapshotError("malformed", "expected an integer, got bool")
    return _checked(value, int, lambda v: low <= v <= high, f"an integer in [{low}, {high}]")


def _tier(value: Any) -> Tier:
    return Tier(_int(value, 0, len(_REAL) - 1))


def _engine_hash(value: Any) -> EngineHash:
    if isinstance(value, bytes):
        if not 0 < len(value) <= _MAX_ENGINE_BYTES:
            raise SnapshotError("malformed", f"an engine hash of {len(value)} bytes")
        return value
    return _int(value, _MIN_ENGINE_INT, _MAX_ENGINE_INT)
