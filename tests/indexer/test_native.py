"""The compiled primitives (indexer/_native.c) against the pure-Python path they replace.

Hashes, maps and whole tables are compared answer for answer. Everything else in
tests/indexer runs on both paths: scripts/test.sh runs the directory a second time with
KVGATE_PURE_PYTHON=1.
"""

from __future__ import annotations

import heapq
import random
import shutil
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.indexer_workload import build_fleet
from indexer import IndexConfig, IndexLimits, ModelContext, PrefixHasher, SyncPrefixHashTable
from indexer.native import (
    NATIVE_INTERFACE,
    PURE_PYTHON_ENV,
    Native,
    load_native,
    pure_python_forced,
)
from tests.helpers import FakeClock
from tests.indexer.conftest import Stored
from tests.indexer.native_build import NATIVE_BUILD_ENV, requested_build

NATIVE = load_native(pure=False)
needs_native = pytest.mark.skipif(NATIVE is None, reason="indexer._native is not built")


def _native() -> Native:
    assert NATIVE is not None
    return NATIVE


def test_the_extension_is_built_wherever_a_c_compiler_is() -> None:
    """The install compiles it when it can; a silently failed build would leave every
    figure in docs/benchmarks.md unreachable."""
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if shutil.which(compiler) is None:
        pytest.skip(f"no C compiler ({compiler}) on this machine: the pure path is the one")
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        pytest.skip("no Python headers on this machine: the pure path is the one")
    assert NATIVE is not None, "indexer._native failed to build: re-run scripts/bootstrap.sh"


def test_only_a_build_of_this_source_is_used() -> None:
    """The compiled module says which interface it implements; `load_native` uses it only
    when that is the one this source calls (a build left from an older source would be
    called with arguments it does not take: pure Python runs instead)."""
    try:
        from indexer import _native
    except ImportError:
        pytest.skip("indexer._native is not built")
    assert _native.INTERFACE == NATIVE_INTERFACE
    assert load_native(pure=False) is not None


def test_a_build_named_for_the_tests_is_the_one_they_run() -> None:
    """scripts/sanitize_native.sh runs this directory against its ASan/UBSan build of
    indexer/_native.c (tests/indexer/conftest.py imports it): the primitives every test
    calls come from that file, not from the installed extension."""
    build = requested_build()
    if build is None:
        pytest.skip(f"{NATIVE_BUILD_ENV} is not set: the installed extension is tested")
    assert NATIVE is not None
    module = getattr(NATIVE.chain, "__self__", None)
    assert Path(getattr(module, "__file__", "")) == build
    assert SyncPrefixHashTable().compiled


def test_kvgate_pure_python_forces_the_pure_path(monkeypatch: pytest.MonkeyPatch) -> None:
    for value, forced in (("1", True), ("true", True), ("ON", True), ("0", False), ("", False)):
        assert pure_python_forced({PURE_PYTHON_ENV: value}) is forced
    monkeypatch.setenv(PURE_PYTHON_ENV, "1")
    assert load_native() is None
    assert not SyncPrefixHashTable().compiled
    assert not PrefixHasher(16).compiled
    # The gateway's settings decide for its own table, whatever the process environment.
    assert SyncPrefixHashTable(IndexConfig(pure_python=True)).compiled is False
    if NATIVE is not None:
        assert SyncPrefixHashTable(IndexConfig(pure_python=False)).compiled
    monkeypatch.delenv(PURE_PYTHON_ENV)
    assert SyncPrefixHashTable().compiled is (NATIVE is not None)


# -- hashing ---------------------------------------------------------------------------


@needs_native
@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=200), seed=st.integers(min_value=0, max_value=2**64 - 1))
def test_xxh64_is_the_xxhash_packages(data: bytes, seed: int) -> None:
    from indexer import _native

    assert _native.xxh64(data, seed) == xxhash.xxh64_intdigest(data, seed)


@needs_native
@settings(max_examples=200, deadline=None)
@given(
    tokens=st.lists(st.integers(min_value=0, max_value=2**32 - 1), max_size=300),
    block_size=st.integers(min_value=1, max_value=40),
    parent=st.integers(min_value=0, max_value=2**64 - 1),
)
def test_chained_hashes_agree_bit_for_bit(tokens: list[int], block_size: int, parent: int) -> None:
    compiled = PrefixHasher(block_size, parent, pure_python=False)
    pure = PrefixHasher(block_size, parent, pure_python=True)
    assert compiled.compiled and not pure.compiled
    assert compiled.prefix_hashes(tokens) == pure.prefix_hashes(tokens)
    assert compiled.chain(parent, tuple(tokens), 3) == pure.chain(parent, tuple(tokens), 3)


@needs_native
@pytest.mark.parametrize(
    "tokens",
    [[1, 2, -1, 4], [1, 2, 2**32, 4], [1, 2.0, 3, 4], [1, "2", 3, 4], [1, None, 3, 4]],
)
def test_bad_token_ids_are_refused_alike(tokens: list[Any]) -> None:
    for pure_python in (False, True):
        with pytest.raises(ValueError, match="token ids"):
            PrefixHasher(2, pure_python=pure_python).prefix_hashes(tokens)
    # Tokens past the last full block are not hashed, so not checked either (both paths).
    for pure_python in (False, True):
        assert len(PrefixHasher(4, pure_python=pure_python).prefix_hashes([*range(4), -1])) == 1


# -- the map -----------------------------------------------------------------------------

keys = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=0, max_value=20),  # collisions and re-insertions
    st.integers(min_value=-5, max_value=-1),
    st.integers(min_value=2**64, max_value=2**64 + 3),
    st.binary(min_size=1, max_size=2),
)
values = st.one_of(
    st.integers(min_value=0, max_value=2**64 - 1),
    st.integers(min_value=2**64, max_value=2**70),
    st.tuples(st.integers(min_value=0, max_value=3)),
    st.none(),
    st.booleans(),
)
operations = st.lists(
    st.tuples(st.sampled_from(["set", "del", "pop", "get", "stamp", "clear"]), keys, values),
    max_size=400,
)


@needs_native
@settings(max_examples=150, deadline=None)
@given(ops=operations)
def test_the_map_behaves_as_a_dict(ops: list[tuple[str, Any, Any]]) -> None:
    """Same items in the same order after any sequence of operations: the compiled and
    pure tables then iterate, export and evict alike."""
    compiled = _native().map_type()
    stamps = compiled.stamps()
    model: dict[Any, Any] = {}
    stamped: dict[Any, float] = {}
    for step, (op, key, value) in enumerate(ops):
        if op == "set":
            if key not in model:
                stamped.pop(key, None)  # a new item's stamp is 0.0
            compiled[key] = value
            model[key] = value
        elif op == "del":
            stamped.pop(key, None)
            if key in model:
                del compiled[key]
                del model[key]
            else:
                with pytest.raises(KeyError):
                    del compiled[key]
        elif op == "pop":
            stamped.pop(key, None)
            assert compiled.pop(key, "absent") == model.pop(key, "absent")
        elif op == "get":
            assert compiled.get(key) == model.get(key)
            assert (key in compiled) is (key in model)
        elif op == "stamp" and type(key) is int and 0 <= key < 2**64:
            stamps[key] = float(step)
            model.setdefault(key, 0)  # a stamp on a new key adds it with the value 0
            stamped[key] = float(step)
        elif op == "clear":
            compiled.clear()
            model.clear()
            stamped.clear()
        assert len(compiled) == len(model)
    assert list(compiled.items()) == list(model.items())
    assert [type(v) for v in compiled.values()] == [type(v) for v in model.values()]
    for key in model:
        if type(key) is int and 0 <= key < 2**64:
            assert stamps[key] == stamped.get(key, 0.0)


@needs_native
def test_the_map_refuses_changes_while_iterated() -> None:
    compiled = _native().map_type()
    for key in range(10):
        compiled[key] = key
    with pytest.raises(RuntimeError, match="changed size during iteration"):
        for key in compiled:
            del compiled[key]


@needs_native
def test_the_oldest_blocks_go_first_and_a_chain_from_its_tail() -> None:
    """`oldest` is the pure store's `lru`: least recently used first, ties newest first."""
    compiled = _native().map_type()
    stamps = compiled.stamps()
    model: dict[int, float] = {}
    rng = random.Random(5)
    for key in rng.sample(range(10_000), 2_000):
        compiled[key] = 1
        stamps[key] = model[key] = float(rng.randrange(20))
    for key in rng.sample(sorted(model), 500):
        del compiled[key]
        del model[key]
    for count in (0, 1, 7, 300, 1_500, 5_000):
        expected = heapq.nsmallest(count, reversed(model.keys()), key=model.__getitem__)
        assert compiled.oldest(count) == expected


# -- whole tables ------------------------------------------------------------------------


def _tables(limits: IndexLimits) -> tuple[SyncPrefixHashTable, SyncPrefixHashTable, FakeClock]:
    clock = FakeClock()
    tables = tuple(
        SyncPrefixHashTable(IndexConfig(limits=limits, pure_python=pure), clock=clock)
        for pure in (False, True)
    )
    return tables[0], tables[1], clock


@needs_native
@pytest.mark.parametrize("pods", [6, 70])  # 70: pod bits past 64, masks wider than a u64
def test_both_paths_give_the_same_answers_on_a_fleet(pods: int) -> None:
    workload = build_fleet(
        pods=pods, blocks_per_pod=300, chain_blocks=32, system_blocks=(2, 8), seed=pods
    )
    # A cap well under the fleet's blocks: both trim, and must trim the same blocks.
    limits = IndexLimits(max_prefixes_per_context=1_000, max_blocks_per_pod=200)
    compiled, pure, clock = _tables(limits)
    assert compiled.compiled and not pure.compiled
    context = ModelContext("bench-model")
    rng = random.Random(pods)
    for table in (compiled, pure):
        for pod in workload.pods:
            table.register_pod(pod, "bench-model")
    # The pods' streams interleaved at random, each in its own order (chains stay whole).
    turns = [pod for pod in workload.pods for _ in workload.events[pod]]
    rng.shuffle(turns)
    queues = {pod: iter(workload.events[pod]) for pod in workload.pods}
    for step, pod in enumerate(turns):
        event = next(queues[pod])
        decoded = event.as_decoded()
        assert compiled.apply_stored(pod, decoded) == pure.apply_stored(pod, decoded)
        if step % 7 == 0:
            gone = list(event.block_hashes[-3:])
            assert compiled.apply_removed(pod, gone, "GPU") == pure.apply_removed(pod, gone, "GPU")
        if step % 5 == 0:
            _holder, tokens = rng.choice(workload.prompts)
            hashes = compiled.prefix_hashes(tokens)
            assert hashes == pure.prefix_hashes(tokens)
            candidates = rng.sample(workload.pods, min(len(workload.pods), 40))
            ours = compiled.match(context, hashes, candidates)
            theirs = pure.match(context, hashes, candidates)
            assert ours.lengths() == theirs.lengths()
            assert ours.has_tiers == theirs.has_tiers
            other = rng.choice(workload.pods)  # expected entries where it may hold none
            assert compiled.add_prefix(other, context, hashes[:4]) == pure.add_prefix(
                other, context, hashes[:4]
            )
        clock.advance(0.25)
    stats = compiled.stats()
    assert stats == pure.stats()
    assert stats.evicted_blocks and stats.expected  # trims and router-side entries ran
    for pod in workload.pods:
        assert compiled.dump(pod) == pure.dump(pod)
        assert compiled.export_pod(pod) == pure.export_pod(pod)
    compiled.evict()
    pure.evict()
    assert compiled.stats() == pure.stats()
    for pod in workload.pods[::2]:
        compiled.remove_pod(pod)
        pure.remove_pod(pod)
    assert compiled.stats() == pure.stats()


@needs_native
@pytest.mark.parametrize("seed", range(6))
def test_stores_and_removals_agree_on_both_paths_whatever_the_mix(seed: int) -> None:
    """The compiled store and removal loops take the common case (a GPU block of the
    pod's base model, new to it or held by it) and hand every other hash back to the
    Python loop, in order: unknown hashes, repeats within one event, bytes hashes, blocks
    also held offloaded, another copy of a block, a LoRA's blocks, an event given as a
    tuple. Both paths must agree on all of it."""
    rng = random.Random(seed)
    compiled, pure, clock = _tables(IndexLimits())
    block = compiled.config.block_size
    pods = ("p0", "p1", "p2")
    for table in (compiled, pure):
        for pod in pods:
            table.register_pod(pod, "m", lora_names={1: "adapter"})
    held: dict[str, list[int | bytes]] = {pod: [] for pod in pods}
    for step in range(400):
        pod = rng.choice(pods)
        mine = held[pod]
        if rng.random() < 0.55:
            # A short chain from the root; a few tokens so that pods share prefixes.
            count = rng.randint(1, 4)
            hashes: list[int | bytes] = [
                rng.randrange(2**64) if rng.random() < 0.8 else rng.randbytes(8)
                for _ in range(count)
            ]
            if mine and rng.random() < 0.2:
                hashes[0] = rng.choice(mine)  # stored again: another copy
            event = Stored(
                block_hashes=hashes,
                parent_block_hash=None,
                token_ids=[rng.randrange(3) for _ in range(count * block)],
                block_size=block,
                lora_id=1 if rng.random() < 0.1 else None,
                lora_name=None,
                medium=rng.choice(("GPU", "GPU", "GPU", "CPU")),
            )
            assert compiled.apply_stored(pod, event) == pure.apply_stored(pod, event)
            mine.extend(hashes)
        else:
            gone: list[int | bytes] = [
                rng.choice(mine) if mine and rng.random() < 0.8 else rng.randrange(2**64)
                for _ in range(rng.randint(1, 8))
            ]
            if gone and rng.random() < 0.3:
                gone.append(gone[0])  # a repeat within the event
            batch = tuple(gone) if step % 2 else gone
            medium = "GPU" if rng.random() < 0.85 else "CPU"
            assert compiled.apply_removed(pod, batch, medium) == pure.apply_removed(
                pod, batch, medium
            )
        clock.advance(0.1)
    assert compiled.stats() == pure.stats()
    for pod in pods:
        assert compiled.dump_tiers(pod) == pure.dump_tiers(pod)
        assert compiled.export_pod(pod) == pure.export_pod(pod)
        assert compiled.held_blocks(pod) == pure.held_blocks(pod)


@needs_native
def test_the_removal_run_refuses_what_it_cannot_read() -> None:
    release = _native().release_run
    entries, held = _native().map_type(), _native().map_type()
    entries[5] = 9
    held[9] = 0b11
    with pytest.raises(TypeError):
        release({}, held, [5], 0, 1, {})  # a dict is not a compiled map
    with pytest.raises(ValueError):
        release(entries, held, [5], 0, 2**64, {})  # a bit past 64: the Python loop's
    with pytest.raises(TypeError):
        release(entries, held, 5, 0, 1, {})  # type: ignore[arg-type]
    assert release(entries, held, ["x", 5], 0, 1, {}) == (0, 0, 0)  # "x": Python's to apply
    assert release(entries, held, ["x", 5], 1, 1, {9: [0, 0, 0, 0]}) == (1, 0, 0)  # tiered
    assert release(entries, held, ["x", 5, 7], 1, 1, {}) == (2, 1, 1)  # 7: unknown here
    assert (len(entries), held[9]) == (0, 0b10)


@needs_native
def test_the_store_run_refuses_what_it_cannot_read() -> None:
    store = _native().store_run
    entries, held = _native().map_type(), _native().map_type()
    held[9] = 0b10
    with pytest.raises(TypeError):
        store(entries, {}, [5], [9], 0, 1, {}, 0.0)  # a dict is not a compiled map
    with pytest.raises(TypeError):
        store(entries, held, [5], (9,), 0, 1, {}, 0.0)  # type: ignore[arg-type]  # chain gives a list
    with pytest.raises(ValueError):
        store(entries, held, [5], [9], 0, 2**64, {}, 0.0)  # a bit past 64: Python's
    assert store(entries, held, ["x", 5], [8, 9], 0, 1, {}, 1.0) == (0, 0)  # "x": Python's
    assert store(entries, held, [5, 6], [9, 9], 0, 1, {9: [0, 0, 0, 0]}, 1.0) == (0, 0)
    assert store(entries, held, [5, 6, 7], [9, 9, 10], 0, 1, {}, 2.0) == (1, 1)  # 6: held
    assert (dict(entries.items()), held[9], held.stamps()[9]) == ({5: 9}, 0b11, 2.0)
    assert store(entries, held, [5, 7], [9, 10], 0, 2, {}, 3.0) == (0, 0)  # 5: an entry
    assert store(entries, held, [5, 7], [9, 10], 1, 2, {}, 3.0) == (2, 1)
    assert (held[10], held.stamps()[10], list(held)) == (0b10, 3.0, [9, 10])
