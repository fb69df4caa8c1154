"""Settings.load: environment names, flags, validation, the KV-sync dependency rule."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.settings import DEFAULT_TIER_WEIGHTS, Settings, setting_names, unread_variables
from indexer import IndexConfig, IndexLimits, Tier


def test_defaults_from_an_empty_environment() -> None:
    settings = Settings.load({})
    assert settings == Settings()
    assert settings.port == 8080
    assert settings.pods_file is None
    assert settings.default_policy == "prefix-cache"
    assert settings.use_remote_tokenizer and settings.kv_event_sync and settings.prefix_routing
    assert settings.tier_weights == DEFAULT_TIER_WEIGHTS
    assert settings.index == IndexConfig()


def test_default_tier_weights_match_the_design() -> None:
    assert DEFAULT_TIER_WEIGHTS == {
        Tier.GPU: 1.0,
        Tier.CPU: 0.8,
        Tier.STORAGE: 0.25,
        Tier.EXPECTED: 0.9,
    }


def test_aibrix_names_are_read() -> None:
    settings = Settings.load(
        {
            "AIBRIX_USE_REMOTE_TOKENIZER": "true",
            "AIBRIX_KV_EVENT_SYNC_ENABLED": "false",
            "AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE": "remote",
            "AIBRIX_REMOTE_TOKENIZER_ENGINE": "sglang",
            "AIBRIX_REMOTE_TOKENIZER_ENDPOINT": "http://tok.example:8000/",
            "AIBRIX_REMOTE_TOKENIZER_TIMEOUT": "500ms",
            "AIBRIX_REMOTE_TOKENIZER_MAX_RETRIES": "0",
            "AIBRIX_PREFIX_CACHE_BLOCK_SIZE": "32",
            "AIBRIX_SYNC_MAX_CONTEXTS": "7",
            "AIBRIX_SYNC_EVICTION_DURATION_MINUTES": "2",
        }
    )
    assert settings.use_remote_tokenizer is True
    assert settings.kv_event_sync is False
    assert settings.tokenizer_engine == "sglang"
    assert settings.tokenizer_endpoint == "http://tok.example:8000"  # trailing slash dropped
    assert settings.tokenizer_timeout_s == pytest.approx(0.5)
    assert settings.tokenizer_max_retries == 0
    assert settings.index.block_size == 32
    assert settings.index.limits.max_contexts == 7
    assert settings.index.limits.eviction_duration_s == pytest.approx(120.0)


def test_kvgate_names_are_read(tmp_path: Path) -> None:
    pods = tmp_path / "pods.toml"
    settings = Settings.load(
        {
            "KVGATE_HOST": "0.0.0.0",
            "KVGATE_PORT": "9000",
            "KVGATE_PODS_FILE": str(pods),
            "KVGATE_DEFAULT_POLICY": "round-robin",
            "KVGATE_TOKENIZER_CACHE_SIZE": "0",
            "KVGATE_ADMIN_TOKEN": "secret",
            "KVGATE_MAX_BODY_BYTES": "1024",
            "KVGATE_UPSTREAM_CONNECT_TIMEOUT": "250ms",
            "KVGATE_UPSTREAM_TIMEOUT": "1m",
            "KVGATE_SCRAPE_INTERVAL": "2.5",
            "KVGATE_DRAIN_TIMEOUT": "30s",
            "KVGATE_MAX_CONNECTIONS_PER_POD": "8",
            "KVGATE_UNHEALTHY_AFTER": "5",
            "KVGATE_SESSION_HEADER": "X-My-Session",
            "KVGATE_HOT_SPOT_MARGIN": "4",
            "KVGATE_GC_GEN0_THRESHOLD": "0",
            "KVGATE_HASH_SEED": "0x10",
        }
    )
    assert settings.host == "0.0.0.0"
    assert settings.port == 9000
    assert settings.pods_file == pods
    assert settings.default_policy == "round-robin"
    assert settings.tokenizer_cache_size == 0
    assert settings.admin_token == "secret"
    assert settings.max_body_bytes == 1024
    assert settings.upstream_connect_timeout_s == pytest.approx(0.25)
    assert settings.upstream_timeout_s == pytest.approx(60.0)
    assert settings.scrape_interval_s == pytest.approx(2.5)
    assert settings.drain_timeout_s == pytest.approx(30.0)
    assert settings.max_connections_per_pod == 8
    assert settings.unhealthy_after == 5
    assert settings.session_header == "x-my-session"  # header names are case-insensitive
    assert settings.hot_spot_margin == 4
    assert settings.gc_gen0_threshold == 0
    assert settings.index.hash_seed == 16


def test_blank_values_count_as_unset() -> None:
    settings = Settings.load(
        {"KVGATE_PORT": "  ", "KVGATE_ADMIN_TOKEN": "", "AIBRIX_REMOTE_TOKENIZER_TIMEOUT": ""}
    )
    assert settings.port == 8080
    assert settings.admin_token is None
    assert settings.tokenizer_timeout_s == 2.0


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("yes", True), ("ON", True), ("True", True), ("0", False), ("off", False)],
)
def test_boolean_spellings(raw: str, expected: bool) -> None:
    settings = Settings.load({"AIBRIX_USE_REMOTE_TOKENIZER": raw})
    assert settings.use_remote_tokenizer is expected


@pytest.mark.parametrize(
    ("raw", "seconds"),
    [("500ms", 0.5), ("30s", 30.0), ("1m", 60.0), ("1h", 3600.0), ("2.5", 2.5), ("0.5s", 0.5),
     # Go's time.ParseDuration forms (AIBrix's gateway is written in Go)
     ("1m30s", 90.0), ("2h", 7200.0), ("1h2m3.5s", 3723.5), ("1.5h", 5400.0), ("1s500ms", 1.5),
     ("250us", 0.00025), ("1500000ns", 0.0015), (".5s", 0.5), ("45", 45.0)],
)  # fmt: skip
def test_durations(raw: str, seconds: float) -> None:
    assert Settings.load({"KVGATE_SCRAPE_INTERVAL": raw}).scrape_interval_s == pytest.approx(
        seconds
    )


@pytest.mark.parametrize(
    "raw",
    ["0", "0ms", "-1s", "1x", "ms", "1.5.2", "1 m", "1e3", "fast", "1m30", "1m 30s", "0h0m",
     "m5", "1m-30s", "inf", "nan", "1d"],
)  # fmt: skip
def test_invalid_durations_name_variable_value_and_allowed(raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load({"AIBRIX_REMOTE_TOKENIZER_TIMEOUT": raw})
    error = caught.value
    assert error.variable == "AIBRIX_REMOTE_TOKENIZER_TIMEOUT"
    assert error.value == raw
    assert "500ms" in error.allowed
    assert "AIBRIX_REMOTE_TOKENIZER_TIMEOUT" in str(error)
    assert repr(raw) in str(error)


def test_tier_weights_override_only_the_tiers_given() -> None:
    settings = Settings.load({"KVGATE_TIER_WEIGHTS": " cpu=0.5 , Storage=0.1"})
    assert settings.tier_weights == {
        Tier.GPU: 1.0,
        Tier.CPU: 0.5,
        Tier.STORAGE: 0.1,
        Tier.EXPECTED: 0.9,
    }
    # The defaults themselves are not mutated by a load.
    assert DEFAULT_TIER_WEIGHTS[Tier.CPU] == 0.8
    assert Settings.load({}).tier_weights[Tier.CPU] == 0.8


@pytest.mark.parametrize(
    "raw", ["CPU=2", "CPU=-0.1", "TPU=0.5", "CPU", "CPU=abc", "CPU=nan", "CPU=0.5,", "=0.5"]
)
def test_invalid_tier_weights(raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load({"KVGATE_TIER_WEIGHTS": raw})
    assert caught.value.variable == "KVGATE_TIER_WEIGHTS"
    assert caught.value.value == raw
    assert "GPU, CPU, STORAGE, EXPECTED" in caught.value.allowed


@pytest.mark.parametrize(
    ("variable", "raw", "allowed"),
    [
        ("KVGATE_PORT", "0", "1..65535"),
        ("KVGATE_PORT", "70000", "1..65535"),
        ("KVGATE_PORT", "http", "1..65535"),
        ("KVGATE_DEFAULT_POLICY", "fastest", "prefix-cache, predicted-latency"),
        ("AIBRIX_USE_REMOTE_TOKENIZER", "maybe", "true or false"),
        ("AIBRIX_KV_EVENT_SYNC_ENABLED", "2", "true or false"),
        ("AIBRIX_PREFIX_CACHE_TOKENIZER_TYPE", "local", "remote"),
        ("AIBRIX_REMOTE_TOKENIZER_ENGINE", "tgi", "vllm, sglang"),
        ("AIBRIX_REMOTE_TOKENIZER_ENDPOINT", "tok:8000", "http(s)://"),
        ("AIBRIX_REMOTE_TOKENIZER_MAX_RETRIES", "-1", "0..10"),
        ("AIBRIX_REMOTE_TOKENIZER_MAX_RETRIES", "1000000", "0..10"),
        ("KVGATE_TOKENIZER_CACHE_SIZE", "many", "0..2147483647"),
        ("KVGATE_MAX_BODY_BYTES", "0", "1..2147483647"),
        ("KVGATE_MAX_BODY_BYTES", "9" * 40, "1..2147483647"),
        ("KVGATE_MAX_CONNECTIONS_PER_POD", "1.5", "1..2147483647"),
        ("KVGATE_UNHEALTHY_AFTER", "0", "1..2147483647"),
        ("KVGATE_SESSION_HEADER", "x session", "header name"),
        ("KVGATE_HOT_SPOT_MARGIN", "-3", "1..2147483647"),
        ("KVGATE_COST_PRIOR_SCALE", "0", "(0, 1000]"),
        ("KVGATE_COST_PRIOR_SCALE", "1e308", "(0, 1000]"),
        ("KVGATE_COST_PRIOR_SCALE", "nan", "(0, 1000]"),
        ("KVGATE_COST_CONTEXT_SHARE", "-1e-5", "[0, 0.01]"),
        ("KVGATE_COST_CONTEXT_SHARE", "inf", "[0, 0.01]"),
        ("KVGATE_GC_GEN0_THRESHOLD", "-1", "0..2147483647"),
        ("KVGATE_GC_GEN0_THRESHOLD", "2147483648", "0..2147483647"),
        ("KVGATE_DRAIN_TIMEOUT", "9" * 309, "7 days"),  # as a float: inf
        ("KVGATE_UPSTREAM_TIMEOUT", "169h", "7 days"),
        ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "0", "1..2147483647"),
        ("AIBRIX_SYNC_MAX_CONTEXTS", "none", "1..2147483647"),
        ("AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS", "1e400", "(0, 604800]"),
        ("AIBRIX_SYNC_EVICTION_DURATION_MINUTES", "nan", "(0, 10080]"),
        ("KVGATE_INDEX_EXPECTED_TTL_SECONDS", "-inf", "(0, 604800]"),
        ("KVGATE_HASH_SEED", "-5", "64-bit"),
    ],
)
def test_invalid_values_name_variable_value_and_allowed(
    variable: str, raw: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load({variable: raw})
    error = caught.value
    assert error.variable == variable
    assert error.value == raw
    assert allowed in error.allowed
    message = str(error)
    assert variable in message
    assert repr(raw) in message
    assert allowed in message


def test_flags_win_over_the_environment() -> None:
    env = {"KVGATE_PORT": "9000", "KVGATE_DEFAULT_POLICY": "random", "KVGATE_HOST": "::1"}
    settings = Settings.load(env, {"port": 9100, "default_policy": "session", "host": None})
    assert settings.port == 9100
    assert settings.default_policy == "session"
    assert settings.host == "::1"  # None: the flag was not given


def test_an_invalid_flag_is_rejected_like_the_variable() -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load({}, {"default_policy": "fastest"})
    assert caught.value.variable == "KVGATE_DEFAULT_POLICY"
    assert caught.value.value == "fastest"
    with pytest.raises(ConfigError, match="KVGATE_PORT"):
        Settings.load({}, {"port": 0})


def test_kv_sync_without_remote_tokenizer_is_disabled_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    env = {"AIBRIX_USE_REMOTE_TOKENIZER": "false", "AIBRIX_KV_EVENT_SYNC_ENABLED": "true"}
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        settings = Settings.load(env)
    assert settings.use_remote_tokenizer is False
    assert settings.kv_event_sync is False
    assert settings.prefix_routing is False
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "AIBRIX_KV_EVENT_SYNC_ENABLED" in warnings[0].getMessage()
    assert "AIBRIX_USE_REMOTE_TOKENIZER" in warnings[0].getMessage()


def test_the_dependency_rule_also_applies_to_flags(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        settings = Settings.load({}, {"use_remote_tokenizer": False})
    assert settings.kv_event_sync is False
    assert any("KV event sync is disabled" in r.getMessage() for r in caplog.records)


def test_no_warning_when_both_are_off_or_both_on(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="gateway.settings"):
        off = Settings.load(
            {"AIBRIX_USE_REMOTE_TOKENIZER": "0", "AIBRIX_KV_EVENT_SYNC_ENABLED": "0"}
        )
        on = Settings.load({})
    assert (off.use_remote_tokenizer, off.kv_event_sync) == (False, False)
    assert (on.use_remote_tokenizer, on.kv_event_sync) == (True, True)
    assert not caplog.records


def test_remote_tokenizer_without_kv_sync_is_kept() -> None:
    settings = Settings.load({"AIBRIX_KV_EVENT_SYNC_ENABLED": "false"})
    assert settings.use_remote_tokenizer is True
    assert settings.kv_event_sync is False
    assert settings.prefix_routing is True


def test_direct_construction_validates_too() -> None:
    with pytest.raises(ConfigError, match="KVGATE_DEFAULT_POLICY"):
        Settings(default_policy="nope")
    with pytest.raises(ConfigError, match="KVGATE_PORT"):
        Settings(port=65536)


def test_log_settings() -> None:
    assert Settings.load({}).log_format == "text"
    assert Settings.load({}).access_log is True
    settings = Settings.load({"KVGATE_LOG_FORMAT": "json", "KVGATE_ACCESS_LOG": "false"})
    assert settings.log_format == "json"
    assert settings.access_log is False
    with pytest.raises(ConfigError) as caught:
        Settings.load({"KVGATE_LOG_FORMAT": "xml"})
    assert caught.value.variable == "KVGATE_LOG_FORMAT"
    assert "json" in caught.value.allowed


def test_index_settings_are_read_under_the_seed_design_names() -> None:
    settings = Settings.load(
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
    assert settings.index.block_size == 32
    assert settings.index.hash_seed == 255
    assert settings.index.limits == IndexLimits(
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
        ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "²"),
        ("AIBRIX_SYNC_MAX_CONTEXTS", "-1"),
        ("AIBRIX_SYNC_MAX_PREFIXES_PER_CONTEXT", "1.5"),
        ("AIBRIX_SYNC_EVICTION_INTERVAL_SECONDS", "soon"),
        ("AIBRIX_SYNC_EVICTION_DURATION_MINUTES", "0"),
        ("KVGATE_INDEX_EXPECTED_TTL_SECONDS", "inf"),
        ("KVGATE_HASH_SEED", "-3"),
        ("KVGATE_HASH_SEED", str(2**64)),
        ("KVGATE_GC_GEN0_THRESHOLD", "lots"),
        ("KVGATE_MAX_BODY_BYTES", "1_000"),
    ],
)
def test_invalid_values_name_the_variable_and_the_value(variable: str, value: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load({variable: value})
    assert caught.value.variable == variable
    assert variable in str(caught.value)
    assert repr(value) in str(caught.value)
    assert "expected" in str(caught.value)


def test_aibrix_aliases_are_read_and_the_kvgate_name_wins() -> None:
    settings = Settings.load(
        {
            "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "false",
            "AIBRIX_PREFIX_CACHE_USE_REMOTE_TOKENIZER": "true",
            "AIBRIX_PREFIX_CACHE_REMOTE_TOKENIZER_ENDPOINT": "http://tok:8000",
            "AIBRIX_TOKENIZER_REQUEST_TIMEOUT": "5s",
            "AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT": "8",
            "ROUTING_ALGORITHM": "prefix-cache-and-load",
        }
    )
    assert settings.kv_event_sync is False
    assert settings.tokenizer_endpoint == "http://tok:8000"
    assert settings.tokenizer_timeout_s == 5.0
    assert settings.hot_spot_margin == 8
    assert settings.default_policy == "prefix-share"
    both = Settings.load(
        {"KVGATE_HOT_SPOT_MARGIN": "4", "AIBRIX_LOAD_BALANCE_IMBALANCE_MIN_GAP": "9"}
    )
    assert both.hot_spot_margin == 4
    with pytest.raises(ConfigError) as caught:
        Settings.load({"ROUTING_ALGORITHM": "throughput"})
    assert caught.value.variable == "ROUTING_ALGORITHM"
    assert "prefix-cache-and-load" in caught.value.allowed


def test_every_name_read_is_known_and_nothing_else_is() -> None:
    names = setting_names()
    assert len(names) == len(set(names))
    assert {"KVGATE_PORT", "AIBRIX_SYNC_MAX_CONTEXTS", "ROUTING_ALGORITHM"} <= set(names)
    env = {"KVGATE_PROT": "1", "AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR": "2",
           "AIBRIX_PREFIX_CACHE_KV_EVENT_SYNC_ENABLED": "true", "HOME": "/root"}  # fmt: skip
    assert unread_variables(env) == ["AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR", "KVGATE_PROT"]
