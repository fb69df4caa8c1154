"""IndexConfig: its defaults and invariants. Reading it from the environment is the
gateway's (tests/gateway/test_settings.py)."""

from __future__ import annotations

import pytest

from indexer import DEFAULT_HASH_SEED, IndexConfig, IndexLimits, InvalidIndexConfig


def test_defaults() -> None:
    config = IndexConfig()
    assert config.block_size == 16
    assert config.hash_seed == DEFAULT_HASH_SEED
    assert config.limits == IndexLimits()


@pytest.mark.parametrize(
    ("build", "name"),
    [
        (lambda: IndexLimits(max_contexts=0), "max_contexts"),
        (lambda: IndexLimits(expected_ttl_s=-1.0), "expected_ttl_s"),
        (lambda: IndexConfig(block_size=0), "block_size"),
        (lambda: IndexConfig(hash_seed=2**64), "hash_seed"),
    ],
)
def test_invariants_are_checked(build: object, name: str) -> None:
    with pytest.raises(InvalidIndexConfig, match=name):
        build()  # type: ignore[operator]
