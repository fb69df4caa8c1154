"""One routing decision: tokenize, hash, match against the index, run the policy."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from gateway.control.registry import PodRegistry, PodState
from gateway.errors import BadRequest, ModelNotFound, NoRoutablePod, SloUnreachable, clip
from gateway.routing import (
    Predictor,
    RoutingProfile,
    RoutingRequest,
    Ticket,
    predict_all,
)
from gateway.routing.conversation import opens_conversation, preamble_share
from gateway.routing.metrics import RouterMetrics
from gateway.routing.policies import build_policies, plugin_context
from gateway.routing.prediction_log import log_prediction, prediction_logger
from gateway.routing.prompt_size import PromptSizes
from gateway.routing.routed import DecisionSink, Routed
from gateway.settings import AIBRIX_STRATEGIES
from gateway.upstream.prompt_tokenizer import PromptTokenizer
from gateway.upstream.tokenizer import TokenizeInput, TokenizerError
from indexer import ModelContext, SyncPrefixHashTable

__all__ = ["Kind", "Router", "build_policies", "log_prediction", "opens_conversation",
           "plugin_context", "preamble_share", "prediction_logger"]  # fmt: skip

Kind = Literal["chat", "completion"]


class Router:
    def __init__(
        self,
        *,
        registry: PodRegistry,
        table: SyncPrefixHashTable,
        tokenizer: PromptTokenizer | None,
        policies: Mapping[str, RoutingProfile],
        default_policy: str,
        metrics: RouterMetrics,
        cost: Predictor,
        sink: DecisionSink | None = None,
        clock: Callable[[], float] = time.perf_counter,
        max_prompt_tokens: int | None = None,
        log_predictions: bool = False,
        prompt_sizes: PromptSizes | None = None,
    ) -> None:
        self._registry = registry
        self._table = table
        self._block_size = table.config.block_size
        self._tokenizer = tokenizer
        self.policies = dict(policies)
        self.default_policy = default_policy
        self._metrics = metrics
        self._stages = {
            stage: metrics.decision_seconds.labels(stage)
            for stage in ("tokenize", "match", "decide", "total")
        }
        self.cost = cost
        self._clock = clock
        self._max_prompt_tokens = max_prompt_tokens
        self.prompt_sizes = prompt_sizes or PromptSizes()
        """What a prompt that was not tokenized is costed at (learned from those counted)."""
        self._sink = sink
        """Hears of every routed request's life when replicas share their decisions
        (`gateway/control/replication/`)."""
        self._log_predictions = log_predictions
        if log_predictions:  # whatever the gateway's log level (`KVGATE_PREDICTION_LOG`)
            prediction_logger.setLevel(logging.INFO)

    def policy(self, name: str | None) -> RoutingProfile:
        if name is None:
            return self.policies[self.default_policy]
        key = name.strip().lower()
        profile = self.policies.get(key) or self.policies.get(AIBRIX_STRATEGIES.get(key, ""))
        if profile is None:
            raise BadRequest(
                f"unknown routing policy {clip(name)!r}; known: {', '.join(self.policies)}; AIBrix "
                f"strategies: {', '.join(AIBRIX_STRATEGIES)}",
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
        slo_ttft_s: float | None = None,
        slo_tpot_s: float | None = None,
        body_bytes: int = 0,
        client: str = "",
        dry_run: bool = False,
        only: Callable[[PodState], bool] | None = None,
    ) -> Routed:
        """Decide where `body` goes, in three stages: what the decision looks at (the
        prompt tokenized, hashed and matched), the profile's decision, and its commitment
        to the chosen pod. A `dry_run` (the admin API's explanation) tokenizes even for
        load-only policies, predicts every pod's TTFT and commits nothing. `only`: the
        pods the request may go to (an endpoint picker's subset hint); none of them serving
        the model is a NoRoutablePod."""
        started = self._clock()
        serving = self._registry.serving(body["model"])
        if not serving:
            raise ModelNotFound(f"The model `{clip(body['model'])}` does not exist.", param="model")
        if only is not None:
            serving = [state for state in serving if only(state)]
            if not serving:
                raise NoRoutablePod(
                    f"no pod of the request's subset serves model `{clip(body['model'])}`"
                )
        request = await self._routing_request(
            kind, body, serving, prefix=profile.uses_prefix or dry_run, session=session,
            slo_ttft_s=slo_ttft_s, slo_tpot_s=slo_tpot_s, body_bytes=body_bytes, client=client,
            only=only,
        )  # fmt: skip
        routed = self._decide(request, profile, serving, started)
        if dry_run:
            predict_all(self.cost, self._block_size, request, serving)
        else:
            # Before any await: the next request of a burst must already see these blocks
            # as expected on the chosen pod, and this request's prefill queued there.
            self.dispatch(routed, routed.decision.ranking[0])
        return routed

    async def _routing_request(
        self,
        kind: Kind,
        body: Mapping[str, Any],
        serving: list[PodState],
        *,
        prefix: bool,
        session: str | None,
        slo_ttft_s: float | None,
        slo_tpot_s: float | None,
        body_bytes: int,
        client: str,
        only: Callable[[PodState], bool] | None = None,
    ) -> RoutingRequest:
        """What the decision looks at: the prompt's blocks and where each is cached. A
        policy that does not read prefixes (`prefix` false) still gets an exact token count
        where the model is tokenized in-process (it costs no engine anything)."""
        model = body["model"]
        context = self._registry.context(model)
        names, routable, routable_names = self._candidates(model, serving, only)
        hashes: list[int] = []
        tokens: list[int] | None = None
        if prefix or await self._tokenizes_locally(model):
            tokens = await self._tokenize(kind, body, routable, for_prefix=prefix)
            if tokens is not None:
                self._check_prompt_length(kind, len(tokens))
                if prefix:
                    hashes = self._hashes(tokens)
                self.prompt_sizes.learn(model, client, body_bytes, len(tokens))
        match_started = self._clock()
        match = self._table.match(context, hashes, names) if hashes else None
        self._stages["match"].observe(self._clock() - match_started)
        opens = kind == "chat" and opens_conversation(body)
        return RoutingRequest(
            model,
            context,
            len(hashes),
            match,
            session,
            prompt_tokens=len(tokens)
            if tokens is not None
            else self.prompt_sizes.tokens(model, client, body_bytes),
            prompt_tokenized=tokens is not None,
            client=client,
            prefix_hashes=hashes,
            body_bytes=body_bytes,
            slo_ttft_s=slo_ttft_s,
            slo_tpot_s=slo_tpot_s,
            streamed=bool(body.get("stream")),
            opens_conversation=opens,
            preamble_share=preamble_share(body) if opens else 0.0,
            candidates=serving,
            routable=routable,
            routable_names=routable_names,
        )

    def _candidates(
        self, model: str, serving: list[PodState], only: Callable[[PodState], bool] | None
    ) -> tuple[tuple[str, ...], tuple[PodState, ...], tuple[str, ...]]:
        """`serving`'s names, and the routable pods among them with their names (taken
        before any await); `only`: `serving` is already the subset."""
        routable, routable_names = self._registry.routable_serving(model)
        if only is None:
            return self._registry.serving_names(model), routable, routable_names
        routable = tuple(state for state in routable if only(state))
        names = tuple(state.name for state in serving)
        return names, routable, tuple(state.name for state in routable)

    def _decide(
        self,
        request: RoutingRequest,
        profile: RoutingProfile,
        serving: list[PodState],
        started: float,
    ) -> Routed:
        """The profile's ranking of the pods (SLO shedding counted)."""
        decide_started = self._clock()
        try:
            decision = profile.decide(request, serving)
        except SloUnreachable:
            if request.slo_ttft_s is not None:
                self._metrics.slo.labels("shed").inc()
            if request.slo_tpot_s is not None and request.streamed:
                self._metrics.slo_tpot.labels("shed").inc()
            raise
        finished = self._clock()
        self._stages["decide"].observe(finished - decide_started)
        self._stages["total"].observe(finished - started)
        if not decision.ranking:
            raise NoRoutablePod(f"no routable pod for model `{clip(request.model)}` right now")
        return Routed(decision, request)

    def dispatch(self, routed: Routed, state: PodState) -> None:
        """The request goes to `state` (first choice or retry): expect its blocks there
        until the engine confirms, and queue its prefill in the cost model."""
        if routed.prefix_hashes:
            self._table.add_prefix(state.name, routed.request.context, routed.prefix_hashes)
        if routed.ticket is not None:
            self._finish_ticket(routed.ticket)
        request = routed.request
        prediction = predict_all(self.cost, self._block_size, request, [state])[state.name]
        longest = request.match.longest() if request.match is not None else 0
        routed.ticket = ticket = self.cost.start(
            prediction,
            streamed=request.streamed,
            # only a tokenized prompt's prediction knows its cached share: learn from those
            learn=request.prompt_blocks > 0,
            prompt_tokens=request.prompt_tokens,
            fleet_own_tokens=max(0.0, request.prompt_tokens - longest * self._block_size),
        )
        if self._sink is not None:
            # Only the blocks the pod does not hold yet: the peers' own view has the rest
            # (the same engine events, our earlier decisions), and a long conversation's
            # turn then costs them a few blocks, not its whole history.
            held = routed.matched_blocks(state.name)
            self._sink.decided(ticket, request.context, routed.prefix_hashes[held:])
        slo = request.slo_ttft_s
        if slo is not None:
            met = prediction.ttft_s <= slo
            self._metrics.slo.labels("predicted_met" if met else "predicted_missed").inc()
        slo = request.slo_tpot_s
        if slo is not None and ticket.tpot is not None:  # an answer not streamed has no TPOT
            met = ticket.tpot.tpot_s <= slo
            self._metrics.slo_tpot.labels("predicted_met" if met else "predicted_missed").inc()

    def first_byte(self, routed: Routed, state: PodState) -> None:
        """The chosen pod's first body byte came back: learn from the observed TTFT."""
        ticket = routed.ticket
        if ticket is None or ticket.pod != state.name:
            return
        observed = self.cost.first_byte(ticket)
        if self._sink is not None:
            self._sink.answered(ticket)
        if observed is None:
            return
        error = observed - ticket.prediction.ttft_s
        self._metrics.prediction_error.labels(state.name).observe(error)
        if self._log_predictions:
            log_prediction(ticket, observed)
        slo = routed.request.slo_ttft_s
        if slo is not None:
            self._metrics.slo.labels("observed_met" if observed <= slo else "observed_missed").inc()

    def finish(
        self,
        routed: Routed,
        completion_tokens: int | None = None,
        engine_prompt_tokens: int | None = None,
    ) -> None:
        """The exchange is over, however it ended (`completion_tokens`: it was served with
        a 2xx and relayed that many; a stream then teaches the TPOT model;
        `engine_prompt_tokens`: the engine's own count of the prompt, which teaches what a
        prompt that was not tokenized is costed at)."""
        request = routed.request
        if engine_prompt_tokens is not None and not request.prompt_tokenized:
            self.prompt_sizes.learn(
                request.model, request.client, request.body_bytes, engine_prompt_tokens
            )
        ticket = routed.ticket
        if ticket is None:
            return
        if completion_tokens is not None and ticket.phase == "decode":
            observed = self.cost.stream_ended(ticket, completion_tokens)
            if observed is not None and ticket.tpot is not None:
                error = observed - ticket.tpot.tpot_s
                self._metrics.tpot_prediction_error.labels(ticket.pod).observe(error)
                slo = routed.request.slo_tpot_s
                if slo is not None:
                    outcome = "observed_met" if observed <= slo else "observed_missed"
                    self._metrics.slo_tpot.labels(outcome).inc()
        self._finish_ticket(ticket)

    def _finish_ticket(self, ticket: Ticket) -> None:
        if ticket.phase == "done":
            return
        self.cost.finish(ticket)
        if self._sink is not None:
            self._sink.finished(ticket)

    def _hashes(self, tokens: list[int]) -> list[int]:
        try:
            return self._table.prefix_hashes(tokens)
        except ValueError:  # the client's own token ids, out of [0, 2**32)
            raise BadRequest(
                "prompt token ids must be integers in [0, 2**32)", param="prompt"
            ) from None

    async def prompt(
        self, kind: Kind, body: Mapping[str, Any]
    ) -> tuple[ModelContext, list[int]] | None:
        """The prompt's context and token ids as the engines tokenize it (cached), or None
        when the model is unknown or the prompt cannot be tokenized."""
        serving = self._registry.serving(body["model"])
        if not serving:
            return None
        context = self._registry.context(body["model"])
        routable, _ = self._registry.routable_serving(body["model"])
        tokens = await self._tokenize(kind, body, routable, refusal_is_final=True)
        return None if tokens is None else (context, tokens)

    def _check_prompt_length(self, kind: Kind, tokens: int) -> None:
        limit = self._max_prompt_tokens
        if limit is not None and tokens > limit:
            raise BadRequest(
                f"the prompt has {tokens} tokens, more than this gateway's limit of {limit} "
                "(KVGATE_MAX_PROMPT_TOKENS)",
                param="messages" if kind == "chat" else "prompt",
            )

    def record_served(self, routed: Routed, state: PodState) -> None:
        model = routed.request.model
        self._metrics.prompt_blocks.labels(model).inc(routed.request.prompt_blocks)
        self._metrics.matched_blocks.labels(model).inc(routed.matched_blocks(state.name))

    async def _tokenizes_locally(self, model: str) -> bool:
        return (
            self._tokenizer is not None and await self._tokenizer.local_tokenizer(model) is not None
        )

    async def _tokenize(
        self,
        kind: Kind,
        body: Mapping[str, Any],
        routable: Sequence[PodState],
        *,
        for_prefix: bool = True,
        refusal_is_final: bool = False,
    ) -> list[int] | None:
        """The prompt's token ids, or None. Not `for_prefix` (a load-only policy, counting
        the prompt): in-process only, and a failure does not degrade its routing. With
        `refusal_is_final` (nothing is sent on to an engine that would say it), a request
        the tokenizer refused is a BadRequest with the tokenizer's reason."""
        started = self._clock()
        try:
            what = (
                TokenizeInput.for_chat(body)
                if kind == "chat"
                else TokenizeInput.for_completion(body)
            )
            if isinstance(what, list):
                return what  # token ids: nothing to tokenize, with or without a tokenizer
            if self._tokenizer is None:
                return None
            pods = [(s.pod.url, s.pod.engine) for s in routable]
            tokenized = await self._tokenizer.tokenize(body["model"], what, pods, remote=for_prefix)
            result = "hit" if tokenized.hit else "miss"
            self._metrics.tokenizer.labels(result, tokenized.where).inc()
            return tokenized.tokens
        except TokenizerError as exc:
            self._metrics.tokenizer.labels("failure", exc.where).inc()
            if exc.refused and refusal_is_final:
                param = "messages" if kind == "chat" else "prompt"
                raise BadRequest(str(exc), param=param) from None
            if for_prefix:
                self._metrics.degraded_routing.labels("tokenizer").inc()
            return None
        finally:
            self._stages["tokenize"].observe(self._clock() - started)
