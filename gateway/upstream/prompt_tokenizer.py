"""Where a request's prompt is tokenized, and how long a prompt may be before it is.

`KVGATE_TOKENIZER` chooses: `local` tokenizes in-process with each model's own files and
nowhere else; `remote` asks the engines' `/tokenize`; `auto` (the default) is local where a
model's files are found and remote otherwise, or for a request only the engine can render
(media parts, a request-supplied template).

Before anything is tokenized, a prompt's length in characters is checked against the
model's context: as vLLM does, a prompt of more than `max_model_len × the longest token's
length in characters` cannot fit, and is refused with a 400 at once (a 5 MiB prompt costs
no engine anything). That bound needs the vocabulary, so it applies where the model is
tokenized in-process. The remote path never sends `/tokenize` a prompt longer than
`max_model_len × REMOTE_CHARS_PER_TOKEN` characters: such a prompt is routed on load, and
the engine, which knows its vocabulary, refuses it or serves it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from gateway.errors import BadRequest
from gateway.upstream.local_tokenizer import LocalTokenizers, NotLocal
from gateway.upstream.tokenizer import RemoteTokenizer, TokenizeInput, TokenizerError
from tokenization import ModelTokenizer, too_long

MODES = ("auto", "local", "remote")
REMOTE_CHARS_PER_TOKEN = 8
"""Characters per token of context beyond which a prompt is not sent to `/tokenize`: twice
English text's ~4, and below the longest token of any vocabulary in use (vLLM's own bound
is that length), so an engine never tokenizes what it would refuse by its length check."""


@dataclass(frozen=True, slots=True)
class Tokenized:
    tokens: list[int]
    where: str
    """"local" or "remote"."""
    hit: bool
    """Answered from the cache."""


class PromptTokenizer:
    """Tokenizes a request's prompt in-process or at an engine, per `mode`."""

    def __init__(
        self,
        *,
        mode: str,
        local: LocalTokenizers | None,
        remote: RemoteTokenizer | None,
        context_length: Callable[[str], int | None] = lambda model: None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(mode)
        self._local = local if mode != "remote" else None
        self._remote = remote if mode != "local" else None
        self._context_length = context_length
        """A model's `max_model_len` as its engines report it (None: not known yet)."""

    async def local_tokenizer(self, model: str) -> ModelTokenizer | None:
        return None if self._local is None else await self._local.tokenizer(model)

    async def preload(self, models: Callable[[], Iterable[str]], interval_s: float = 1.0) -> None:
        """Load each served model's tokenizer as soon as a pod of it appears, so that no
        request waits for it (a supervised background task)."""
        while True:
            for model in models():
                await self.local_tokenizer(model)
            await asyncio.sleep(interval_s)

    async def tokenize(
        self,
        model: str,
        what: TokenizeInput,
        pods: Sequence[tuple[str, str]],
        *,
        remote: bool = True,
    ) -> Tokenized:
        """`what`'s token ids. `BadRequest` when the prompt cannot fit the model;
        `TokenizerError` when it could not be tokenized (the caller routes on load).
        `remote` false: in-process only (a count that is not worth an engine's call)."""
        context = self._context_length(model)
        if self._local is not None:
            local = await self._local.tokenizer(model)
            if local is not None:
                self._check_length(what, context or local.max_model_len, local.max_chars_per_token)
                before = self._local.cache.hits
                try:
                    tokens = await self._local.tokenize(local, what)
                except NotLocal as exc:
                    if self._remote is None or not remote:
                        raise TokenizerError(str(exc), retryable=False, where="local") from None
                else:
                    return Tokenized(tokens, "local", self._local.cache.hits > before)
        if self._remote is None or not remote:
            raise TokenizerError(
                f"no tokenizer files for model {model}", retryable=False, where="local"
            )
        if context is not None and what.characters > context * REMOTE_CHARS_PER_TOKEN:
            raise TokenizerError(
                f"a prompt of {what.characters} characters is left to the engine to measure",
                retryable=False,
            )
        before = self._remote.hits
        tokens = await self._remote.tokenize(what, pods)
        return Tokenized(tokens, "remote", self._remote.hits > before)

    @staticmethod
    def _check_length(what: TokenizeInput, context: int | None, chars_per_token: int) -> None:
        if context is None or what.truncated:
            return
        refused = too_long(what.characters, context, chars_per_token)
        if refused is not None:
            raise BadRequest(refused, param="messages" if what.chat else "prompt")
