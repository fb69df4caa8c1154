"""The index resolves a prompt's prefix to one pod's engine hashes, whatever the engine's
block size (the map a pin call needs)."""

from __future__ import annotations

from indexer import ModelContext, SyncPrefixHashTable, Tier
from tests.helpers import FakeClock
from tests.indexer.conftest import Stored, make_table

CTX = ModelContext("m")
TOKENS = list(range(1, 19))  # 4 full gateway blocks of 4 tokens, and 2 tokens after them


def table() -> SyncPrefixHashTable:
    t = make_table(FakeClock(), block_size=4)
    t.register_pod("p", "m")
    t.register_pod("q", "m")
    return t


def test_engine_blocks_equal_to_gateway_blocks() -> None:
    t = table()
    t.apply_stored("p", Stored([11, 12, 13], None, TOKENS[:12]))
    t.apply_stored("q", Stored([21], None, TOKENS[:4]))
    assert t.engine_blocks("p", CTX, TOKENS) == [(11, Tier.GPU), (12, Tier.GPU), (13, Tier.GPU)]
    assert t.engine_blocks("q", CTX, TOKENS) == [(21, Tier.GPU)]
    # Another prompt sharing only the first block resolves to that block only.
    assert t.engine_blocks("p", CTX, TOKENS[:4] + [99] * 8) == [(11, Tier.GPU)]
    assert t.engine_blocks("p", ModelContext("other"), TOKENS) == []


def test_engine_blocks_larger_than_gateway_blocks() -> None:
    t = table()
    t.apply_stored("p", Stored([31, 32], None, TOKENS[:16], block_size=8))
    assert t.engine_blocks("p", CTX, TOKENS) == [(31, Tier.GPU), (32, Tier.GPU)]
    # An engine block is only part of a prefix when all its gateway blocks are.
    assert t.engine_blocks("p", CTX, TOKENS[:12]) == [(31, Tier.GPU)]


def test_per_token_engine_blocks_resolve_through_partials() -> None:
    t = table()
    hashes = list(range(100, 118))
    parent = None
    for engine_hash, token in zip(hashes, TOKENS, strict=True):
        t.apply_stored("p", Stored([engine_hash], parent, [token], block_size=1))
        parent = engine_hash
    resolved = t.engine_blocks("p", CTX, TOKENS)
    assert [h for h, _ in resolved] == hashes  # every token's block, tail included
    # A prompt that diverges inside block 2 keeps the partials of its own tokens only.
    diverging = TOKENS[:9] + [77, 78, 79]
    assert [h for h, _ in t.engine_blocks("p", CTX, diverging)] == hashes[:9]


def test_tiers_and_epochs() -> None:
    t = table()
    t.apply_stored("p", Stored([11, 12], None, TOKENS[:8]))
    t.apply_removed("p", [12], "GPU")
    t.apply_stored("p", Stored([12], 11, TOKENS[4:8], medium="CPU"))
    assert t.engine_blocks("p", CTX, TOKENS) == [(11, Tier.GPU), (12, Tier.CPU)]
    assert t.held_tiers("p", [11, 12, 13]) == {11: Tier.GPU, 12: Tier.CPU}
    epoch = t.pod_epoch("p")
    t.apply_cleared("p")
    assert t.pod_epoch("p") != epoch
    assert t.held_tiers("p", [11, 12]) == {}
    assert t.engine_blocks("p", CTX, TOKENS) == []
