"""The simulated engine's tokenizer: a model's Hugging Face tokenizer files, read and
rendered as vLLM reads them (`tokenization.ModelTokenizer`).

By default the files shipped beside this module (`SHIPPED_TOKENIZER`): a byte-level BPE of
8192 tokens whose every word of the benchmarks' word list is one token after a space,
rendering chats with `chat_template.jinja` (`bench.harness.vllm_model` trains it, and
gives the same files to the routing benchmark's real-vLLM model). `kvgate sim --tokenizer
DIR` serves another model's files instead.

The engine generates words: tokens that are a space and a lowercase ASCII word, and that
the tokenizer reads back as themselves (`word_token_ids`), so an answer's text re-encodes
to the tokens the engine cached for it.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from tokenization import ModelTokenizer, TokenizerLoadError

SHIPPED_TOKENIZER = Path(__file__).resolve().parent
"""The simulated model's tokenizer files."""
_WORD_TOKEN = re.compile(r"[Ġ▁][a-z]+")
"""A token string that is a space and a lowercase word: byte-level BPE vocabularies write
the space as `Ġ`, SentencePiece ones as `▁`."""


class SimTokenizer:
    """One model's tokenizer and the token ids the simulated engine generates from
    (immutable once loaded; engines loading the same directory share one)."""

    def __init__(self, model: ModelTokenizer) -> None:
        self.model = model
        self.vocab_size = model.vocab_size
        self.max_chars_per_token = model.max_chars_per_token
        self.word_token_ids = _word_token_ids(model)
        if not self.word_token_ids:
            raise TokenizerLoadError(
                f"{model.files.directory}: no token is a space and a lowercase word, which "
                "is what the simulated engine generates"
            )

    @classmethod
    def load(cls, directory: Path | None = None) -> SimTokenizer:
        """The tokenizer of `directory` (default: the shipped one), loaded once per
        directory. Raises `tokenization.TokenizerLoadError` for unusable files."""
        return _load(directory.resolve() if directory is not None else SHIPPED_TOKENIZER)

    def encode(self, text: str, *, add_special_tokens: bool = True) -> list[int]:
        return self.model.encode(text, add_special_tokens=add_special_tokens)

    def encode_chat(self, request: Mapping[str, Any], *, completions: bool) -> list[int]:
        """Token ids of a chat request (`completions`: a `/v1/chat/completions` body, else
        a `/tokenize` body with `messages`). Raises `tokenization.ChatRenderError` where
        vLLM answers 400, `tokenization.NotRenderable` for what only a real model renders."""
        return self.model.encode_chat(request, completions=completions)

    def render_chat(self, request: Mapping[str, Any], *, completions: bool) -> str:
        """The prompt text a chat request renders to (errors as `encode_chat`)."""
        return self.model.render_chat(request, completions=completions)

    def encode_rendered(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Token ids of `render_chat`'s text."""
        return self.model.encode_rendered(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        """Text of `token_ids`; ids outside the vocabulary decode to nothing."""
        valid = [token for token in token_ids if self.is_valid(token)]
        return self.model.decode(valid, skip_special_tokens=skip_special_tokens)

    def token_str(self, token_id: int) -> str | None:
        """The token as the vocabulary writes it (`Ġ` marks a leading space)."""
        return self.model.token_str(token_id) if self.is_valid(token_id) else None

    def is_valid(self, token_id: int) -> bool:
        return self.model.is_valid(token_id)


@functools.cache
def _load(directory: Path) -> SimTokenizer:
    return SimTokenizer(ModelTokenizer.load(directory))


def _word_token_ids(model: ModelTokenizer) -> tuple[int, ...]:
    words = []
    for token_id in range(model.vocab_size):
        token = model.token_str(token_id)
        if token is None or not _WORD_TOKEN.fullmatch(token):
            continue
        if model.encode(model.decode([token_id]), add_special_tokens=False) == [token_id]:
            words.append(token_id)
    return tuple(words)
