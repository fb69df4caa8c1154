from __future__ import annotations

import pytest

from indexer import IndexLimits, ModelContext, SyncPrefixHashTable, Tier, UnknownPodError
from tests.helpers import FakeClock
from tests.indexer.conftest import Stored, make_table

CTX = ModelContext("m")
TOKENS = list(range(100, 132))  # 8 blocks of 4


@pytest.fixture
def table(clock: FakeClock) -> SyncPrefixHashTable:
    table = make_table(clock)
    for pod in ("a", "b", "c"):
        table.register_pod(pod, "m")
    return table


def store_chain(
    table: SyncPrefixHashTable,
    pod: str,
    hashes: list[int],
    *,
    parent: int | None = None,
    start: int = 0,
    tokens: list[int] = TOKENS,
    medium: str | None = "GPU",
) -> int:
    """Store blocks start..start+len(hashes) of `tokens` on `pod` under `hashes`."""
    return table.apply_stored(
        pod,
        Stored(
            block_hashes=hashes,
            parent_block_hash=parent,
            token_ids=tokens[start * 4 : (start + len(hashes)) * 4],
            medium=medium,
        ),
    )


def matched(table: SyncPrefixHashTable, tokens: list[int] = TOKENS, **kw: object) -> dict:
    pods = kw.get("pods", ["a", "b", "c"])
    context = kw.get("context", CTX)
    return dict(table.match(context, table.prefix_hashes(tokens), pods).blocks)  # type: ignore[arg-type]


def test_stored_chain_is_matched_block_by_block(table: SyncPrefixHashTable) -> None:
    assert store_chain(table, "a", [1, 2, 3]) == 3
    assert store_chain(table, "a", [4, 5], parent=3, start=3) == 2
    store_chain(table, "b", [11, 12])
    assert matched(table) == {"a": 5, "b": 2, "c": 0}
    assert table.dump("a") == {1, 2, 3, 4, 5}


def test_engine_hashes_are_per_pod_and_gateway_hashes_shared(table: SyncPrefixHashTable) -> None:
    # Two engines name the same content differently; the index sees one prefix.
    store_chain(table, "a", [1, 2])
    store_chain(table, "b", [900, 901])
    assert table.stats().blocks == 2
    assert table.stats().pairs == 4
    assert matched(table) == {"a": 2, "b": 2, "c": 0}


def test_match_counts_only_consecutive_blocks_from_the_start(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2, 3, 4])
    table.apply_removed("a", [2])  # a hole: block 3 and 4 no longer count
    assert matched(table)["a"] == 1


def test_match_stops_early_and_handles_empty_inputs(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1])
    assert matched(table, [1, 2, 3]) == {"a": 0, "b": 0, "c": 0}  # no full block
    assert table.match(ModelContext("other"), table.prefix_hashes(TOKENS), ["a"]).blocks == {"a": 0}
    result = table.match(CTX, table.prefix_hashes(TOKENS), ["a", "ghost"])
    assert result.blocks == {"a": 1, "ghost": 0}
    assert result.prompt_blocks == 8
    assert result.ratio("a") == pytest.approx(1 / 8)
    assert result.best() == ("a", 1)


def test_broken_chain_is_counted_and_not_inserted(table: SyncPrefixHashTable) -> None:
    assert store_chain(table, "a", [5, 6], parent=4, start=4) == 0
    stats = table.stats()
    assert stats.broken_chain_events == 1
    assert stats.broken_chain_blocks == 2
    assert stats.blocks == 0
    assert table.rejected_blocks("a") == {"broken_chain": 2}
    assert table.rejected_blocks("b") == {}
    assert table.dump("a") == set()
    # In particular the blocks are not re-rooted at the seed: the prompt that starts with
    # those tokens does not match them.
    assert matched(table, TOKENS[16:]) == {"a": 0, "b": 0, "c": 0}


def test_parent_known_on_another_pod_only_is_still_a_broken_chain(
    table: SyncPrefixHashTable,
) -> None:
    store_chain(table, "b", [1, 2])
    assert store_chain(table, "a", [3], parent=2, start=2) == 0


def test_duplicate_store_is_idempotent_and_counts_copies(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2])
    store_chain(table, "a", [2], parent=1, start=1)  # vLLM recomputed block 2: 2 copies
    assert table.dump("a") == {1, 2}
    assert matched(table)["a"] == 2
    assert table.stats().pairs == 2
    table.apply_removed("a", [2])  # one copy left
    assert matched(table)["a"] == 2
    table.apply_removed("a", [2])
    assert matched(table)["a"] == 1
    assert table.dump("a") == {1}


def test_removal_touches_only_that_pod(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2])
    store_chain(table, "b", [1, 2])  # same engine hashes on another pod
    assert table.apply_removed("a", [2]) == 1
    assert matched(table) == {"a": 1, "b": 2, "c": 0}
    assert table.dump("b") == {1, 2}


def test_unknown_removal_is_counted(table: SyncPrefixHashTable) -> None:
    assert table.apply_removed("a", [42, 43]) == 0
    assert table.stats().unknown_removals == 2


def test_two_engine_hashes_for_one_gateway_block(table: SyncPrefixHashTable) -> None:
    # An engine that hashes differently (e.g. extra keys) may store the same tokens twice.
    store_chain(table, "a", [1])
    store_chain(table, "a", [77])
    assert table.stats().pairs == 1
    table.apply_removed("a", [1])
    assert matched(table)["a"] == 1  # still held through hash 77
    table.apply_removed("a", [77])
    assert matched(table)["a"] == 0
    assert table.stats().blocks == 0


def test_rehashed_engine_hash_replaces_its_old_content(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1])
    store_chain(table, "a", [1], start=4)  # same engine hash, other tokens
    assert table.stats().remapped == 1
    assert matched(table)["a"] == 0
    assert matched(table, TOKENS[16:])["a"] == 1
    assert table.stats().blocks == 1


def test_clear_drops_only_that_pod(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2, 3])
    store_chain(table, "b", [1, 2])
    table.add_prefix("a", CTX, table.prefix_hashes(TOKENS))
    table.apply_cleared("a")
    assert matched(table) == {"a": 0, "b": 2, "c": 0}
    assert table.dump("a") == set()
    stats = table.stats()
    assert (stats.blocks, stats.pairs, stats.expected) == (2, 2, 0)
    # and the pod keeps working afterwards
    store_chain(table, "a", [7])
    assert matched(table)["a"] == 1


def test_remove_pod_forgets_everything_and_frees_its_slot(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2, 3])
    table.remove_pod("a")
    assert not table.has_pod("a")
    assert table.stats().blocks == 0
    with pytest.raises(UnknownPodError):
        table.dump("a")
    table.register_pod("d", "m")  # reuses a's bit: must not inherit its blocks
    assert matched(table, pods=["d"]) == {"d": 0}
    table.remove_pod("never-registered")  # no error


def test_unknown_pod_is_an_error(table: SyncPrefixHashTable) -> None:
    with pytest.raises(UnknownPodError, match="ghost"):
        store_chain(table, "ghost", [1])
    with pytest.raises(UnknownPodError):
        table.apply_removed("ghost", [1])
    with pytest.raises(UnknownPodError):
        table.apply_cleared("ghost")


def test_reregistering_with_another_model_drops_old_blocks(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1])
    table.register_pod("a", "m")  # same model: nothing changes
    assert matched(table)["a"] == 1
    table.register_pod("a", "other-model")
    assert matched(table)["a"] == 0
    assert table.stats().blocks == 0


def test_lora_blocks_live_in_their_own_context(table: SyncPrefixHashTable) -> None:
    table.register_pod("a", "m", lora_names={3: "sql-adapter"})
    table.apply_stored("a", Stored([1], None, TOKENS[:4], lora_name="chat-adapter"))
    table.apply_stored("a", Stored([2], None, TOKENS[:4], lora_id=3))
    table.apply_stored("a", Stored([4], None, TOKENS[:4], lora_id=9))
    hashes = table.prefix_hashes(TOKENS)
    assert table.match(CTX, hashes, ["a"]).blocks == {"a": 0}
    for lora in ("chat-adapter", "sql-adapter", "lora-9"):
        assert table.match(ModelContext("m", lora), hashes, ["a"]).blocks == {"a": 1}
    assert table.stats().contexts == 3


def test_tiers_are_reported_per_matched_block(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2])
    store_chain(table, "a", [3], parent=2, start=2, medium="CPU")
    store_chain(table, "a", [4], parent=3, start=3, medium="STORAGE")
    store_chain(table, "b", [1, 2], medium="cpu")
    result = table.match(CTX, table.prefix_hashes(TOKENS), ["a", "b"])
    assert result.tiers("a") == [Tier.GPU, Tier.GPU, Tier.CPU, Tier.STORAGE]
    assert result.tiers("b") == [Tier.CPU, Tier.CPU]
    assert result.tier_counts("a")[Tier.CPU] == 1
    # A block on GPU and CPU counts as GPU; removing the GPU copy leaves the CPU one.
    store_chain(table, "a", [1], medium="CPU")
    result = table.match(CTX, table.prefix_hashes(TOKENS), ["a"])
    assert result.tiers("a")[0] is Tier.GPU
    table.apply_removed("a", [1], "GPU")
    result = table.match(CTX, table.prefix_hashes(TOKENS), ["a"])
    assert result.tiers("a")[0] is Tier.CPU
    assert table.dump_tiers("a")[Tier.CPU] == {1, 3}
    table.apply_removed("a", [1], "CPU")
    assert matched(table)["a"] == 0


@pytest.mark.parametrize(
    ("medium", "tier"),
    [
        (None, Tier.GPU),
        ("gpu", Tier.GPU),
        ("CPU", Tier.CPU),
        ("CPU_PINNED", Tier.CPU),
        ("STORAGE", Tier.STORAGE),
        ("DISK", Tier.STORAGE),
        ("EXTERNAL", Tier.STORAGE),
    ],
)
def test_media_of_vllm_and_sglang_map_to_tiers(medium: str | None, tier: Tier) -> None:
    assert Tier.from_medium(medium) is tier


def test_unknown_medium_is_the_slowest_tier(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1], medium="NVME_OVER_FABRIC")
    assert table.match(CTX, table.prefix_hashes(TOKENS), ["a"]).tiers("a") == [Tier.STORAGE]
    assert table.apply_removed("a", [1], "NVME_OVER_FABRIC") == 1


def test_engine_blocks_larger_than_gateway_blocks_are_rechunked(clock: FakeClock) -> None:
    table = make_table(clock, block_size=4)
    table.register_pod("a", "m")
    # vLLM with block size 8: each engine block is two gateway blocks.
    table.apply_stored("a", Stored([1, 2], None, TOKENS[:16], block_size=8))
    table.apply_stored("a", Stored([3], 2, TOKENS[16:24], block_size=8))
    assert matched(table, pods=["a"]) == {"a": 6}
    table.apply_removed("a", [3])
    assert matched(table, pods=["a"]) == {"a": 4}
    assert table.stats().pairs == 4


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (Stored([1], None, TOKENS[:3]), "token_count_mismatch"),
        (Stored([1], None, TOKENS[:3], block_size=3), "block_size_mismatch"),
        (Stored([1], None, TOKENS[:6], block_size=6), "block_size_mismatch"),
        (Stored([1], None, [-5, 1, 2, 3]), "bad_token_ids"),
    ],
)
def test_malformed_stores_are_rejected_with_a_reason(
    table: SyncPrefixHashTable, event: Stored, reason: str
) -> None:
    assert table.apply_stored("a", event) == 0
    assert table.stats().rejected_blocks == {reason: 1}
    assert table.stats().blocks == 0


def test_bytes_engine_hashes(table: SyncPrefixHashTable) -> None:
    first, second = b"\x01" * 32, b"\x02" * 32
    table.apply_stored("a", Stored([first], None, TOKENS[:4]))
    table.apply_stored("a", Stored([second], first, TOKENS[4:8]))
    assert matched(table)["a"] == 2
    assert table.dump("a") == {first, second}


def test_expected_entries_expire_unless_confirmed(
    table: SyncPrefixHashTable, clock: FakeClock
) -> None:
    hashes = table.prefix_hashes(TOKENS)
    assert table.add_prefix("a", CTX, hashes[:3], ttl=5) == 3
    result = table.match(CTX, hashes, ["a"])
    assert result.blocks == {"a": 3}
    assert result.tiers("a") == [Tier.EXPECTED] * 3
    store_chain(table, "a", [1])  # BlockStored confirms block 0
    clock.advance(5)
    result = table.match(CTX, hashes, ["a"])
    assert result.blocks == {"a": 1}
    assert result.tiers("a") == [Tier.GPU]
    stats = table.stats()
    assert (stats.expected, stats.expired_expected, stats.blocks) == (0, 2, 1)


def test_refreshing_an_expected_entry_extends_it(
    table: SyncPrefixHashTable, clock: FakeClock
) -> None:
    hashes = table.prefix_hashes(TOKENS)[:2]
    table.add_prefix("a", CTX, hashes, ttl=5)
    clock.advance(4)
    table.add_prefix("a", CTX, hashes, ttl=5)
    clock.advance(4)
    assert matched(table, pods=["a"]) == {"a": 2}
    clock.advance(1)
    assert matched(table, pods=["a"]) == {"a": 0}


def test_a_hot_prefix_refreshed_by_every_request_keeps_the_expiry_queue_small(
    table: SyncPrefixHashTable, clock: FakeClock
) -> None:
    """Every request routed refreshes its prompt's entries: stale items of the expiry
    queue are compacted away, and what expires is exactly what was not refreshed."""
    hashes = table.prefix_hashes(TOKENS)
    table.register_pod("b", "m")
    for _ in range(3000):
        table.add_prefix("a", CTX, hashes[:3], ttl=5)
        table.add_prefix("b", CTX, hashes[:1], ttl=5)
        clock.advance(0.001)
    expiry_queue = table._expected._heap  # its size is what is checked
    assert sum(len(keys) for *_, keys in expiry_queue) <= 4 * 4 + 1024
    table.add_prefix("b", CTX, hashes[:2], ttl=10)
    clock.advance(6)
    assert matched(table, pods=["a", "b"]) == {"a": 0, "b": 2}
    assert table.stats().expected == 2
    clock.advance(5)
    assert matched(table, pods=["a", "b"]) == {"a": 0, "b": 0}
    assert table.stats().expected == 0


def test_expected_entries_skip_blocks_already_held(table: SyncPrefixHashTable) -> None:
    store_chain(table, "a", [1, 2])
    assert table.add_prefix("a", CTX, table.prefix_hashes(TOKENS)[:3]) == 1
    assert table.stats().expected == 1


def test_pods_without_events_use_the_approximate_ttl(clock: FakeClock) -> None:
    limits = IndexLimits(eviction_duration_s=600, expected_ttl_s=10)
    table = make_table(clock, limits=limits)
    table.register_pod("quiet", "m", publishes_events=False)
    table.register_pod("loud", "m")
    hashes = table.prefix_hashes(TOKENS)
    table.add_prefix("quiet", CTX, hashes)
    table.add_prefix("loud", CTX, hashes)
    clock.advance(11)
    assert table.match(CTX, hashes, ["quiet", "loud"]).blocks == {"quiet": 8, "loud": 0}
    clock.advance(600)
    assert table.match(CTX, hashes, ["quiet", "loud"]).blocks == {"quiet": 0, "loud": 0}
    assert table.stats().blocks == 0


def test_expected_entries_per_pod_are_capped_oldest_first(clock: FakeClock) -> None:
    table = make_table(clock, limits=IndexLimits(max_expected_per_pod=3))
    table.register_pod("a", "m")
    hashes = table.prefix_hashes(TOKENS)
    table.add_prefix("a", CTX, hashes[:2])
    table.add_prefix("a", CTX, hashes[4:6])
    assert table.stats().expected == 3
    # hashes[0] was the oldest and went: the match from the start is now empty
    assert table.match(CTX, hashes, ["a"]).blocks == {"a": 0}


def test_prefixes_per_context_are_capped_least_recently_used_first(clock: FakeClock) -> None:
    table = make_table(clock, limits=IndexLimits(max_prefixes_per_context=10))
    table.register_pod("a", "m")
    table.register_pod("b", "m")
    store_chain(table, "a", [1, 2, 3, 4])
    clock.advance(1)
    store_chain(table, "b", list(range(20, 28)), tokens=list(range(500, 532)))
    clock.advance(1)
    # 12 blocks > 10: trimmed to 9. The least recently used go first (pod a's chain),
    # tail first so that what stays still matches, and their entries are swept.
    stats = table.stats()
    assert stats.blocks == 9
    assert stats.evicted_blocks == 3
    assert stats.engine_entries == stats.pairs == 9
    assert table.dump("a") == {1}
    assert matched(table, pods=["a"]) == {"a": 1}
    assert matched(table, list(range(500, 532)), pods=["b"]) == {"b": 8}
    # a child of an evicted parent is a broken chain, never re-rooted
    assert store_chain(table, "a", [5], parent=4, start=4) == 0
    assert table.stats().broken_chain_events == 1


def test_contexts_are_capped_least_recently_used_first(clock: FakeClock) -> None:
    table = make_table(clock, limits=IndexLimits(max_contexts=2))
    table.register_pod("a", "m")
    for lora in ("x", "y", "z"):
        table.apply_stored("a", Stored([hash(lora)], None, TOKENS[:4], lora_name=lora))
        clock.advance(1)
    stats = table.stats()
    assert (stats.contexts, stats.evicted_contexts, stats.pairs) == (2, 1, 2)
    assert table.dump("a") == {hash("y"), hash("z")}


def test_blocks_per_pod_are_capped(clock: FakeClock) -> None:
    table = make_table(clock, limits=IndexLimits(max_blocks_per_pod=3))
    table.register_pod("a", "m")
    assert store_chain(table, "a", [1, 2, 3, 4, 5]) == 3
    assert table.stats().rejected_blocks == {"pod_limit": 2}
    assert table.stats().blocks == 3
    table.apply_removed("a", [3])
    assert store_chain(table, "a", [3], parent=2, start=2) == 1


def test_eviction_pass_runs_by_itself_on_the_interval(clock: FakeClock) -> None:
    table = make_table(clock, limits=IndexLimits(eviction_interval_s=30))
    table.register_pod("a", "m")
    store_chain(table, "a", [1])
    assert table.stats().eviction_runs == 0
    clock.advance(31)
    table.match(CTX, table.prefix_hashes(TOKENS), ["a"])
    assert table.stats().eviction_runs == 1


def test_engine_blocks_smaller_than_gateway_blocks_are_rechunked(clock: FakeClock) -> None:
    # SGLang with page size 1 announces one block per token; the gateway's blocks are 4.
    table = make_table(clock, block_size=4)
    table.register_pod("a", "m")
    table.apply_stored("a", Stored(list(range(1, 7)), None, TOKENS[:6], block_size=1))
    assert matched(table, pods=["a"]) == {"a": 1}  # tokens 0..3 complete one gateway block
    table.apply_stored("a", Stored([7, 8], 6, TOKENS[6:8], block_size=1))  # chains on a partial
    assert matched(table, pods=["a"]) == {"a": 2}
    assert table.dump("a") == set(range(1, 9))
    assert table.stats().pairs == 2
    table.apply_removed("a", [8])  # tail-first eviction: the second gateway block is gone
    assert matched(table, pods=["a"]) == {"a": 1}
    table.apply_removed("a", [7, 6, 5])
    assert table.dump("a") == {1, 2, 3, 4}
    assert matched(table, pods=["a"]) == {"a": 1}
    assert table.apply_stored("a", Stored([9], 77, TOKENS[:1], block_size=1)) == 0  # unknown
    # a full-size block cannot continue from the middle of a gateway block
    assert table.apply_stored("a", Stored([10], 3, TOKENS[3:7])) == 0
    assert table.stats().broken_chain_events == 2
