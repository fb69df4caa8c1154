"""Malformed configuration and pods files: one clear error line naming the field, never a
traceback — for the settings, the pods file parser and `kvgate serve` itself."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.control.discovery import load_pods_file
from gateway.control.discovery.pods import parse_pods
from gateway.errors import ConfigError
from gateway.settings import Settings

# Every variable the settings read, found in their source so a variable added later is
# fuzzed too (Settings.load reads each with its own parser).
_SOURCES = ("gateway/settings.py", "indexer/config.py")
VARIABLES = tuple(
    sorted(
        {
            name
            for source in _SOURCES
            for name in re.findall(
                r'"((?:KVGATE|AIBRIX)_[A-Z0-9_]+)"',
                (Path(__file__).resolve().parents[2] / source).read_text(),
            )
        }
    )
)
HOSTILE_VALUES = st.one_of(
    st.text(max_size=30),
    st.sampled_from(
        ["-1", "0", "1e400", "nan", "inf", "²", "٣", "0x10", "1_0", "9" * 400, "1.5", "true",
         "yes\nno", "10 s", "ms", "-5ms", "GPU=2", "GPU=nan,CPU", "http://", "ftp://x"]
    ),
)  # fmt: skip
FUZZ = settings(max_examples=400, deadline=None, database=None)


def assert_one_clear_line(error: ConfigError, field: str) -> None:
    message = str(error)
    assert "\n" not in message and "\r" not in message
    assert message.startswith(field), (field, message)
    assert "expected" in message


def test_the_variables_were_found() -> None:
    assert {"KVGATE_MAX_CONCURRENT_REQUESTS", "KVGATE_PORT", "AIBRIX_PREFIX_CACHE_BLOCK_SIZE",
            "KVGATE_HASH_SEED"} <= set(VARIABLES)  # fmt: skip


def numbers(settings: Settings) -> list[float]:
    """Every numeric value the settings hold (the index's and its limits' included)."""
    found = []
    for holder in (settings, settings.index, settings.index.limits):
        for spec in dataclasses.fields(holder):
            value = getattr(holder, spec.name)
            if isinstance(value, int | float) and not isinstance(value, bool):
                found.append(float(value))
    found += [float(weight) for weight in settings.tier_weights.values()]
    return found


@FUZZ
@given(variable=st.sampled_from(VARIABLES), raw=HOSTILE_VALUES)
def test_any_environment_value_loads_or_names_its_variable(variable: str, raw: str) -> None:
    try:
        settings = Settings.load({variable: raw})
    except ConfigError as error:
        assert_one_clear_line(error, variable)
    else:  # what loads is finite and within its declared range ("9" * 400 is no duration)
        assert all(math.isfinite(value) and abs(value) < 2**64 for value in numbers(settings))


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("KVGATE_MAX_CONCURRENT_REQUESTS", "0"),
        ("KVGATE_MAX_CONCURRENT_REQUESTS", "many"),
        ("KVGATE_MAX_PROMPT_TOKENS", "-3"),
        ("KVGATE_MAX_HEADER_BYTES", "1k"),
        ("KVGATE_BODY_TIMEOUT", "0"),
        ("KVGATE_HEADER_TIMEOUT", "soon"),
        ("AIBRIX_PREFIX_CACHE_BLOCK_SIZE", "²"),
    ],
)
def test_invalid_limits_are_refused_by_name(variable: str, raw: str) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.load({variable: raw})
    assert_one_clear_line(caught.value, variable)


def test_limits_are_read() -> None:
    loaded = Settings.load(
        {
            "KVGATE_MAX_CONCURRENT_REQUESTS": "7",
            "KVGATE_MAX_PROMPT_TOKENS": "100",
            "KVGATE_MAX_HEADER_BYTES": "4096",
            "KVGATE_BODY_TIMEOUT": "500ms",
            "KVGATE_HEADER_TIMEOUT": "2s",
        }
    )
    assert loaded.max_concurrent_requests == 7
    assert loaded.max_prompt_tokens == 100
    assert loaded.max_header_bytes == 4096
    assert loaded.body_timeout_s == 0.5
    assert loaded.header_timeout_s == 2.0
    assert Settings.load({}).max_prompt_tokens is None


# -- pods files -------------------------------------------------------------------------------

GOOD_POD = {"name": "p0", "url": "http://10.0.0.1:8000", "model": "m",
            "events": "tcp://10.0.0.1:5557", "replay": "tcp://10.0.0.1:5558"}  # fmt: skip
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
pod_keys = st.sampled_from(sorted(GOOD_POD) + ["engine", "topic", "events_bind", "loras",
                                               "lora_ids", "ready", "event", ""])  # fmt: skip
mutated_pods = st.builds(
    lambda key, value, drop: {
        **{k: v for k, v in GOOD_POD.items() if k != drop},
        **({key: value} if key else {}),
    },
    pod_keys,
    json_values,
    st.sampled_from([None, *GOOD_POD]),
)
documents = st.one_of(
    json_values,
    st.builds(lambda pods: {"pods": pods}, st.lists(mutated_pods, max_size=3)),
    st.lists(mutated_pods, max_size=3),
    st.builds(lambda pods: {"pods": pods}, st.lists(json_values, max_size=3)),
)


@FUZZ
@given(document=documents)
def test_any_pods_document_parses_or_names_the_bad_field(document: Any) -> None:
    try:
        pods = parse_pods(document, source="pods.json")
    except ConfigError as error:
        message = str(error)
        assert "\n" not in message and message.startswith("pods.json")
        # the whole document's problem, or one pod's (and then its field, when it is one)
        assert re.fullmatch(r"pods\.json(: pods\[\d+\](\.[^.]*)?)?", error.variable), message
    else:
        assert all(pod.name and pod.url.startswith("http") for pod in pods)


@pytest.mark.parametrize(
    ("pod_change", "field"),
    [
        ({"name": None}, "pods[0].name"),
        ({"name": "bad name!"}, "pods[0].name"),
        ({"url": "10.0.0.1:8000"}, "pods[0].url"),
        ({"url": 8000}, "pods[0].url"),
        ({"model": ["m"]}, "pods[0].model"),
        ({"engine": "tgi"}, "pods[0].engine"),
        ({"events": "10.0.0.1:5557"}, "pods[0].events"),
        ({"replay": "tcp://host"}, "pods[0].replay"),
        ({"loras": "a,b"}, "pods[0].loras"),
        ({"lora_ids": {"x": "a"}}, "pods[0].lora_ids"),
        ({"events_bind": "yes"}, "pods[0].events_bind"),
        ({"ready": 1}, "pods[0].ready"),
        ({"event": "tcp://10.0.0.1:5557"}, "pods[0].event"),
    ],
)
def test_each_bad_pod_field_is_named(pod_change: dict[str, Any], field: str) -> None:
    pod = {**GOOD_POD, **pod_change}
    with pytest.raises(ConfigError) as caught:
        parse_pods({"pods": [{k: v for k, v in pod.items() if v is not None}]}, source="f")
    assert_one_clear_line(caught.value, f"f: {field}")


@pytest.mark.parametrize(
    "content",
    [b"", b"{", b"\xff\xfe{}", b"[" * 100_000 + b"]" * 100_000, b'{"pods": 3}', b"null"],
)
def test_unreadable_pods_files_name_the_file(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "pods.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError) as caught:
        load_pods_file(path)
    assert_one_clear_line(caught.value, str(path))


def serve(tmp_path: Path, pods: bytes, **env: str) -> tuple[int, list[str]]:
    path = tmp_path / "pods.json"
    path.write_bytes(pods)
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--pods", str(path), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )
    return result.returncode, result.stderr.splitlines()


@pytest.mark.parametrize(
    ("pods", "env", "named"),
    [
        (json.dumps({"pods": [{**GOOD_POD, "url": "nope"}]}).encode(), {}, "pods[0].url"),
        (json.dumps([{**GOOD_POD, "evnets": "tcp://x:1"}]).encode(), {}, "pods[0].evnets"),
        (b"[" * 50_000, {}, "pods.json"),
        (json.dumps([GOOD_POD]).encode(), {"KVGATE_MAX_CONCURRENT_REQUESTS": "0"},
         "KVGATE_MAX_CONCURRENT_REQUESTS"),
        (json.dumps([GOOD_POD]).encode(), {"KVGATE_BODY_TIMEOUT": "forever"},
         "KVGATE_BODY_TIMEOUT"),
        (json.dumps([GOOD_POD]).encode(), {"AIBRIX_PREFIX_CACHE_BLOCK_SIZE": "x"},
         "AIBRIX_PREFIX_CACHE_BLOCK_SIZE"),
    ],
)  # fmt: skip
def test_kvgate_serve_stops_with_one_line_naming_the_field(
    tmp_path: Path, pods: bytes, env: dict[str, str], named: str
) -> None:
    code, lines = serve(tmp_path, pods, **env)
    assert code == 2
    assert len(lines) == 1, lines
    assert named in lines[0]
    assert lines[0].startswith("kvgate serve: invalid configuration:")


ROUTING = '[profiles.x]\nscorers = [{{ type = "load", weight = {weight} }}]\npicker = "max-score"\n'


@pytest.mark.parametrize(
    ("name", "text", "named"),
    [
        ("routing.toml", ROUTING.format(weight="inf"), "weight=inf"),
        ("routing.toml", ROUTING.format(weight="1e308"), "weight=1e+308"),
        ("routing.toml", ROUTING.format(weight="nan"), "weight=nan"),
        ("routing.toml", "a = " + "[" * 100_000, "KVGATE_ROUTING_CONFIG"),
        ("routing.yaml", "[" * 500_000, "KVGATE_ROUTING_CONFIG"),
        ("routing.yaml", "profiles:\n" + "".join("  " * i + "x:\n" for i in range(1, 400)),
         "KVGATE_ROUTING_CONFIG"),
    ],
)  # fmt: skip
def test_kvgate_serve_refuses_a_hostile_routing_config_in_one_line(
    tmp_path: Path, name: str, text: str, named: str
) -> None:
    config = tmp_path / name
    config.write_text(text)
    code, lines = serve(tmp_path, json.dumps([GOOD_POD]).encode(),
                        KVGATE_ROUTING_CONFIG=str(config))  # fmt: skip
    assert code == 2
    assert len(lines) == 1, lines
    assert lines[0].startswith("kvgate serve: invalid configuration:")
    assert named in lines[0]


@pytest.mark.parametrize(
    ("name", "text"),
    [("settings.yaml", "- " * 200_000 + "x"), ("settings.toml", "a = " + "{b = " * 50_000)],
)
def test_kvgate_serve_refuses_a_deep_settings_file_in_one_line(
    tmp_path: Path, name: str, text: str
) -> None:
    settings_file = tmp_path / name
    settings_file.write_text(text)
    pods = tmp_path / "pods.json"
    pods.write_text(json.dumps([GOOD_POD]))
    result = subprocess.run(
        [sys.executable, "-m", "gateway.cli", "serve", "--pods", str(pods), "--port", "1",
         "--config", str(settings_file)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    lines = result.stderr.splitlines()
    assert result.returncode == 2
    assert len(lines) == 1, lines
    assert "--config" in lines[0] and "nested at most 32 levels" in lines[0]
