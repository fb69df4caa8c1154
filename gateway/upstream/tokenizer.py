"""Tokenizing requests exactly as the engine will, at the engine: its own /tokenize.

The token ids then equal those in the engine's BlockStored events, which is what makes
the gateway's prefix hashes meet the index's. Answers are cached by (model, the exact
content to tokenize). Failures never fail a request: the caller routes on load alone.
Models whose tokenizer files the gateway has are tokenized in-process instead
(`gateway.upstream.local_tokenizer`); `gateway.upstream.prompt_tokenizer` chooses.
"""

from __future__ import annotations

import asyncio
import json
import logging
from array import array
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.errors import clip
from gateway.upstream.http1 import Http1Error, Http1Pool

logger = logging.getLogger(__name__)

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

    def __init__(
        self, message: str, *, retryable: bool = True, where: str = "remote", refused: bool = False
    ) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.where = where
        """Which tokenizer failed: "local" (in-process) or "remote" (an engine's)."""
        self.refused = refused
        """The request itself was refused (the engine's 400, the chat template's error):
        its own fault, not the tokenizer's; the message says why."""


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


@dataclass(slots=True)
class TokenizeInput:
    """What to send to /tokenize, and the cache key that identifies it."""

    body: Mapping[str, Any]
    keyed: Mapping[str, Any]
    """What the cache key is made of (the body, and what else renders the prompt)."""
    chat: bool = False
    """A chat prompt: only an engine that applies the model's chat template can tokenize
    it (vLLM's /tokenize takes `messages`; SGLang's takes a `prompt` only)."""
    request: Mapping[str, Any] = field(default_factory=dict)
    """The client's request (a chat is rendered from it in-process)."""
    characters: int = 0
    """The prompt's length in characters (a chat's: its messages' text), what the bound
    on a model's prompts is checked against before anything is tokenized."""
    _key: str | None = None

    @property
    def key(self) -> str:
        """The cache key, made when first asked for: a prompt refused for its length
        never pays for serializing it (14 ms for 5 MiB)."""
        if self._key is None:
            self._key = _key(self.keyed)
        return self._key

    @property
    def text(self) -> str:
        prompt: str = self.body["prompt"]
        return prompt

    @property
    def add_special_tokens(self) -> bool:
        return self.body.get("add_special_tokens", not self.chat) is not False

    @property
    def truncated(self) -> bool:
        """The client asked the engine to truncate the prompt: no length bound applies."""
        return self.request.get("truncate_prompt_tokens") is not None

    @classmethod
    def for_completion(cls, request: Mapping[str, Any]) -> TokenizeInput | list[int]:
        """The tokenize input of a /v1/completions body, or its token ids if it has them."""
        prompt = request.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str | list):
            prompt = prompt[0]  # a batch of one prompt
        if isinstance(prompt, list) and prompt and type(prompt[0]) is int:
            # Token ids (only read from here on: no copy), already checked where the body
            # came in (`gateway.http.api.validate`, `is_token_ids`); the prefix hasher packs them
            # as uint32 again, so nothing else could slip into the index. Checking them
            # twice cost ~50 µs per 2,048 ids.
            return prompt
        if not isinstance(prompt, str):
            raise TokenizerError("only a single prompt (text or token ids) can be matched")
        body: dict[str, Any] = {"model": request["model"], "prompt": prompt}
        body.update({k: request[k] for k in _PROMPT_FIELDS if k in request})
        return cls(body, body, request=request, characters=len(prompt))

    @classmethod
    def for_chat(cls, request: Mapping[str, Any]) -> TokenizeInput:
        body: dict[str, Any] = {"model": request["model"], "messages": request["messages"]}
        body.update({k: request[k] for k in _CHAT_FIELDS if k in request})
        # Not sent to /tokenize (which ignores it) but part of what is rendered in-process
        # for /v1/chat/completions: a reasoning effort turns a template's thinking on.
        keyed = (
            {**body, "reasoning_effort": request["reasoning_effort"]}
            if request.get("reasoning_effort") is not None
            else body
        )
        return cls(
            body, keyed, chat=True, request=request,
            characters=_text_length(request["messages"]),
        )  # fmt: skip


def _text_length(messages: Any) -> int:
    """Characters of text in chat messages (string contents and text parts): a lower bound
    of the rendered prompt's length."""
    total = 0
    if not isinstance(messages, list):
        return 0
    for message in messages:
        content = message.get("content") if isinstance(message, Mapping) else None
        if isinstance(content, str):
            total += len(content)
        elif isinstance(content, list):
            for part in content:
                if isinstance(part, str):
                    total += len(part)
                elif isinstance(part, Mapping) and isinstance(part.get("text"), str):
                    total += len(part["text"])
    return total


class LruCache:
    """Token ids by cache key, the least recently used dropped beyond `size` (0: none)."""

    def __init__(self, size: int) -> None:
        self._size = size
        self._entries: OrderedDict[str, list[int]] = OrderedDict()
        self.hits = 0

    def get(self, key: str) -> list[int] | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
            self.hits += 1
        return found

    def put(self, key: str, tokens: list[int]) -> None:
        if self._size <= 0:
            return
        self._entries[key] = tokens
        if len(self._entries) > self._size:
            self._entries.popitem(last=False)


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
        self._endpoint = endpoint
        self._endpoint_engine = endpoint_engine
        self.cache = LruCache(cache_size)
        self._turn = 0
        """Which of the pods the next call starts with."""
        self.misses = 0
        self.failures = 0
        self._warned: set[str] = set()
        """Models whose chats no pod can tokenize, already warned about (once each)."""

    @property
    def hits(self) -> int:
        return self.cache.hits

    async def tokenize(self, what: TokenizeInput, pods: Sequence[tuple[str, str]]) -> list[int]:
        """Token ids of `what`, from the configured endpoint or one of `pods` (URL, engine
        kind) that can tokenize it."""
        cached = self.cache.get(what.key)
        if cached is not None:
            return cached
        self.misses += 1
        targets = [(self._endpoint, self._endpoint_engine)] if self._endpoint else list(pods)
        urls = [url for url, engine in targets if not what.chat or _applies_chat_template(engine)]
        if not urls:
            self.failures += 1
            if targets:
                model = str(what.body.get("model"))
                if model not in self._warned:
                    self._warned.add(model)
                    logger.warning(
                        "model %s: chat requests route on load alone: its SGLang pods cannot "
                        "tokenize a chat and the gateway has no tokenizer files for it "
                        "(KVGATE_TOKENIZERS, or HF_HOME with its Hugging Face cache)", model,
                    )  # fmt: skip
                raise TokenizerError(
                    "SGLang cannot tokenize a chat prompt (its /tokenize takes a prompt only): "
                    "give the gateway the model's tokenizer files (KVGATE_TOKENIZERS) or set "
                    "AIBRIX_REMOTE_TOKENIZER_ENDPOINT to a vLLM tokenizer of the model",
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
                if exc.refused:
                    self.failures += 1
                    raise
                if not exc.retryable:
                    break
                if attempt < self._max_retries:
                    await asyncio.sleep(min(0.05 * 2**attempt, 0.5))
                continue
            self.cache.put(what.key, tokens)
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
        if status in (400, 422):  # the engine refused the request: say why, as it did
            raise TokenizerError(
                f"the engine refused the prompt: {_engine_message(answer)}",
                retryable=False,
                refused=True,
            )
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


def _engine_message(answer: bytes) -> str:
    """The message of an engine's error body (OpenAI's `error.message`, vLLM's
    `message`), clipped; the raw text when it has none."""
    try:
        body = json.loads(answer)
    except ValueError:
        body = None
    message: object = None
    if isinstance(body, dict):
        error = body.get("error")
        message = error.get("message") if isinstance(error, dict) else body.get("message")
    text = message if isinstance(message, str) else answer.decode("utf-8", errors="replace")
    return clip(text, 512)
