"""The simulator's `--block-hash sha256_cbor`: vLLM v1's block hash, checked against the
CBOR RFC's examples and an independent computation with cbor2 (the library vLLM uses)."""

from __future__ import annotations

import hashlib

import pytest

from simulator import cbor
from simulator.block_hash import VllmBlockHasher

RFC_8949_EXAMPLES = [
    (0, "00"), (23, "17"), (24, "1818"), (100, "1864"), (1000, "1903e8"),
    (1_000_000, "1a000f4240"), (1_000_000_000_000, "1b000000e8d4a51000"),
    (18446744073709551615, "1bffffffffffffffff"), (-1, "20"), (-100, "3863"),
    (-1000, "3903e7"), (b"", "40"), (b"\x01\x02\x03\x04", "4401020304"), ("", "60"),
    ("a", "6161"), ("IETF", "6449455446"), ("\u00fc", "62c3bc"), ([], "80"),
    ([1, 2, 3], "83010203"), ([1, [2, 3], [4, 5]], "8301820203820405"), (None, "f6"),
]  # fmt: skip


@pytest.mark.parametrize(("value", "expected"), RFC_8949_EXAMPLES)
def test_cbor_matches_the_rfc_examples(value: object, expected: str) -> None:
    assert cbor.dumps(value).hex() == expected


def test_block_hashes_equal_an_independent_sha256_cbor() -> None:
    cbor2 = pytest.importorskip("cbor2")

    def sha256_cbor(value: object) -> bytes:  # vLLM's vllm.utils.hashing.sha256_cbor
        return hashlib.sha256(cbor2.dumps(value, canonical=True)).digest()

    tokens = list(range(1000, 1000 + 3 * 16 + 5))
    hasher = VllmBlockHasher(16, seed=0)
    parent = sha256_cbor("0")  # NONE_HASH with PYTHONHASHSEED=0
    expected = []
    for block in range(3):
        parent = sha256_cbor((parent, tuple(tokens[block * 16 : (block + 1) * 16]), None))
        expected.append(parent)
    assert hasher.chain(tokens) == expected
    assert hasher.digest(expected[0], tokens[16:32]) == expected[1]
