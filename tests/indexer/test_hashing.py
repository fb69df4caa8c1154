from __future__ import annotations

import sys
from array import array

import pytest
import xxhash

from indexer import DEFAULT_HASH_SEED, PrefixHasher
from indexer.hashing import HASH_VERSION


def test_known_values_are_stable_across_releases() -> None:
    # Pinned: replicas, restarts and snapshots all depend on these never changing. A new
    # definition (here: version 2, the parent hash as xxh64 seed) bumps HASH_VERSION,
    # which is the snapshot format's version.
    assert HASH_VERSION == 2
    assert PrefixHasher(4).prefix_hashes([1, 2, 3, 4, 5, 6, 7, 8, 9]) == [
        10521120115778031399,
        12324536265490946305,
    ]
    assert PrefixHasher(4, seed=1).prefix_hashes([1, 2, 3, 4]) == [882127866422523387]
    assert sys.byteorder == "little" and PrefixHasher(4, seed=1).prefix_hashes([1, 2, 3, 4]) == [
        xxhash.xxh64_intdigest(array("I", [1, 2, 3, 4]).tobytes(), 1)
    ]


def test_only_full_blocks_are_hashed() -> None:
    hasher = PrefixHasher(16)
    assert hasher.prefix_hashes(list(range(15))) == []
    assert len(hasher.prefix_hashes(list(range(16)))) == 1
    assert len(hasher.prefix_hashes(list(range(47)))) == 2


def test_hashes_are_chained_so_equal_blocks_at_other_positions_differ() -> None:
    hasher = PrefixHasher(2)
    first, second = hasher.prefix_hashes([7, 7, 7, 7])
    assert first != second


def test_shared_prefix_gives_shared_hashes() -> None:
    hasher = PrefixHasher(4)
    a = hasher.prefix_hashes(list(range(12)) + [100, 101, 102, 103])
    b = hasher.prefix_hashes(list(range(12)) + [200, 201, 202, 203])
    assert a[:3] == b[:3]
    assert a[3] != b[3]


def test_chain_continues_from_a_parent() -> None:
    hasher = PrefixHasher(4)
    whole = hasher.prefix_hashes(list(range(12)))
    assert hasher.chain(whole[0], list(range(4, 12))) == whole[1:]


def test_seed_changes_every_hash_and_defaults_to_a_constant() -> None:
    tokens = list(range(32))
    assert PrefixHasher(8).seed == DEFAULT_HASH_SEED
    assert PrefixHasher(8).prefix_hashes(tokens) == PrefixHasher(8).prefix_hashes(tokens)
    assert set(PrefixHasher(8, seed=1).prefix_hashes(tokens)).isdisjoint(
        PrefixHasher(8, seed=2).prefix_hashes(tokens)
    )


def test_accepts_any_int_sequence() -> None:
    hasher = PrefixHasher(4)
    assert hasher.prefix_hashes((1, 2, 3, 4)) == hasher.prefix_hashes([1, 2, 3, 4])


@pytest.mark.parametrize("bad", [[-1, 2, 3, 4], [2**32, 0, 0, 0], ["a", 1, 2, 3]])
def test_rejects_tokens_that_are_not_uint32(bad: list[object]) -> None:
    with pytest.raises(ValueError, match="token ids"):
        PrefixHasher(4).prefix_hashes(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(("block_size", "seed"), [(0, 1), (4, -1), (4, 2**64)])
def test_rejects_bad_configuration(block_size: int, seed: int) -> None:
    with pytest.raises(ValueError):
        PrefixHasher(block_size, seed)
