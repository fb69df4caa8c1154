"""Decoding every encoding real engines send, and rejecting everything else with a reason."""

from __future__ import annotations

import dataclasses
from typing import Any

import msgpack
import pytest

from subscriber import (
    DECODE_REASONS,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    DecodeError,
    DecodeLimits,
    KVEventBatch,
    decode_batch,
    encode_batch,
)

TS = 1795268933.5
TOKENS = (1, 2, 3, 4, 5, 6, 7, 8)


def pack(obj: Any) -> bytes:
    packed: bytes = msgpack.packb(obj, use_bin_type=True)
    return packed


def stored_map(**fields: Any) -> dict[str, Any]:
    event: dict[str, Any] = {
        "type": "BlockStored",
        "block_hashes": [11, 12],
        "parent_block_hash": 10,
        "token_ids": list(TOKENS),
        "block_size": 4,
    }
    event.update(fields)
    return event


def one(event: Any) -> Any:
    batch = decode_batch(pack([TS, [event], 0]))
    assert len(batch.events) == 1
    return batch.events[0]


# -- the encodings in the field ------------------------------------------------------------


def test_vllm_023_array_encoding() -> None:
    payload = pack(
        [
            TS,
            [
                ["BlockStored", [11, 12], 10, list(TOKENS), 4, 3, "CPU", "ad", None, 1, "x", None],
                ["BlockRemoved", [11], "GPU", 0],
                ["AllBlocksCleared"],
            ],
            2,
        ]
    )
    assert decode_batch(payload) == KVEventBatch(
        TS,
        (
            BlockStored((11, 12), 10, TOKENS, 4, 3, "CPU", "ad", None, 1, "x"),
            BlockRemoved((11,), "GPU", 0),
            AllBlocksCleared(),
        ),
        2,
    )


def test_old_sglang_array_encoding() -> None:
    # 6-element BlockStored, BlockRemoved without medium, batch without a rank.
    payload = pack(
        [
            TS,
            [["BlockStored", [-5, 2**63 - 1], None, list(TOKENS), 4, None], ["BlockRemoved", [-5]]],
        ]
    )
    batch = decode_batch(payload)
    assert batch.data_parallel_rank is None
    assert batch.events == (
        BlockStored((-5, 2**63 - 1), None, TOKENS, 4),
        BlockRemoved((-5,)),
    )


def test_sglang_array_with_medium_and_cache_salt_metadata() -> None:
    event = one(["BlockStored", [-1], -2, [7, 8], 2, None, "CPU_PINNED", {"cache_salt": "s"}])
    assert event == BlockStored((-1,), -2, (7, 8), 2, None, "CPU_PINNED")
    assert one(["BlockRemoved", [-1], "CPU_PINNED"]) == BlockRemoved((-1,), "CPU_PINNED")


def test_trailing_array_elements_are_ignored() -> None:
    event = one(["BlockStored", [1], None, [7, 8], 2, None, "GPU", None, None, 0, None, 4096, 99])
    assert event == BlockStored((1,), None, (7, 8), 2, None, "GPU")
    assert one(["BlockRemoved", [1], "GPU", 0, "future"]) == BlockRemoved((1,), "GPU")
    assert one(["AllBlocksCleared", 1, 2]) == AllBlocksCleared()


def test_map_encoding_with_every_field() -> None:
    event = one(
        stored_map(
            lora_id=7,
            medium="STORAGE",
            lora_name="adapter-a",
            extra_keys=[["mm-hash", 3], None],
            group_idx=2,
            kv_cache_spec_kind="sliding_window",
        )
    )
    assert event == BlockStored(
        (11, 12),
        10,
        TOKENS,
        4,
        7,
        "STORAGE",
        "adapter-a",
        (("mm-hash", 3), None),
        2,
        "sliding_window",
    )


def test_missing_optional_fields_take_defaults() -> None:
    event = one({"type": "BlockStored", "block_hashes": [1], "token_ids": [5, 6], "block_size": 2})
    assert event == BlockStored((1,), None, (5, 6), 2, None, None, None, None, 0, None)
    assert one({"type": "BlockRemoved", "block_hashes": [1]}) == BlockRemoved((1,), None, 0)
    assert one({"type": "AllBlocksCleared"}) == AllBlocksCleared()


def test_nil_group_idx_means_zero() -> None:
    assert one(stored_map(group_idx=None)).group_idx == 0
    assert one(["BlockRemoved", [1], None, None]).group_idx == 0


def test_unknown_map_keys_are_ignored() -> None:
    extras = {
        "kv_cache_spec_sliding_window": 4096,
        "locality": {"rack": "r1", "nested": [1, {"x": None}]},
        "ownership": ["shared"],
        "session_id": b"\x00\x01",
    }
    assert one(stored_map(**extras)) == one(stored_map())
    assert one({"type": "BlockRemoved", "block_hashes": [1], **extras}) == BlockRemoved((1,))
    batch = decode_batch(pack([TS, [{"type": "AllBlocksCleared", "why": "reset"}]]))
    assert batch.events == (AllBlocksCleared(),)


def test_bytes_hashes() -> None:
    h16, h32, parent = b"\x01" * 16, b"\xfe" * 32, b"\x00" * 32
    event = one(stored_map(block_hashes=[h16, h32], parent_block_hash=parent))
    assert event.block_hashes == (h16, h32)
    assert event.parent_block_hash == parent
    assert one(["BlockRemoved", [h32], "GPU"]) == BlockRemoved((h32,), "GPU")
    assert one(stored_map(block_hashes=[b"\x07", b"\x08" * 64])).block_hashes == (
        b"\x07",
        b"\x08" * 64,
    )


def test_signed_and_unsigned_64_bit_hashes_stay_as_sent() -> None:
    event = one(stored_map(block_hashes=[-(2**63), 2**64 - 1], parent_block_hash=-1))
    assert event.block_hashes == (-(2**63), 2**64 - 1)
    assert event.parent_block_hash == -1


def test_lora_fields_in_both_encodings() -> None:
    by_map = one(stored_map(lora_id=3, lora_name="sql-adapter"))
    by_array = one(["BlockStored", [11, 12], 10, list(TOKENS), 4, 3, None, "sql-adapter"])
    assert by_map.lora_id == by_array.lora_id == 3
    assert by_map.lora_name == by_array.lora_name == "sql-adapter"


@pytest.mark.parametrize("medium", ["GPU", "CPU", "STORAGE", "CPU_PINNED", None])
def test_medium_is_passed_through(medium: str | None) -> None:
    assert one(stored_map(medium=medium)).medium == medium
    assert one({"type": "BlockRemoved", "block_hashes": [1], "medium": medium}).medium == medium


def test_batch_shapes() -> None:
    assert decode_batch(pack([TS, []])) == KVEventBatch(TS, (), None)
    assert decode_batch(pack([7, [], 1, "extra"])) == KVEventBatch(7.0, (), 1)
    as_map = {"ts": TS, "events": [{"type": "AllBlocksCleared"}], "data_parallel_rank": 3}
    assert decode_batch(pack(as_map)) == KVEventBatch(TS, (AllBlocksCleared(),), 3)
    sglang_map = {"ts": TS, "events": [], "attn_dp_rank": 1}
    assert decode_batch(pack(sglang_map)).data_parallel_rank == 1
    assert decode_batch(pack({"ts": TS, "events": []})).data_parallel_rank is None


def test_empty_blocks_are_accepted() -> None:
    assert one(stored_map(block_hashes=[], token_ids=[])) == BlockStored((), 10, (), 4)
    assert one(["BlockRemoved", []]) == BlockRemoved(())


def test_events_are_immutable_and_hashable() -> None:
    event: BlockStored = one(stored_map(extra_keys=[["a", ["b", 1]], None]))
    assert isinstance(event.block_hashes, tuple)
    assert isinstance(event.token_ids, tuple)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.block_size = 8  # type: ignore[misc]
    assert hash(event) == hash(one(stored_map(extra_keys=[["a", ["b", 1]], None])))
    assert not hasattr(event, "__dict__")


def test_encode_rejects_an_unknown_encoding() -> None:
    with pytest.raises(ValueError, match="encoding"):
        encode_batch(KVEventBatch(TS, ()), "json")  # type: ignore[arg-type]


def test_encode_omits_defaults_like_vllm() -> None:
    batch = KVEventBatch(TS, (BlockStored((1,), None, (5, 6), 2), AllBlocksCleared()))
    body = msgpack.unpackb(encode_batch(batch, "map"))
    assert len(body) == 2  # no rank
    assert list(body[1][0]) == [
        "type",
        "block_hashes",
        "parent_block_hash",
        "token_ids",
        "block_size",
        "lora_id",
        "medium",
        "lora_name",
        "group_idx",
    ]
    assert body[1][1] == {"type": "AllBlocksCleared"}


# -- rejections ----------------------------------------------------------------------------


def batch_of(event: Any) -> bytes:
    return pack([TS, [event], 0])


REJECTIONS: list[tuple[str, bytes, str]] = [
    ("msgpack", b"", "empty payload"),
    ("msgpack", pack([TS, []])[:-1] + b"\xc1", "reserved byte"),
    ("msgpack", pack([TS, []]) + b"\x00", "trailing bytes"),
    ("msgpack", pack([TS, [stored_map()], 0])[:-9], "truncated"),
    ("msgpack", b"\x92\xcb" + b"\x00" * 8 + b"\x91\xa2\xff\xfe", "invalid utf-8"),
    ("msgpack", b"\x92\xcb" + b"\x00" * 8 + b"\x91\xd4\x01\x00", "ext type"),
    ("msgpack", b"\xdd\x7f\xff\xff\xff", "array longer than the payload"),
    ("msgpack", b"\x81\x91\x01\x02", "array as a map key"),
    ("bad_batch", pack("hello"), "not an array"),
    ("bad_batch", pack([TS]), "too short"),
    ("bad_batch", pack([TS, {"type": "AllBlocksCleared"}]), "events not an array"),
    ("bad_batch", pack({"events": []}), "map without ts"),
    ("bad_timestamp", pack(["now", []]), "str ts"),
    ("bad_timestamp", pack([None, []]), "nil ts"),
    ("bad_timestamp", pack([True, []]), "bool ts"),
    ("bad_timestamp", pack([float("nan"), []]), "NaN ts"),
    ("bad_timestamp", pack([float("inf"), []]), "infinite ts"),
    ("bad_field", pack([TS, [], -1]), "negative rank"),
    ("bad_field", pack([TS, [], "0"]), "str rank"),
    ("bad_event", batch_of(5), "event is an int"),
    ("bad_event", batch_of([]), "empty event array"),
    ("bad_event", batch_of([5, [1]]), "int tag"),
    ("bad_event", batch_of({"block_hashes": [1]}), "map without type"),
    ("bad_event", batch_of(["BlockStored", [1], None, [1, 2]]), "short BlockStored array"),
    ("bad_event", batch_of(["BlockRemoved"]), "short BlockRemoved array"),
    (
        "bad_event",
        batch_of({"type": "BlockStored", "block_hashes": [1], "block_size": 2}),
        "no tokens",
    ),
    ("bad_event", batch_of({"type": "BlockRemoved"}), "no hashes"),
    ("unknown_event_type", batch_of({"type": "BlockMoved", "block_hashes": [1]}), "map"),
    ("unknown_event_type", batch_of(["BlockTransferred", [1]]), "array"),
    ("bad_hash", batch_of(stored_map(block_hashes=7)), "hashes not an array"),
    ("bad_hash", batch_of(stored_map(block_hashes=[1, "2"])), "str hash"),
    ("bad_hash", batch_of(stored_map(block_hashes=[1, 2.0])), "float hash"),
    ("bad_hash", batch_of(stored_map(block_hashes=[1, None])), "nil hash"),
    ("bad_hash", batch_of(stored_map(block_hashes=[1, True])), "bool hash"),
    ("bad_hash", batch_of(stored_map(block_hashes=[1, b""])), "empty bytes"),
    ("bad_hash", batch_of(stored_map(block_hashes=[1, b"\x00" * 65])), "65 bytes"),
    ("bad_hash", batch_of(stored_map(parent_block_hash="p")), "str parent"),
    ("bad_hash", batch_of(stored_map(parent_block_hash=[1])), "array parent"),
    ("bad_hash", batch_of(["BlockRemoved", [[1]]]), "nested hash"),
    ("bad_tokens", batch_of(stored_map(token_ids="abc")), "tokens not an array"),
    ("bad_tokens", batch_of(stored_map(token_ids=[1, 2, 3, 4, 5, 6, 7, -1])), "negative"),
    ("bad_tokens", batch_of(stored_map(token_ids=[1, 2, 3, 4, 5, 6, 7, 2**32])), "2**32"),
    ("bad_tokens", batch_of(stored_map(token_ids=[1, 2, 3, 4, 5, 6, 7, 8.0])), "float"),
    ("bad_tokens", batch_of(stored_map(token_ids=[1, 2, 3, 4, 5, 6, 7, None])), "nil"),
    ("bad_tokens", batch_of(stored_map(token_ids=[1, 2, 3, 4, 5, 6, 7, True])), "bool"),
    ("bad_tokens", batch_of(stored_map(token_ids=[0, 2, 3, 4, 5, 6, 7, False])), "bool 0"),
    ("token_count_mismatch", batch_of(stored_map(token_ids=[1, 2, 3])), "too few"),
    ("token_count_mismatch", batch_of(stored_map(block_hashes=[1])), "too many"),
    ("bad_field", batch_of(stored_map(block_size=0)), "block size 0"),
    ("bad_field", batch_of(stored_map(block_size="4")), "str block size"),
    ("bad_field", batch_of(stored_map(lora_id="a")), "str lora id"),
    ("bad_field", batch_of(stored_map(medium=1)), "int medium"),
    ("bad_field", batch_of(stored_map(lora_name=b"x")), "bin lora name"),
    ("bad_field", batch_of(stored_map(kv_cache_spec_kind=[])), "array spec kind"),
    ("bad_field", batch_of(stored_map(group_idx=-1)), "negative group"),
    ("bad_field", batch_of(stored_map(group_idx=1.5)), "float group"),
    ("bad_field", batch_of(stored_map(extra_keys=[None])), "one extra key for two blocks"),
    ("bad_field", batch_of(stored_map(extra_keys="k")), "extra keys not an array"),
    ("bad_field", batch_of(stored_map(extra_keys=[1, None])), "extra keys entry not an array"),
    ("bad_field", batch_of(stored_map(extra_keys=[[{"a": 1}], None])), "unhashable entry"),
    ("bad_field", batch_of(["BlockRemoved", [1], 5]), "int medium in an array"),
]


@pytest.mark.parametrize(
    ("reason", "payload"),
    [pytest.param(reason, payload, id=f"{reason}-{note}") for reason, payload, note in REJECTIONS],
)
def test_rejections(reason: str, payload: bytes) -> None:
    with pytest.raises(DecodeError) as info:
        decode_batch(payload)
    assert info.value.reason == reason
    assert str(info.value).startswith(f"{reason}: ")


def test_every_payload_reason_has_a_rejection_test() -> None:
    frame_reasons = {"frame_count", "bad_frame", "bad_seq"}  # tested in test_frames.py
    assert {reason for reason, _, _ in REJECTIONS} == DECODE_REASONS - frame_reasons - {"too_large"}


def test_too_large() -> None:
    payload = pack([TS, [stored_map()], 0])
    decode_batch(payload, limits=DecodeLimits(max_payload_bytes=len(payload)))
    with pytest.raises(DecodeError) as info:
        decode_batch(payload, limits=DecodeLimits(max_payload_bytes=len(payload) - 1))
    assert info.value.reason == "too_large"


def test_container_limits() -> None:
    payload = pack([TS, [stored_map()], 0])
    for limits in (
        DecodeLimits(max_array_len=7),
        DecodeLimits(max_map_len=4),
        DecodeLimits(max_str_len=10),
    ):
        with pytest.raises(DecodeError) as info:
            decode_batch(payload, limits=limits)
        assert info.value.reason == "msgpack"
    with pytest.raises(DecodeError):
        decode_batch(batch_of(stored_map(session_id=b"x" * 9)), limits=DecodeLimits(max_bin_len=8))


@pytest.mark.parametrize("field", ["max_payload_bytes", "max_array_len", "max_map_len"])
@pytest.mark.parametrize("value", [0, -1, 1.5])
def test_limits_must_be_positive_ints(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        DecodeLimits(**{field: value})


def test_a_batch_is_atomic() -> None:
    good = stored_map()
    with pytest.raises(DecodeError) as info:
        decode_batch(pack([TS, [good, good, {"type": "Nope"}], 0]))
    assert info.value.reason == "unknown_event_type"
    assert info.value.detail.startswith("event 2: ")


def test_decode_error_is_a_value_error() -> None:
    error = DecodeError("bad_hash", "detail")
    assert isinstance(error, ValueError)
    assert (error.reason, error.detail) == ("bad_hash", "detail")
    assert error.args == ("bad_hash", "detail")


def test_decode_error_detail_is_bounded() -> None:
    with pytest.raises(DecodeError) as info:
        decode_batch(pack([TS, [], "x" * 100_000]))
    assert info.value.reason == "bad_field"
    assert len(info.value.detail) <= 200
