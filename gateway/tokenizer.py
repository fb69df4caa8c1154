"""Tokenizing requests exactly as the engine will: its own /tokenize (and chat template).

The token ids then equal those in the engine's BlockStored events, which is what makes
the gateway's prefix hashes meet the index's. Answers are cached by (model, the exact
content to tokenize). Failures never fail a request: the caller routes on load alone.
"""

from __future__ import annotations

import asyncio
import json
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gateway.http1 import Http1Error, Http1Pool

# Request fields that change how vLLM renders and tokenizes a chat / a prompt.
_CHAT_FIELDS = (
    "add_generation_prompt",
    "continue_final_message",
    "add_special_tokens",
    "chat_template",
    "chat_template_kwargs",
    "tools",
    "documents",
)
_PROMPT_FIELDS = ("add_special_tokens",)


class TokenizerError(Exception):
    """Tokenization failed (timeout, engine error, unusable request); route on load only."""

    def __init__(self, message: str, *, retryable: bool = True) -> None:
        super().__init__(message)
        self.retryable = retryable


def is_token_ids(values: list[Any]) -> bool:
    """Every value a token id: a JSON integer in [0, 2**32) — `true` is not one (Python
    would take it for 1). Checked in C, not a Python loop: a prompt may be 100k ids (the
    range by packing them as unsigned 32-bit ints, as the prefix hasher does: half the
    time of `min` and `max`)."""
    if not values:
        return True
    if set(map(type, values)) != _INT_ONLY:
        return False
    try:
        array("I", values)
    except OverflowError:
        return False
    return True


_INT_ONLY = {int}


@dataclass(frozen=True, slots=True)
class TokenizeInput:
    """What to send to /tokenize, and the cache key that identifies it."""

    body: Mapping[str, Any]
    key: str
    chat: bool = False
    """A chat prompt: only an engine that applies the model's chat template can tokenize
    it (vLLM's /tokenize takes `messages`; SGLang's takes a `prompt` only)."""

    @classmethod
    def for_completion(cls, request: Mapping[str, Any]) -> TokenizeInput | list[int]:
        """The tokenize input of a /v1/completions body, or its token ids if it has them."""
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one prompt
        if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
            # Token ids (only read from here on: no copy), already checked where the body
            # came in (`gateway.api.validate`, `is_token_ids`); the prefix hasher packs them
            # as uint32 again, so nothing else could slip into the index. Checking them
            # twice cost ~50 µs per 2,048 ids.
            return prompt
        if not isinstance(prompt, str):
            raise TokenizerError("only a single prompt (text or token ids) can be matched")
        body: dict[str, Any] = {"model": request["model"], "prompt": prompt}
        body.update({k: request[k] for k in _PROMPT_FIELDS if k in request})
        return cls(body, _key(body))

    @classmethod
    def for_chat(cls, request: Mapping[str, Any]) -> TokenizeInput:
        body: dict[str, Any] = {"model": request["model"], "messages": request["messages"]}
        body.update({k: request[k] for k in _CHAT_FIELDS if k in request})
        return cls(body, _key(body), chat=True)


def _applies_chat_template(engine: str) -> bool:
    return engine != "sglang"


def _key(body: Mapping[str, Any]) -> str:
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


class RemoteTokenizer:
    """Calls an engine's /tokenize with a timeout and bounded retries, through an LRU cache.

    `endpoint` fixes where to tokenize (AIBRIX_REMOTE_TOKENIZER_ENDPOINT, an engine of kind
    `endpoint_engine`: AIBRIX_REMOTE_TOKENIZER_ENGINE); otherwise the caller passes the pods
    serving the model, as (URL, engine kind), and calls take turns over them (a retry goes
    to the next): tokenizing is CPU on the engine's API server, and one slow pod must not
    hold up every request's routing. Both engines serve `POST /tokenize` with
    `{"model", "prompt"}` (SGLang since 0.5; 0.4.x answers 404), but only vLLM's takes
    `{"model", "messages"}` and applies the chat template: a chat prompt is never sent to
    an SGLang engine.
    """

    def __init__(
        self,
        pool: Http1Pool,
        *,
        timeout_s: float,
        max_retries: int,
        cache_size: int,
        endpoint: str | None = None,
        endpoint_engine: str = "vllm",
    ) -> None:
        self._pool = pool
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._cache_size = cache_size
        self._endpoint = endpoint
        self._endpoint_engine = endpoint_engine
        self._cache: OrderedDict[str, list[int]] = OrderedDict()
        self._turn = 0
        """Which of the pods the next call starts with."""
        self.hits = 0
        self.misses = 0
        self.failures = 0

    async def tokenize(self, what: TokenizeInput, pods: Sequence[tuple[str, str]]) -> list[int]:
        """Token ids of `what`, from the configured endpoint or one of `pods` (URL, engine
        kind) that can tokenize it."""
        cached = self._cache.get(what.key)
        if cached is not None:
            self._cache.move_to_end(what.key)
            self.hits += 1
            return cached
        self.misses += 1
        targets = [(self._endpoint, self._endpoint_engine)] if self._endpoint else list(pods)
        urls = [url for url, engine in targets if not what.chat or _applies_chat_template(engine)]
        if not urls:
            self.failures += 1
            if targets:
                raise TokenizerError(
                    "SGLang cannot tokenize a chat prompt (its /tokenize takes a prompt only): "
                    "set AIBRIX_REMOTE_TOKENIZER_ENDPOINT to a vLLM tokenizer of the model",
                    retryable=False,
                )
            raise TokenizerError("no endpoint to tokenize with")
        last_error = "no attempt"
        first = self._turn % len(urls)
        self._turn = first + 1
        for attempt in range(self._max_retries + 1):
            url = urls[(first + attempt) % len(urls)]
            try:
                tokens = await self._call(url, what.body)
            except TokenizerError as exc:
                last_error = str(exc)
                if not exc.retryable:
                    break
                if attempt < self._max_retries:
                    await asyncio.sleep(min(0.05 * 2**attempt, 0.5))
                continue
            self._remember(what.key, tokens)
            return tokens
        self.failures += 1
        raise TokenizerError(last_error)

    async def _call(self, url: str, body: Mapping[str, Any]) -> list[int]:
        # Not the cache key (its keys are sorted): a chat template renders tools' schemas
        # in the order the client wrote them, as the engine will.
        payload = json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode()
        try:
            async with asyncio.timeout(self._timeout_s):
                status, answer = await self._pool.post(f"{url}/tokenize", payload)
        except TimeoutError:
            raise TokenizerError(f"{url}/tokenize timed out after {self._timeout_s} s") from None
        except (Http1Error, ValueError) as exc:
            raise TokenizerError(f"{url}/tokenize failed: {exc}") from None
        if status != 200:
            # A 4xx is the same answer every time (unknown model, unsupported fields).
            raise TokenizerError(f"{url}/tokenize answered {status}", retryable=status >= 500)
        try:
            tokens = json.loads(answer)["tokens"]
        except (ValueError, KeyError, TypeError):
            raise TokenizerError(f"{url}/tokenize answered without token ids") from None
        if not isinstance(tokens, list) or not is_token_ids(tokens):
            raise TokenizerError(f"{url}/tokenize answered malformed token ids")
        return tokens

    def _remember(self, key: str, tokens: list[int]) -> None:
        if self._cache_size <= 0:
            return
        self._cache[key] = tokens
        if len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
