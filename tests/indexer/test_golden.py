"""The index against KV events captured from a real vLLM 0.32 (block size 32).

A minimal local decoder (map encoding only) stands in for the subscriber's; the point
here is the index: chaining from real engine hashes, re-chunking 32-token engine blocks
into 16-token gateway blocks, and ending with exactly what the engine still holds.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import msgpack
import pytest

from indexer import IndexConfig, ModelContext, SyncPrefixHashTable
from tests.golden import FRAMES, TOKENIZE
from tests.indexer.conftest import Stored

POD = "vllm-0"


def live_batches() -> list[tuple[int, list[dict[str, Any]]]]:
    batches = []
    for line in FRAMES.read_text().splitlines():
        record = json.loads(line)
        if record["kind"] != "live":
            continue
        _topic, seq, payload = (bytes.fromhex(frame) for frame in record["frames_hex"])
        _ts, events, _rank = msgpack.unpackb(payload)
        batches.append((int.from_bytes(seq, "big"), events))
    return batches


def apply(table: SyncPrefixHashTable, events: list[dict[str, Any]]) -> None:
    for event in events:
        kind = event["type"]
        if kind == "BlockStored":
            table.apply_stored(
                POD,
                Stored(
                    block_hashes=event["block_hashes"],
                    parent_block_hash=event.get("parent_block_hash"),
                    token_ids=event["token_ids"],
                    block_size=event["block_size"],
                    lora_id=event.get("lora_id"),
                    lora_name=event.get("lora_name"),
                    medium=event.get("medium"),
                ),
            )
        elif kind == "BlockRemoved":
            table.apply_removed(POD, event["block_hashes"], event.get("medium"))
        elif kind == "AllBlocksCleared":
            table.apply_cleared(POD)


def new_table(block_size: int) -> SyncPrefixHashTable:
    table = SyncPrefixHashTable(IndexConfig(block_size=block_size))
    table.register_pod(POD, "tiny")
    return table


@pytest.mark.parametrize("block_size", [16, 32])
def test_index_ends_holding_exactly_what_vllm_holds(block_size: int) -> None:
    table = new_table(block_size)
    resident: Counter[int] = Counter()
    batches = live_batches()
    assert [seq for seq, _ in batches] == list(range(len(batches)))
    for _seq, events in batches:
        apply(table, events)
        for event in events:
            if event["type"] == "BlockStored":
                resident.update(event["block_hashes"])
            elif event["type"] == "BlockRemoved":
                resident.subtract(event["block_hashes"])
    expected = {h for h, copies in resident.items() if copies > 0}
    assert table.dump(POD) == expected
    stats = table.stats()
    assert stats.broken_chain_events == 0
    assert stats.rejected_blocks == {}
    assert stats.unknown_removals == 0
    assert stats.pairs == len(expected) * (32 // block_size)


@pytest.mark.parametrize("block_size", [16, 32])
def test_prompts_tokenized_by_vllm_match_the_blocks_vllm_stored(block_size: int) -> None:
    # The first three batches are the captured requests' own prefills (the rest is other
    # traffic that later evicts them): each request's /tokenize ids must hash to exactly
    # the gateway blocks the engine's events produced.
    table = new_table(block_size)
    for _seq, events in live_batches()[:3]:
        apply(table, events)
    requests = json.loads(TOKENIZE.read_text())
    context = ModelContext("tiny")
    for request in requests:
        tokens = request["tokenize"]["tokens"]
        full_engine_blocks = len(tokens) // 32
        hashes = table.prefix_hashes(tokens)
        matched = table.match(context, hashes, [POD]).matched(POD)
        assert matched == full_engine_blocks * (32 // block_size)
        cached = request["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached <= matched * block_size
