"""Index snapshots: the file format round-trips and detects damage; a pod exported,
written, read and restored into another table is the same pod there — for matches, for
the engine hashes it holds, and for every event that follows (children chain on)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from indexer import (
    ModelContext,
    PodSnapshot,
    SnapshotError,
    SyncPrefixHashTable,
    Tier,
    decode_snapshot,
    encode_snapshot,
)
from indexer.snapshot import HEADER_BYTES, EntryGroup, PartialRecord, PodIndexState
from tests.helpers import FakeClock
from tests.indexer.conftest import Stored, make_table

# -- the file format -----------------------------------------------------------------------

u64 = st.integers(min_value=0, max_value=2**64 - 1)
engine_hash = st.one_of(
    st.integers(min_value=-(2**63), max_value=2**64 - 1), st.binary(min_size=1, max_size=64)
)
tiers = st.sampled_from([Tier.GPU, Tier.CPU, Tier.STORAGE])
records = st.tuples(engine_hash, st.lists(u64, min_size=1, max_size=4).map(tuple), u64)
groups = st.builds(
    EntryGroup,
    tiers,
    st.none() | st.text(max_size=12),
    st.lists(records, max_size=6).map(tuple),
)
partials = st.builds(
    PartialRecord,
    tiers,
    engine_hash,
    u64,
    st.lists(st.integers(0, 2**32 - 1), max_size=8).map(tuple),
    u64,
)
snapshots = st.builds(
    PodSnapshot,
    pod=st.text(min_size=1, max_size=20),
    model=st.text(max_size=20),
    endpoint=st.text(max_size=30),
    seq=u64,
    digest=u64,
    whole=st.booleans(),
    block_size=st.integers(1, 1024),
    hash_seed=u64,
    created_at=st.floats(allow_nan=False, allow_infinity=False),
    index=st.builds(
        PodIndexState,
        st.lists(groups, max_size=4).map(tuple),
        st.lists(partials, max_size=4).map(tuple),
    ),
)


@given(snapshots)
def test_a_snapshot_round_trips(snapshot: PodSnapshot) -> None:
    assert decode_snapshot(encode_snapshot(snapshot)) == snapshot


@settings(max_examples=20, deadline=None)
@given(snapshot=snapshots, created_at=st.sampled_from([float("nan"), float("inf"), -1e400]))
def test_a_creation_time_that_is_not_finite_is_refused(
    snapshot: PodSnapshot, created_at: float
) -> None:
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(encode_snapshot(dataclasses.replace(snapshot, created_at=created_at)))
    assert caught.value.reason == "malformed"


@given(snapshots, st.data())
def test_a_truncated_file_is_detected(snapshot: PodSnapshot, data: st.DataObject) -> None:
    raw = encode_snapshot(snapshot)
    cut = data.draw(st.integers(0, len(raw) - 1))
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(raw[:cut])
    assert caught.value.reason == "truncated"


DAMAGE = {"bad_magic", "unsupported_version", "truncated", "malformed", "checksum"}


@given(snapshots, st.data())
def test_any_flipped_bit_is_detected(snapshot: PodSnapshot, data: st.DataObject) -> None:
    raw = bytearray(encode_snapshot(snapshot))
    position = data.draw(st.integers(0, len(raw) - 1))
    raw[position] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(bytes(raw))
    assert caught.value.reason in DAMAGE


@given(snapshots, st.binary(min_size=1, max_size=16))
def test_trailing_bytes_are_detected(snapshot: PodSnapshot, extra: bytes) -> None:
    with pytest.raises(SnapshotError):
        decode_snapshot(encode_snapshot(snapshot) + extra)


@given(st.binary(max_size=200))
def test_random_bytes_are_never_a_snapshot(raw: bytes) -> None:
    with pytest.raises(SnapshotError):
        decode_snapshot(raw)


def test_a_snapshot_over_the_limit_is_refused_before_parsing() -> None:
    raw = encode_snapshot(_empty_snapshot())
    assert decode_snapshot(raw, max_bytes=len(raw)).pod == "p"
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(raw, max_bytes=len(raw) - 1)
    assert caught.value.reason == "too_large"


def test_a_body_with_a_valid_checksum_but_wrong_shape_is_malformed() -> None:
    import msgpack
    import xxhash

    body = msgpack.packb({"pod": "p", "groups": "not a list"})
    head = encode_snapshot(_empty_snapshot())[:HEADER_BYTES]
    head = head[:12] + len(body).to_bytes(8, "little")
    raw = head + xxhash.xxh64_intdigest(head + body).to_bytes(8, "little") + body
    with pytest.raises(SnapshotError) as caught:
        decode_snapshot(raw)
    assert caught.value.reason == "malformed"


def _empty_snapshot() -> PodSnapshot:
    return PodSnapshot("p", "m", "tcp://x:1", 3, 4, True, 16, 5, 0.0, PodIndexState())


# -- export and restore through the file format ----------------------------------------------

GATEWAY_BLOCK = 2
# Engine block size per pod: equal to the gateway's, a multiple of it, smaller (partials).
POD_BLOCKS = {"p0": 2, "p1": 4, "p2": 1}
MEDIA = ("GPU", "CPU", "DISK", None)
tokens = st.integers(0, 2)  # a tiny alphabet: pods share prefixes often


@st.composite
def event_lists(draw: st.DrawFn, size: int = 40) -> list[tuple[Any, ...]]:
    events: list[tuple[Any, ...]] = []
    for _ in range(draw(st.integers(0, size))):
        pod = draw(st.sampled_from(sorted(POD_BLOCKS)))
        kind = draw(st.sampled_from(["stored"] * 5 + ["again", "removed", "removed", "cleared"]))
        earlier = [event for event in events if event[0] == pod and isinstance(event[1], Stored)]
        if kind == "again" and earlier:  # the engine stores a block again: another copy
            events.append(draw(st.sampled_from(earlier)))
        elif kind == "stored":
            count = draw(st.integers(1, 3))
            block = POD_BLOCKS[pod]
            stored = Stored(
                block_hashes=draw(st.lists(st.integers(0, 15), min_size=count, max_size=count)),
                parent_block_hash=draw(st.none() | st.integers(0, 15)),
                token_ids=draw(st.lists(tokens, min_size=count * block, max_size=count * block)),
                block_size=block,
                lora_name=draw(st.sampled_from([None, None, "ad"])),
                medium=draw(st.sampled_from(MEDIA)),
            )
            events.append((pod, stored))
        elif kind == "removed":
            hashes = draw(st.lists(st.integers(0, 15), max_size=3))
            events.append((pod, "removed", hashes, draw(st.sampled_from(MEDIA))))
        else:
            events.append((pod, "cleared"))
    return events


def apply(table: SyncPrefixHashTable, events: Sequence[tuple[Any, ...]]) -> None:
    for event in events:
        pod = event[0]
        if isinstance(event[1], Stored):
            table.apply_stored(pod, event[1])
        elif event[1] == "removed":
            table.apply_removed(pod, event[2], event[3])
        else:
            table.apply_cleared(pod)


def fresh_table(clock: FakeClock) -> SyncPrefixHashTable:
    table = make_table(clock, block_size=GATEWAY_BLOCK)
    for pod in POD_BLOCKS:
        table.register_pod(pod, "m")
    return table


def view(table: SyncPrefixHashTable, prompts: Sequence[Sequence[int]]) -> dict[str, Any]:
    """Everything observable: engine hashes per tier, matches with tiers, pair counts."""
    matches = []
    for lora in (None, "ad"):
        for prompt in prompts:
            result = table.match(ModelContext("m", lora), table.prefix_hashes(prompt), POD_BLOCKS)
            matches.append(
                (dict(result.blocks), {pod: result.tiers(pod) for pod in sorted(POD_BLOCKS)})
            )
    stats = table.stats()
    return {
        "tiers": {pod: table.dump_tiers(pod) for pod in POD_BLOCKS},
        "exported": {pod: exported(table, pod) for pod in POD_BLOCKS},
        "matches": matches,
        "counts": (stats.pairs, stats.engine_entries, stats.blocks),
    }


def exported(table: SyncPrefixHashTable, pod: str) -> set[tuple[Any, ...]]:
    """The pod's entries, copies included, whatever their order."""
    index = table.export_pod(pod)
    entries = {(g.tier, g.lora, *record) for g in index.groups for record in g.records}
    return entries | {dataclasses.astuple(p) for p in index.partials}


def snapshot_of(table: SyncPrefixHashTable, pod: str) -> PodSnapshot:
    config = table.config
    index = table.export_pod(pod)
    seed = config.hash_seed
    return PodSnapshot(pod, "m", "tcp://e", 7, 9, True, config.block_size, seed, 0.0, index)


prompts = st.lists(st.lists(st.integers(0, 2), max_size=8), min_size=1, max_size=6)


@settings(max_examples=150, deadline=None)
@given(event_lists(), event_lists(size=20), prompts)
def test_a_restored_table_equals_the_original_now_and_after_more_events(
    before: list[tuple[Any, ...]], after: list[tuple[Any, ...]], prompts: list[list[int]]
) -> None:
    clock = FakeClock()
    original = fresh_table(clock)
    apply(original, before)
    restored = fresh_table(clock)
    for pod in POD_BLOCKS:
        file = encode_snapshot(snapshot_of(original, pod))
        restored.restore_pod(pod, decode_snapshot(file).index)
    assert view(restored, prompts) == view(original, prompts)
    apply(original, after)
    apply(restored, after)
    assert view(restored, prompts) == view(original, prompts)


def test_restore_replaces_what_the_pod_held_and_keeps_other_pods(clock: FakeClock) -> None:
    table = fresh_table(clock)
    table.apply_stored("p0", Stored([1, 2], None, [0, 1, 2, 0], block_size=2))
    table.apply_stored("p1", Stored([7], None, [0, 1, 2, 0], block_size=4))
    saved = table.export_pod("p0")
    table.apply_stored("p0", Stored([3], 2, [1, 1], block_size=2))
    assert table.restore_pod("p0", saved) == 2
    assert table.dump("p0") == {1, 2}
    assert table.dump("p1") == {7}
    prompt = table.prefix_hashes([0, 1, 2, 0, 1, 1])
    assert table.match(ModelContext("m"), prompt, ["p0", "p1"]).blocks == {"p0": 2, "p1": 2}


def test_copies_survive_a_restore(clock: FakeClock) -> None:
    table = fresh_table(clock)
    stored = Stored([1], None, [0, 1], block_size=2)
    table.apply_stored("p0", stored)
    table.apply_stored("p0", stored)  # vLLM recomputed a block it held: two copies
    restored = fresh_table(clock)
    restored.restore_pod("p0", decode_snapshot(encode_snapshot(snapshot_of(table, "p0"))).index)
    restored.apply_removed("p0", [1])
    assert restored.dump("p0") == {1}
    restored.apply_removed("p0", [1])
    assert restored.dump("p0") == set()


def test_restore_respects_the_pod_limit(clock: FakeClock) -> None:
    from indexer import IndexLimits

    source = fresh_table(clock)
    source.apply_stored("p0", Stored([1, 2, 3], None, [0, 1, 2, 0, 1, 1], block_size=2))
    small = make_table(clock, block_size=GATEWAY_BLOCK, limits=IndexLimits(max_blocks_per_pod=2))
    small.register_pod("p0", "m")
    assert small.restore_pod("p0", source.export_pod("p0")) == 2
    assert small.rejected_blocks("p0") == {"pod_limit": 1}


def test_a_snapshot_of_an_older_hash_definition_is_refused_clearly() -> None:
    raw = bytearray(encode_snapshot(_empty_snapshot()))
    raw[8:10] = (1).to_bytes(2, "little")  # version 1: xxh64(parent ‖ tokens, seed)
    head = bytes(raw[:20])
    body = bytes(raw[HEADER_BYTES:])
    raw[20:28] = xxhash.xxh64_intdigest(head + body).to_bytes(8, "little")
    with pytest.raises(SnapshotError, match="another gateway hash definition") as caught:
        decode_snapshot(bytes(raw))
    assert caught.value.reason == "unsupported_version"
