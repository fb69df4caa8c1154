"""Configuration files bounded before and while they are parsed: size, nesting depth (TOML,
YAML with and without aliases, JSON), one ConfigError line for each, never a traceback."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.config_files import MAX_CONFIG_BYTES, MAX_DEPTH, read_document
from gateway.control.discovery import load_pods_file
from gateway.errors import ConfigError
from gateway.routing.config import read_config
from gateway.settings import read_config_file


def nested_yaml_mappings(depth: int) -> str:
    return "".join("  " * i + "a:\n" for i in range(depth)) + "  " * depth + "b: 1\n"


def aliased_yaml(levels: int) -> str:
    """Each level a list of three of the level below, by alias: shallow in the text, as
    deep as `levels` once the aliases are followed (and 3^levels leaves)."""
    lines = ["l0: &l0 [1, 2, 3]"]
    lines += [f"l{i}: &l{i} [*l{i - 1}, *l{i - 1}, *l{i - 1}]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


DEEP = [
    ("a.toml", "toml", "a = " + "[" * 100_000),
    ("a.toml", "toml", "a = " + "[" * 40 + "1" + "]" * 40),  # under the recursion limit
    ("a.toml", "toml", "[" + ".".join(["a"] * 40) + "]\nb = 1\n"),  # dotted: no recursion
    ("a.toml", "toml", "a = " + "{b = " * 30_000),
    ("a.yaml", "yaml", "[" * 500_000),
    ("a.yaml", "yaml", "- " * 200_000 + "x"),
    ("a.yaml", "yaml", nested_yaml_mappings(MAX_DEPTH + 1)),
    ("a.yaml", "yaml", aliased_yaml(MAX_DEPTH + 1)),
    ("a.json", "json", "[" * 200_000),
    ("a.json", "json", "[" * 40 + "]" * 40),
]


@pytest.mark.parametrize(("name", "kind", "text"), DEEP, ids=[f"{k}-{i}" for i, (_, k, _) in enumerate(DEEP)])  # fmt: skip  # noqa: E501
def test_a_file_nested_too_deep_is_one_line_and_quickly_refused(
    tmp_path: Path, name: str, kind: str, text: str
) -> None:
    path = tmp_path / name
    path.write_text(text)
    started = time.perf_counter()
    with pytest.raises(ConfigError) as caught:
        read_document(path, "X", kind=kind)
    assert time.perf_counter() - started < 5.0  # a bound, not a measurement
    message = str(caught.value)
    assert "\n" not in message and message.startswith("X=")
    assert f"nested at most {MAX_DEPTH} levels" in message


@pytest.mark.parametrize(
    ("kind", "text"),
    [
        ("toml", "a = " + "[" * (MAX_DEPTH - 1) + "1" + "]" * (MAX_DEPTH - 1)),  # + the root
        ("yaml", nested_yaml_mappings(MAX_DEPTH - 1)),
        ("yaml", aliased_yaml(MAX_DEPTH - 1)),  # 3^31 leaves once followed: never walked
        ("json", "[" * MAX_DEPTH + "]" * MAX_DEPTH),
    ],
)
def test_a_file_at_the_depth_bound_is_read(tmp_path: Path, kind: str, text: str) -> None:
    path = tmp_path / f"a.{kind}"
    path.write_text(text)
    assert read_document(path, "X", kind=kind) is not None


def test_a_file_over_the_size_bound_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "a.toml"
    path.write_text("# " + "x" * MAX_CONFIG_BYTES)
    with pytest.raises(ConfigError, match="at most 1024 KiB"):
        read_document(path, "X", kind="toml")


@pytest.mark.parametrize(
    ("kind", "text", "expected"),
    [
        ("yaml", "a: [1, 2\nb: {", "valid YAML"),  # PyYAML's message spans lines
        ("toml", "a = ", "valid TOML"),
        ("json", "{", "valid JSON"),
    ],
)
def test_a_syntax_error_is_one_line(tmp_path: Path, kind: str, text: str, expected: str) -> None:
    path = tmp_path / f"a.{kind}"
    path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_document(path, "X", kind=kind)
    assert "\n" not in str(caught.value) and expected in str(caught.value)


def test_every_config_file_is_bounded(tmp_path: Path) -> None:
    """The routing config, the settings file and the pods file all go through the bound."""
    deep_yaml = tmp_path / "deep.yaml"
    deep_yaml.write_text("[" * 100_000)
    deep_toml = tmp_path / "deep.toml"
    deep_toml.write_text("a = " + "[" * 100_000)
    deep_json = tmp_path / "deep.json"
    deep_json.write_text("[" * 100_000)
    for read, path, named in (
        (read_config, deep_yaml, "KVGATE_ROUTING_CONFIG"),
        (read_config, deep_toml, "KVGATE_ROUTING_CONFIG"),
        (read_config_file, deep_yaml, "--config"),
        (read_config_file, deep_toml, "--config"),
        (load_pods_file, deep_toml, str(deep_toml)),
        (load_pods_file, deep_json, str(deep_json)),
    ):
        with pytest.raises(ConfigError) as caught:
            read(path)
        assert str(caught.value).startswith(named), caught.value
        assert "nested at most" in str(caught.value)
