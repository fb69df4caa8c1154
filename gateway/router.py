"""One routing decision: tokenize, hash, match against the index, run the policy."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from gateway.errors import BadRequest, ModelNotFound, NoRoutablePod
from gateway.metrics import GatewayMetrics
from gateway.registry import PodRegistry, PodState
from gateway.routing import Decision, RoutingProfile, RoutingRequest
from gateway.tokenizer import RemoteTokenizer, TokenizeInput, TokenizerError
from indexer import ModelContext, SyncPrefixHashTable

Kind = Literal["chat", "completion"]
Affinity = Callable[[str, ModelContext, str | None, Sequence[int]], str | None]
"""(model, context, session, prefix hashes) -> the pod the request should stay on."""


@dataclass(frozen=True, slots=True)
class Routed:
    decision: Decision
    request: RoutingRequest
    prefix_hashes: list[int]

    def matched_blocks(self, pod: str) -> int:
        match = self.request.match
        return match.matched(pod) if match is not None else 0


class Router:
    def __init__(
        self,
        *,
        registry: PodRegistry,
        table: SyncPrefixHashTable,
        tokenizer: RemoteTokenizer | None,
        policies: Mapping[str, RoutingProfile],
        default_policy: str,
        metrics: GatewayMetrics,
        clock: Callable[[], float] = time.perf_counter,
        max_prompt_tokens: int | None = None,
    ) -> None:
        self._registry = registry
        self._table = table
        self._tokenizer = tokenizer
        self.policies = dict(policies)
        self.default_policy = default_policy
        self._metrics = metrics
        self._clock = clock
        self._max_prompt_tokens = max_prompt_tokens
        self.affinity: Affinity | None = None
        """Set by the pin manager: the pod a pinned session or prefix must stay on."""

    def policy(self, name: str | None) -> RoutingProfile:
        if name is None:
            return self.policies[self.default_policy]
        profile = self.policies.get(name.strip().lower())
        if profile is None:
            raise BadRequest(
                f"unknown routing policy {name!r}; known: {', '.join(self.policies)}",
                param="x-kvgate-policy",
            )
        return profile

    async def route(
        self,
        kind: Kind,
        body: Mapping[str, Any],
        profile: RoutingProfile,
        *,
        session: str | None = None,
        dry_run: bool = False,
    ) -> Routed:
        """Decide where `body` goes. A `dry_run` (the admin API's explanation) tokenizes even
        for load-only policies and records nothing."""
        started = self._clock()
        model = body["model"]
        serving = self._registry.serving(model)
        if not serving:
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        context = _context(model, serving)
        hashes: list[int] = []
        if (profile.uses_prefix or dry_run) and self._tokenizer is not None:
            tokens = await self._tokenize(kind, body, serving)
            if tokens is not None:
                self._check_prompt_length(kind, len(tokens))
                try:
                    hashes = self._table.prefix_hashes(tokens)
                except ValueError:  # the client's own token ids, out of [0, 2**32)
                    raise BadRequest(
                        "prompt token ids must be integers in [0, 2**32)", param="prompt"
                    ) from None
        match_started = self._clock()
        match = (
            self._table.match(context, hashes, [state.name for state in serving])
            if hashes
            else None
        )
        decided = self._clock()
        request = RoutingRequest(model, context, len(hashes), match, session)
        decision = profile.decide(request, serving)
        if self.affinity is not None and decision.ranking:
            _prefer(decision.ranking, self.affinity(model, context, session, hashes))
        finished = self._clock()
        observe = self._metrics.decision_seconds.labels
        observe("match").observe(decided - match_started)
        observe("decide").observe(finished - decided)
        observe("total").observe(finished - started)
        if not decision.ranking:
            raise NoRoutablePod(f"no routable pod for model `{model}` right now")
        routed = Routed(decision, request, hashes)
        if not dry_run:
            # Before any await: the next request of a burst must already see these blocks
            # as expected on the chosen pod, long before its BlockStored arrives.
            self.expect(routed, decision.ranking[0])
        return routed

    async def prompt(
        self, kind: Kind, body: Mapping[str, Any]
    ) -> tuple[ModelContext, list[int]] | None:
        """The prompt's context and token ids as the engines tokenize it (cached), or None
        when the model is unknown or the prompt cannot be tokenized."""
        serving = self._registry.serving(body["model"])
        if not serving or self._tokenizer is None:
            return None
        tokens = await self._tokenize(kind, body, serving)
        return None if tokens is None else (_context(body["model"], serving), tokens)

    def _check_prompt_length(self, kind: Kind, tokens: int) -> None:
        limit = self._max_prompt_tokens
        if limit is not None and tokens > limit:
            raise BadRequest(
                f"the prompt has {tokens} tokens, more than this gateway's limit of {limit} "
                "(KVGATE_MAX_PROMPT_TOKENS)",
                param="messages" if kind == "chat" else "prompt",
            )

    def expect(self, routed: Routed, state: PodState) -> None:
        """The request goes to `state`: expect its blocks there until the engine confirms."""
        if routed.prefix_hashes:
            self._table.add_prefix(state.name, routed.request.context, routed.prefix_hashes)

    def record_served(self, routed: Routed, state: PodState) -> None:
        model = routed.request.model
        self._metrics.prompt_blocks.labels(model).inc(routed.request.prompt_blocks)
        self._metrics.matched_blocks.labels(model).inc(routed.matched_blocks(state.name))

    async def _tokenize(
        self, kind: Kind, body: Mapping[str, Any], serving: list[PodState]
    ) -> list[int] | None:
        assert self._tokenizer is not None
        started = self._clock()
        try:
            what = (
                TokenizeInput.for_chat(body)
                if kind == "chat"
                else TokenizeInput.for_completion(body)
            )
            if isinstance(what, list):
                return what
            before = self._tokenizer.hits
            urls = [s.pod.url for s in serving if s.pod.ready and s.healthy]
            tokens = await self._tokenizer.tokenize(what, urls)
            hit = self._tokenizer.hits > before
            self._metrics.tokenizer.labels("hit" if hit else "miss").inc()
            return tokens
        except TokenizerError:
            self._metrics.tokenizer.labels("failure").inc()
            self._metrics.degraded_routing.labels("tokenizer").inc()
            return None
        finally:
            self._metrics.decision_seconds.labels("tokenize").observe(self._clock() - started)


def _prefer(ranking: list[PodState], name: str | None) -> None:
    """Move the pod named `name` to the front if it is a candidate (it passed the filters)."""
    if name is None or ranking[0].name == name:
        return
    for index, state in enumerate(ranking):
        if state.name == name:
            ranking.insert(0, ranking.pop(index))
            return


def _context(model: str, serving: list[PodState]) -> ModelContext:
    """A LoRA adapter's prefixes live apart from its base model's."""
    base = next((s.pod.model for s in serving if s.pod.model == model), None)
    if base is not None:
        return ModelContext(model)
    return ModelContext(serving[0].pod.model, model)
