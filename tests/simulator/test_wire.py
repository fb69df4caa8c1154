"""Golden vectors: the captured vLLM 0.32 frames decode and re-encode byte for byte."""

from __future__ import annotations

import json

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EventBatch,
    EventEncoder,
    WireFormatError,
    decode_batch,
)
from tests.golden import FRAMES as GOLDEN


def golden_frames() -> list[dict[str, object]]:
    return [json.loads(line) for line in GOLDEN.read_text().splitlines() if line.strip()]


def test_golden_payloads_round_trip_byte_for_byte() -> None:
    encoder = EventEncoder("map", "vllm")
    payloads = [bytes.fromhex(f["frames_hex"][-1]) for f in golden_frames()]  # type: ignore[index]
    payloads = [p for p in payloads if p]
    assert len(payloads) > 50
    kinds: set[str] = set()
    for payload in payloads:
        batch = decode_batch(payload)
        kinds.update(type(e).__name__ for e in batch.events)
        assert encoder.encode(batch) == payload
    assert kinds == {"BlockStored", "BlockRemoved"}


def test_golden_stores_carry_whole_blocks() -> None:
    for frame in golden_frames():
        payload = bytes.fromhex(frame["frames_hex"][-1])  # type: ignore[index]
        if not payload:
            continue
        for event in decode_batch(payload).events:
            if isinstance(event, BlockStored):
                assert len(event.token_ids) == len(event.block_hashes) * event.block_size


def _stored(hashes: list[int]) -> BlockStored:
    return BlockStored(tuple(hashes), None, tuple(range(4 * len(hashes))), 4, "GPU")


@given(
    hashes=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=4),
    encoding=st.sampled_from(["map", "array"]),
    flavor=st.sampled_from(["vllm", "sglang"]),
)
def test_encoder_round_trips_through_decoder(hashes: list[int], encoding: str, flavor: str) -> None:
    batch = EventBatch(
        1.5,
        (BlockRemoved((hashes[0],), "CPU"), _stored(hashes), AllBlocksCleared()),
        0,
    )
    encoder = EventEncoder(encoding, flavor)  # type: ignore[arg-type]
    assert decode_batch(encoder.encode(batch)) == batch


def test_array_encoding_shapes() -> None:
    raw = msgpack.unpackb(EventEncoder("array", "vllm").encode(EventBatch(1.0, (_stored([5]),))))
    assert raw[1][0][0] == "BlockStored" and len(raw[1][0]) == 12
    raw = msgpack.unpackb(EventEncoder("array", "sglang").encode(EventBatch(1.0, (_stored([5]),))))
    assert len(raw[1][0]) == 6


def test_bytes_hashes_round_trip() -> None:
    batch = EventBatch(2.0, (BlockStored((b"\x01" * 32,), b"\x02" * 32, (1, 2), 2, "GPU"),), 0)
    assert decode_batch(EventEncoder("map", "vllm").encode(batch)) == batch


def test_garbage_is_rejected() -> None:
    with pytest.raises(WireFormatError):
        decode_batch(b"\xc1")
    with pytest.raises(WireFormatError):
        decode_batch(msgpack.packb([1.0, [{"type": "Nope"}], 0]))
