"""A prompt's length in tokens when it was not tokenized, from its request body's size.

The cost model prices a request by its prompt tokens. A policy that does not tokenize
(round-robin, least-request) and a request whose tokenization failed (the tokenizer down:
degraded routing) only know the body's size. How many bytes of body a token takes depends
on the model's tokenizer and on the traffic's shape (chat messages carry their roles and
JSON around them), so it is learned per model from every request whose token count is
known: tokenized by the gateway, or reported by the engine's `usage` in its answer.

Trust: the byte counts are the client's, so one request's ratio is clamped to
[`MIN_BYTES_PER_TOKEN`, `MAX_BYTES_PER_TOKEN`] and weighs by its tokens, capped, so a
padded or hostile body moves the estimate by a bounded step; the models kept are bounded.
"""

from __future__ import annotations

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


@dataclass(slots=True)
class _Learned:
    byte_weight: float
    token_weight: float


class PromptSizes:
    """Each model's body bytes per prompt token, learned; `tokens` estimates a prompt's
    length from its body's size."""

    def __init__(self, prior_bytes_per_token: float = PRIOR_BYTES_PER_TOKEN) -> None:
        self._prior = prior_bytes_per_token
        self._models: dict[str, _Learned] = {}

    def bytes_per_token(self, model: str) -> float:
        learned = self._models.get(model)
        if learned is None:
            return self._prior
        return learned.byte_weight / learned.token_weight

    def tokens(self, model: str, body_bytes: int) -> int:
        """The estimated prompt tokens of a `body_bytes`-byte request body (at least 1)."""
        return max(1, round(body_bytes / self.bytes_per_token(model)))

    def learn(self, model: str, body_bytes: int, prompt_tokens: int) -> None:
        """A request of `body_bytes` had `prompt_tokens` (from a trusted count)."""
        if prompt_tokens <= 0 or body_bytes <= 0:
            return
        learned = self._models.get(model)
        if learned is None:
            if len(self._models) >= MAX_MODELS:
                return  # the estimate of an unseen model stays the prior
            learned = self._models[model] = _Learned(self._prior * PRIOR_TOKENS, PRIOR_TOKENS)
        ratio = min(MAX_BYTES_PER_TOKEN, max(MIN_BYTES_PER_TOKEN, body_bytes / prompt_tokens))
        weight = float(min(prompt_tokens, MAX_TOKENS_PER_SAMPLE))
        keep = 0.5 ** (weight / HALF_LIFE_TOKENS)
        learned.byte_weight = learned.byte_weight * keep + ratio * weight
        learned.token_weight = learned.token_weight * keep + weight
