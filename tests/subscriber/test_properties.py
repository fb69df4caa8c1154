"""Property and fuzz tests: valid batches round-trip; nothing but DecodeError ever escapes."""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import msgpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bench import decoder_fuzz
from subscriber import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    KVEvent,
    KVEventBatch,
    decode_batch,
    decode_pub_message,
    decode_replay_message,
    encode_batch,
)

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
FUZZ = settings(max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
STRUCTURE_FUZZ = settings(FUZZ, max_examples=400)  # recursive values are slow to generate

engine_hashes = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1), st.binary(min_size=1, max_size=64)
)
small_text = st.text(max_size=12)
optional_text = st.none() | small_text
u64 = st.integers(min_value=0, max_value=2**64 - 1)
extra_key_entry = (
    st.none()
    | st.tuples(small_text)
    | st.lists(
        st.one_of(
            small_text,
            st.integers(-5, 2**40),
            st.binary(max_size=8),
            st.tuples(small_text, st.integers(0, 9)),
        ),
        max_size=3,
    ).map(tuple)
)


@st.composite
def block_stored(draw: st.DrawFn) -> BlockStored:
    blocks = draw(st.integers(min_value=0, max_value=4))
    block_size = draw(st.integers(min_value=1, max_value=4))
    hashes = tuple(draw(st.lists(engine_hashes, min_size=blocks, max_size=blocks)))
    tokens = draw(
        st.lists(
            st.integers(min_value=0, max_value=2**32 - 1),
            min_size=blocks * block_size,
            max_size=blocks * block_size,
        )
    )
    extra = draw(st.none() | st.lists(extra_key_entry, min_size=blocks, max_size=blocks).map(tuple))
    return BlockStored(
        hashes,
        draw(st.none() | engine_hashes),
        tuple(tokens),
        block_size,
        draw(st.none() | st.integers(min_value=-(2**63), max_value=2**64 - 1)),
        draw(optional_text),
        draw(optional_text),
        extra,
        draw(u64),
        draw(optional_text),
    )


block_removed = st.builds(
    BlockRemoved, st.lists(engine_hashes, max_size=4).map(tuple), optional_text, u64
)
events: st.SearchStrategy[KVEvent] = st.one_of(
    block_stored(), block_removed, st.just(AllBlocksCleared())
)
batches = st.builds(
    KVEventBatch,
    st.floats(allow_nan=False, allow_infinity=False),
    st.lists(events, max_size=5).map(tuple),
    st.none() | u64,
)


@PROPERTY
@given(batches, st.sampled_from(["map", "array"]))
def test_valid_batches_round_trip(batch: KVEventBatch, encoding: Any) -> None:
    assert decode_batch(encode_batch(batch, encoding)) == batch


@PROPERTY
@given(batches)
def test_map_encoding_is_canonical(batch: KVEventBatch) -> None:
    payload = encode_batch(batch, "map")
    assert encode_batch(decode_batch(payload), "map") == payload


def _decodes_or_rejects(payload: bytes) -> None:
    try:
        batch = decode_batch(payload)
    except DecodeError:
        return
    for event in batch.events:
        if isinstance(event, BlockStored):
            assert len(event.token_ids) == len(event.block_hashes) * event.block_size
    for encoding in ("map", "array"):
        payload = encode_batch(batch, encoding)  # bytes: an accepted NaN is != itself
        assert encode_batch(decode_batch(payload), encoding) == payload


@FUZZ
@given(st.binary(max_size=300))
def test_random_bytes_only_raise_decode_error(payload: bytes) -> None:
    _decodes_or_rejects(payload)


msgpack_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**63), max_value=2**64 - 1),
        st.floats(),
        st.text(max_size=8),
        st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "GPU"]),
        st.binary(max_size=70),
    ),
    lambda children: (
        st.lists(children, max_size=6)
        | st.dictionaries(
            st.sampled_from(["type", "block_hashes", "token_ids", "block_size", "medium", "x"]),
            children,
            max_size=6,
        )
    ),
    max_leaves=30,
)
batch_like = st.tuples(
    st.one_of(st.floats(), msgpack_values),
    st.lists(
        st.one_of(
            msgpack_values,
            st.tuples(st.sampled_from(["BlockStored", "BlockRemoved"]), msgpack_values).map(list),
            st.builds(
                lambda tag, rest: [tag, *rest],
                st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
                st.lists(msgpack_values, max_size=12),
            ),
        ),
        max_size=4,
    ),
).map(list)


@STRUCTURE_FUZZ
@given(st.one_of(msgpack_values, batch_like))
def test_random_structures_only_raise_decode_error(value: Any) -> None:
    _decodes_or_rejects(msgpack.packb(value, use_bin_type=True))


@FUZZ
@given(st.lists(st.binary(max_size=12), max_size=6))
def test_random_frames_only_raise_decode_error(frames: list[bytes]) -> None:
    for decode in (decode_pub_message, decode_replay_message):
        with contextlib.suppress(DecodeError):
            decode(frames)


def test_mutated_golden_payloads_never_crash(live_payloads: list[bytes]) -> None:
    report = decoder_fuzz.run_fuzz(4000, seed=20261121, payloads=live_payloads)
    assert report.crash_count == 0, report.crashes[:3]
    assert report.cases == 4000
    assert report.accepted > 0 and sum(report.rejected.values()) > 0


def test_fuzz_bench_command(tmp_path: Path) -> None:
    parser = argparse.ArgumentParser()
    decoder_fuzz.configure_parser(parser)
    out = tmp_path / "fuzz.json"
    args = parser.parse_args(
        ["--cases", "300", "--seed", "3", "--seconds", "0.05", "--json", str(out)]
    )
    assert decoder_fuzz.run(args) == 0
    results = json.loads(out.read_text())
    assert results["cases"] == 300
    assert results["crashes"] == 0
    assert results["decode_batches_per_s"] > 0
