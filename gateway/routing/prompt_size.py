"""A prompt's length in tokens when it was not tokenized, from its request body's size.

The cost model prices a request by its prompt tokens. A policy that does not tokenize
(round-robin, least-request) and a request whose tokenization failed (the tokenizer down:
degraded routing) only know the body's size. How many bytes of body a token takes depends
on the model's tokenizer and on the traffic's shape (chat messages carry their roles and
JSON around them), so it is learned per model from every request whose token count is
known: tokenized by the gateway, or reported by the engine's `usage` in its answer.

Where the gateway tokenizes a model in-process, every prompt is counted exactly and none of
this applies; it is for prompts a remote tokenizer could not count.

Trust: the byte counts are the client's, so each client is learned on its own (per model,
keyed by `gateway.http.api.client_key`): a client's prompts are estimated from its own earlier
prompts. A client not learned yet gets the median of the model's learned clients, each one
vote however many requests it sent, once at least `MIN_CLIENTS_FOR_MEDIAN` are learned
(the prior before): one client cannot move another's estimate, by padding its bodies or
by sending token-dense ones. One request's ratio is also clamped to
[`MIN_BYTES_PER_TOKEN`, `MAX_BYTES_PER_TOKEN`] and weighs by its tokens, capped; the models
and clients kept are bounded.
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass

PRIOR_BYTES_PER_TOKEN = 4.0
"""English text in a GPT-style vocabulary, before anything is learned."""
MIN_BYTES_PER_TOKEN = 1.0
MAX_BYTES_PER_TOKEN = 32.0
PRIOR_TOKENS = 512.0
"""How many tokens the prior counts for: a model's first few requests move it only part way."""
HALF_LIFE_TOKENS = 200_000.0
"""After this many more tokens are learned, older requests weigh half: the estimate follows a
change of traffic within a few hundred requests."""
MAX_TOKENS_PER_SAMPLE = 2048
"""One request weighs at most this many tokens (a huge prompt teaches as much as a long one)."""
MAX_MODELS = 4096
MAX_CLIENTS_PER_MODEL = 1024
"""The clients learned per model, the least recently seen dropped beyond it."""
MIN_CLIENTS_FOR_MEDIAN = 3
"""A median of fewer clients would be one client's own figure."""


@dataclass(slots=True)
class _Learned:
    byte_weight: float
    token_weight: float


class _ModelSizes:
    """One model's clients, least recently seen first, and their median (kept while no
    client learns anything new)."""

    def __init__(self) -> None:
        self.clients: OrderedDict[str, _Learned] = OrderedDict()
        self.median: float | None = None

    def fleet(self, prior: float) -> float:
        if len(self.clients) < MIN_CLIENTS_FOR_MEDIAN:
            return prior
        if self.median is None:
            self.median = statistics.median(
                c.byte_weight / c.token_weight for c in self.clients.values()
            )
        return self.median


class PromptSizes:
    """Each (model, client)'s body bytes per prompt token, learned; `tokens` estimates a
    prompt's length from its body's size."""

    def __init__(self, prior_bytes_per_token: float = PRIOR_BYTES_PER_TOKEN) -> None:
        self._prior = prior_bytes_per_token
        self._models: dict[str, _ModelSizes] = {}

    def bytes_per_token(self, model: str, client: str = "") -> float:
        """`client`'s own ratio for `model`, else the model's clients' median (a client
        never seen; `client` empty: the model's figure)."""
        sizes = self._models.get(model)
        if sizes is None:
            return self._prior
        learned = sizes.clients.get(client) if client else None
        if learned is None:
            return sizes.fleet(self._prior)
        return learned.byte_weight / learned.token_weight

    def tokens(self, model: str, client: str, body_bytes: int) -> int:
        """The estimated prompt tokens of a `body_bytes`-byte request body (at least 1)."""
        return max(1, round(body_bytes / self.bytes_per_token(model, client)))

    def learn(self, model: str, client: str, body_bytes: int, prompt_tokens: int) -> None:
        """A request of `body_bytes` from `client` had `prompt_tokens` (a trusted count)."""
        if prompt_tokens <= 0 or body_bytes <= 0:
            return
        sizes = self._models.get(model)
        if sizes is None:
            if len(self._models) >= MAX_MODELS:
                return  # the estimate of an unseen model stays the prior
            sizes = self._models[model] = _ModelSizes()
        learned = sizes.clients.get(client)
        if learned is None:
            if len(sizes.clients) >= MAX_CLIENTS_PER_MODEL:
                sizes.clients.popitem(last=False)
            learned = sizes.clients[client] = _Learned(self._prior * PRIOR_TOKENS, PRIOR_TOKENS)
        else:
            sizes.clients.move_to_end(client)
        ratio = min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, body_bytes / prompt_tokens))
        weight = float(min(prompt_tokens, MAX_TOKENS_PER_SAMPLE))
        keep = 0.5 ** (weight / HALF_LIFE_TOKENS)
        learned.byte_weight = learned.byte_weight * keep + ratio * weight
        learned.token_weight = learned.token_weight * keep + weight
        sizes.median = None
