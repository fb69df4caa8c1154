"""Where a model's tokenizer files are, and what they say.

A model directory in Hugging Face's format, as vLLM reads it: `tokenizer.json` (required:
the fast tokenizer), `tokenizer_config.json` (special tokens, `chat_template`, the length
limit), a separate `chat_template.jinja` (which takes priority over the config's, as in
`transformers`), named templates in `additional_chat_templates/*.jinja`, and `config.json`
(the model's context length).

`find_in_hub_cache` finds a model id in a Hugging Face cache directory (the `HF_HOME/hub`
layout that vLLM pods mount): `models--org--name/refs/main` names the snapshot, and
`snapshots/<revision>/` holds the files.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenization.errors import TokenizerLoadError

MAX_CONFIG_BYTES = 4 * 1024 * 1024
"""A `tokenizer_config.json` or `config.json` larger than this is not a model's config."""
MAX_TEMPLATE_BYTES = 1024 * 1024


@dataclass(frozen=True, slots=True)
class TokenizerFiles:
    """What a model directory holds for tokenizing (read once, at load)."""

    directory: Path
    tokenizer_json: Path
    config: dict[str, Any] = field(default_factory=dict)
    """`tokenizer_config.json` (empty when absent)."""
    chat_templates: dict[str, str] = field(default_factory=dict)
    """Templates by name; `default` is the one used without tools."""
    model_config: dict[str, Any] = field(default_factory=dict)
    """`config.json` (empty when absent)."""

    @classmethod
    def read(cls, directory: Path) -> TokenizerFiles:
        tokenizer_json = directory / "tokenizer.json"
        if not tokenizer_json.is_file():
            raise TokenizerLoadError(f"{directory} has no tokenizer.json")
        config = _json(directory / "tokenizer_config.json")
        return cls(
            directory=directory,
            tokenizer_json=tokenizer_json,
            config=config,
            chat_templates=_templates(directory, config),
            model_config=_json(directory / "config.json"),
        )

    def max_model_len(self) -> int | None:
        """The model's context length as its files give it: `config.json`'s
        `max_position_embeddings`, else the tokenizer's `model_max_length` (ignored when it
        is transformers' "no limit" sentinel)."""
        for value in (
            self.model_config.get("max_position_embeddings"),
            self.config.get("model_max_length"),
        ):
            if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 10**8:
                return value
        return None


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    if path.stat().st_size > MAX_CONFIG_BYTES:
        raise TokenizerLoadError(f"{path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TokenizerLoadError(f"{path}: {exc}") from None
    if not isinstance(value, dict):
        raise TokenizerLoadError(f"{path} is not a JSON object")
    return value


def _read_template(path: Path) -> str:
    if path.stat().st_size > MAX_TEMPLATE_BYTES:
        raise TokenizerLoadError(f"{path} is larger than {MAX_TEMPLATE_BYTES} bytes")
    return path.read_text(encoding="utf-8")


def _templates(directory: Path, config: dict[str, Any]) -> dict[str, str]:
    """The chat templates, by name: the config's (a string, or a list of {name, template}),
    overridden by separate files, as `transformers` loads them."""
    templates: dict[str, str] = {}
    configured = config.get("chat_template")
    if isinstance(configured, str):
        templates["default"] = configured
    elif isinstance(configured, list):
        for entry in configured:
            if isinstance(entry, dict) and isinstance(entry.get("name"), str):
                template = entry.get("template")
                if isinstance(template, str):
                    templates[entry["name"]] = template
    separate = directory / "chat_template.jinja"
    if separate.is_file():
        templates["default"] = _read_template(separate)
    extra = directory / "additional_chat_templates"
    if extra.is_dir():
        for path in sorted(extra.glob("*.jinja")):
            templates[path.stem] = _read_template(path)
    return templates


def find_in_hub_cache(hub_cache: Path, model_id: str) -> Path | None:
    """The snapshot directory of `model_id` (`org/name`) in a Hugging Face hub cache, or
    None when the cache has no snapshot of it with a `tokenizer.json`."""
    if not model_id or ".." in model_id or model_id.startswith("/"):
        return None
    repo = hub_cache / ("models--" + model_id.replace("/", "--"))
    snapshots = repo / "snapshots"
    if not snapshots.is_dir():
        return None
    ref = repo / "refs" / "main"
    if ref.is_file():
        revision = ref.read_text(encoding="ascii", errors="replace").strip()
        candidate = snapshots / revision
        if revision and candidate.is_dir() and (candidate / "tokenizer.json").is_file():
            return candidate
    # No usable ref: the newest snapshot that has the tokenizer (a cache filled offline).
    found = [d for d in snapshots.iterdir() if (d / "tokenizer.json").is_file()]
    if not found:
        return None
    return max(found, key=lambda d: d.stat().st_mtime)
