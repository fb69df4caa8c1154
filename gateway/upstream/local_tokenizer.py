"""Tokenizing in-process with each model's own Hugging Face files (`tokenization`).

A model's files are found once, the first time it is routed: the directory
`KVGATE_TOKENIZERS` maps it to, else (`KVGATE_TOKENIZER=auto|local`) its id looked up in the
Hugging Face hub cache (`HF_HUB_CACHE`, or `HF_HOME/hub`, as vLLM pods mount it). Loading
(reading a tokenizer.json of up to tens of MB) runs in a worker thread; requests for the
model that arrive meanwhile wait for the same load. A model without files is remembered as
such, so later requests go to the remote tokenizer at once.

Encoding a prompt longer than `inline_chars` runs in the worker thread too: the tokenizer
library releases the GIL while it encodes, so a 1 MB prompt does not stall the event loop.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from concurrent.futures import Executor
from pathlib import Path
from typing import TypeVar

from gateway.upstream.tokenizer import LruCache, TokenizeInput, TokenizerError
from tokenization import (
    ChatRenderError,
    ModelTokenizer,
    NotRenderable,
    TokenizationError,
    find_in_hub_cache,
)

logger = logging.getLogger(__name__)
T = TypeVar("T")

INLINE_CHARS = 1024
"""Prompts up to this many characters are encoded on the event loop (~0.25 ms): shorter
than the hop to a worker thread and back."""


class NotLocal(Exception):
    """This request cannot be tokenized here (no files, or only the engine can render it)."""


class LocalTokenizers:
    """Each model's `ModelTokenizer`, loaded on first use; encodes requests with it."""

    def __init__(
        self,
        *,
        directories: Mapping[str, Path],
        hub_cache: Path | None,
        executor: Executor | None,
        cache_size: int,
        inline_chars: int = INLINE_CHARS,
        load: Callable[[Path], ModelTokenizer] = ModelTokenizer.load,
    ) -> None:
        self._directories = dict(directories)
        self._hub_cache = hub_cache
        self._executor = executor
        self._inline_chars = inline_chars
        self._load = load
        self._loaded: dict[str, ModelTokenizer | None] = {}
        """Per model: its tokenizer, or None when it has no usable files."""
        self._loading: dict[str, asyncio.Future[ModelTokenizer | None]] = {}
        """Loads in progress, awaited by every request for the model meanwhile."""
        self.cache = LruCache(cache_size)

    async def tokenizer(self, model: str) -> ModelTokenizer | None:
        """The model's tokenizer, loading it the first time; None when it has no files."""
        if model in self._loaded:
            return self._loaded[model]
        pending = self._loading.get(model)
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = loop.run_in_executor(self._executor, self._find_and_load, model)
            self._loading[model] = pending
            pending.add_done_callback(lambda done: self._loaded_one(model, done))
        # Shielded: a caller that gives up does not cancel the load the others wait for.
        return await asyncio.shield(pending)

    def _loaded_one(self, model: str, done: asyncio.Future[ModelTokenizer | None]) -> None:
        del self._loading[model]
        if not done.cancelled() and done.exception() is None:
            self._loaded[model] = done.result()

    def _find_and_load(self, model: str) -> ModelTokenizer | None:
        directory = self._directories.get(model)
        if directory is None and self._hub_cache is not None:
            directory = find_in_hub_cache(self._hub_cache, model)
        if directory is None:
            logger.info("model %s: no tokenizer files found, tokenizing remotely", model)
            return None
        try:
            loaded = self._load(directory)
        except (TokenizationError, OSError) as exc:
            logger.warning("model %s: tokenizer in %s unusable (%s)", model, directory, exc)
            return None
        logger.info(
            "model %s: tokenizing in-process with %s (%d tokens, %s chat templates)",
            model, directory, loaded.vocab_size, len(loaded.files.chat_templates) or "no",
        )  # fmt: skip
        return loaded

    async def tokenize(self, tokenizer: ModelTokenizer, what: TokenizeInput) -> list[int]:
        """Token ids of `what`, as the engine computes them. `NotLocal` when only the engine
        can render it; `TokenizerError` when the engine would refuse it too."""
        cached = self.cache.get(what.key)
        if cached is not None:
            return cached

        def work() -> list[int]:
            if what.chat:
                return tokenizer.encode_chat(what.request, completions=True)
            return tokenizer.encode(what.text, add_special_tokens=what.add_special_tokens)

        try:
            if what.characters > self._inline_chars:
                tokens = await self._run(work)
            else:
                tokens = work()
        except NotRenderable as exc:
            raise NotLocal(str(exc)) from None
        except ChatRenderError as exc:
            refused = f"the chat template refused the request: {exc}"
            raise TokenizerError(refused, retryable=False, where="local", refused=True) from None
        self.cache.put(what.key, tokens)
        return tokens

    async def _run(self, function: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, function)
