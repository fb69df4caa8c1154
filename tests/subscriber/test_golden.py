"""Every frame of the golden vLLM 0.32.0 capture decodes, and means what vLLM meant."""

from __future__ import annotations

import msgpack

from subscriber import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    EngineHash,
    KVEventBatch,
    ReplayEnd,
    ReplayEntry,
    decode_batch,
    decode_pub_message,
    decode_replay_message,
    encode_batch,
)
from tests.subscriber.conftest import GoldenRecord


def _live(golden: list[GoldenRecord]) -> list[tuple[str, int, KVEventBatch]]:
    out = []
    for record in golden:
        if record.kind == "live":
            topic, seq, payload = decode_pub_message(record.frames)
            out.append((topic, seq, decode_batch(payload)))
    return out


def test_every_live_frame_decodes(golden: list[GoldenRecord]) -> None:
    live = _live(golden)
    assert len(live) == 27
    assert [seq for _, seq, _ in live] == list(range(27))
    assert {topic for topic, _, _ in live} == {"kv-events"}
    assert all(batch.data_parallel_rank == 0 for _, _, batch in live)
    assert sum(len(batch.events) for _, _, batch in live) == 27 + 99


def test_every_replay_frame_decodes(golden: list[GoldenRecord]) -> None:
    live = {
        seq: payload
        for _, seq, payload in (decode_pub_message(r.frames) for r in golden if r.kind == "live")
    }
    answers: dict[int, list[int]] = {}
    ends = 0
    for record in golden:
        if record.kind != "replay":
            continue
        assert record.start is not None
        message = decode_replay_message(record.frames)
        if isinstance(message, ReplayEnd):
            assert message.topic == ""  # vLLM 0.32 sends the end marker without the topic
            ends += 1
            continue
        assert isinstance(message, ReplayEntry)
        assert message.topic == "kv-events"
        assert message.payload == live[message.seq]
        decode_batch(message.payload)
        answers.setdefault(record.start, []).append(message.seq)
    assert ends == 3
    assert answers[0] == list(range(27))
    assert answers[3] == list(range(3, 27))
    assert 1_000_000 not in answers  # a start beyond the newest gets only the end marker


def test_live_frames_give_the_resident_set(
    golden: list[GoldenRecord], live_payloads: list[bytes]
) -> None:
    resident: set[EngineHash] = set()
    for _, _, batch in _live(golden):
        for event in batch.events:
            if isinstance(event, BlockStored):
                resident.update(event.block_hashes)
            elif isinstance(event, BlockRemoved):
                resident.difference_update(event.block_hashes)
            else:
                assert isinstance(event, AllBlocksCleared)
                resident.clear()

    # The same computed from plain msgpack, without the decoder.
    expected: set[int] = set()
    for payload in live_payloads:
        for event in msgpack.unpackb(payload)[1]:
            if event["type"] == "BlockStored":
                expected.update(event["block_hashes"])
            else:
                expected.difference_update(event["block_hashes"])
    assert resident == expected
    assert len(resident) == 225 - 99 == 126
    assert 29784354593554664 in resident


def test_concrete_facts_of_the_capture(live_payloads: list[bytes]) -> None:
    first = decode_batch(live_payloads[0])
    assert first.ts == 1795268933.102894
    assert len(first.events) == 1
    stored = first.events[0]
    assert isinstance(stored, BlockStored)
    assert len(stored.block_hashes) == 7
    assert stored.block_hashes[0] == 4578399079552559608
    assert stored.parent_block_hash is None
    assert stored.block_size == 32
    assert len(stored.token_ids) == 7 * 32
    assert stored.token_ids[:4] == (1, 63, 1129, 567)
    assert stored.medium == "GPU"
    assert stored.lora_id is None and stored.lora_name is None
    assert stored.extra_keys == (None,) * 7
    assert stored.group_idx == 0
    assert stored.kv_cache_spec_kind == "full_attention"

    second = decode_batch(live_payloads[1]).events[0]
    assert isinstance(second, BlockStored)
    assert second.parent_block_hash == stored.block_hashes[5]  # shares the first six blocks

    # uint64 hashes above 2**63 stay unsigned Python ints
    hashes = [
        h
        for p in live_payloads
        for e in decode_batch(p).events
        if isinstance(e, BlockStored)
        for h in e.block_hashes
    ]
    assert all(type(h) is int for h in hashes)
    assert max(h for h in hashes if isinstance(h, int)) > 2**63

    evictions = decode_batch(live_payloads[16])
    assert len(evictions.events) == 4
    assert evictions.events[0] == BlockRemoved((8270679458649327540,), "GPU", 0)
    assert all(len(e.block_hashes) == 1 for e in evictions.events if isinstance(e, BlockRemoved))


def test_map_reencoding_is_byte_exact(live_payloads: list[bytes]) -> None:
    for payload in live_payloads:
        assert encode_batch(decode_batch(payload), "map") == payload


def test_array_reencoding_round_trips(live_payloads: list[bytes]) -> None:
    for payload in live_payloads:
        batch = decode_batch(payload)
        encoded = encode_batch(batch, "array")
        assert encoded != payload
        assert decode_batch(encoded) == batch
        for event in msgpack.unpackb(encoded)[1]:
            assert isinstance(event, list)
            assert len(event) == {"BlockStored": 12, "BlockRemoved": 4}[event[0]]
