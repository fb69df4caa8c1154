from __future__ import annotations

import pytest

from indexer import DEFAULT_HASH_SEED, ConfigError, IndexConfig, IndexLimits


def test_defaults_without_environment() -> None:
    config = IndexConfig.from_env({})
    assert config == IndexConfig()
    assert config.block_size == 16
    assert config.hash_seed == DEFAULT_HASH_SEED


def test_reads_the_seed_design_names() -> None:
    config = IndexConfig.from_env(
        {
            "AIBRIX_PREFIX_CACHE_BLOCK_SIZE": "32",
            "AIBRIX_SYNC_MAX_CONTEXTS": "10",
            "AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT": "5000",
            "AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS": "15",
            "AIBRIX_SYNC_EVICTION_DURATION_MINUTES": "2.5",
            "KVGATE_HASH_SEED": "0xff",
            "KVGATE_INDEX_EXPECTED_TTL_SECONDS": "3",
            "UNRELATED": "x",
        }
    )
    assert config.block_size == 32
    assert config.hash_seed == 255
    assert config.limits == IndexLimits(
        max_contexts=10,
        max_prefixes_per_context=5000,
        eviction_interval_s=15.0,
        eviction_duration_s=150.0,
        expected_ttl_s=3.0,
    )


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "0"),
        ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "sixteen"),
        ("AIBRIX_SYNC_MAX_CONTEXTS", "-1"),
        ("AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT", "1.5"),
        ("AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS", "soon"),
        ("AIBRIX_SYNC_EVICTION_DURATION_MINUTES", "0"),
        ("KVGATE_HASH_SEED", "-3"),
        ("KVGATE_HASH_SEED", str(2**64)),
    ],
)
def test_invalid_values_name_the_variable_and_the_value(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        IndexConfig.from_env({variable: value})
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert repr(value) in str(caught.value)
    assert "expected" in str(caught.value)


def test_limits_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="max_contexts"):
        IndexLimits(max_contexts=0)
