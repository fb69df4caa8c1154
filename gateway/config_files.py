"""Reading a configuration file — the settings file (`--config`), the routing config, the
pods file — bounded before and while it is parsed, every failure one ConfigError line.

Bounds: the file's size (`MAX_CONFIG_BYTES`, `MAX_PODS_FILE_BYTES`: a pods file lists
every pod, 4096 of them in about 2 MB) and its nesting (`MAX_DEPTH`, the document
itself counting as one: kvgate's deepest file has 5, a routing config's
`profiles.NAME.scorers[i]`). The parsers recurse
once per level (tomllib, PyYAML, json): a file nested thousands deep would end in a
RecursionError, and PyYAML takes seconds to get there, so a YAML file's depth is counted
from its parse events first (aliases counted at their anchor's depth, so no reuse of a
node makes a deeper one), and anything else's is checked once parsed (a RecursionError
on the way is the same refusal).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from gateway.errors import ConfigError

MAX_CONFIG_BYTES = 1024 * 1024
MAX_PODS_FILE_BYTES = 16 * 1024 * 1024
MAX_DEPTH = 32


def read_document(path: Path, where: str, *, kind: str, max_bytes: int = MAX_CONFIG_BYTES) -> Any:
    """`path` parsed as `kind` ("toml", "yaml" or "json"); ConfigError (naming `where`)
    when it is unreadable, larger than `max_bytes`, not valid or nested too deep."""
    try:
        with path.open("rb") as file:
            data = file.read(max_bytes + 1)
    except OSError as exc:
        raise ConfigError(
            where, str(path), f"a readable {kind.upper()} file ({exc.strerror})"
        ) from None
    if len(data) > max_bytes:
        raise ConfigError(where, str(path), f"a file of at most {max_bytes // 1024} KiB")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(where, str(path), f"a UTF-8 {kind.upper()} file") from None
    return parse_document(text, str(path), where, kind=kind)


def parse_document(text: str, name: str, where: str, *, kind: str) -> Any:
    """`text` (of the file `name`) parsed as `kind`, bounded as `read_document` says."""
    deep = ConfigError(where, name, f"a file nested at most {MAX_DEPTH} levels deep")
    try:
        if kind == "yaml":
            if _yaml_too_deep(text):
                raise deep
            document = yaml.safe_load(text)
        elif kind == "toml":
            document = tomllib.loads(text)
        else:
            document = json.loads(text)
    except RecursionError:
        raise deep from None
    except (tomllib.TOMLDecodeError, yaml.YAMLError, ValueError) as exc:
        raise ConfigError(where, name, f"valid {kind.upper()} ({exc})") from None
    if kind != "yaml" and _depth(document) > MAX_DEPTH:
        raise deep
    return document


def _yaml_too_deep(text: str) -> bool:
    """Whether the document nests deeper than `MAX_DEPTH`, from its parse events (no more
    of the file is parsed once it does)."""
    open_: list[list[Any]] = []  # per open collection: [its anchor, its children's height]
    heights: dict[str, int] = {}  # an anchored collection's height
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            open_.append([event.anchor, 0])
            if len(open_) > MAX_DEPTH:
                return True
        elif isinstance(event, yaml.CollectionEndEvent):
            anchor, height = open_.pop()
            if anchor is not None:
                heights[anchor] = height + 1
            if open_:
                open_[-1][1] = max(open_[-1][1], height + 1)
        elif isinstance(event, yaml.AliasEvent):
            height = heights.get(event.anchor or "", 0)
            if len(open_) + height > MAX_DEPTH:
                return True
            if open_:
                open_[-1][1] = max(open_[-1][1], height)
    return False


def _depth(document: Any) -> int:
    """The nesting depth of a parsed TOML or JSON document (a tree: no shared nodes),
    without recursion; stops once it passes `MAX_DEPTH`."""
    deepest = 0
    pending: list[tuple[Any, int]] = [(document, 0)]
    while pending:
        value, depth = pending.pop()
        if isinstance(value, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if deepest > MAX_DEPTH:
                break
            pending.extend((child, depth) for child in _children(value))
    return deepest


def _children(value: dict[Any, Any] | list[Any]) -> Iterator[Any]:
    return iter(value.values()) if isinstance(value, dict) else iter(value)
