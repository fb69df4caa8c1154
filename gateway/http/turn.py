"""One generation request's life, shared by the proxy (`gateway.http.api`) and the endpoint
picker (`gateway.epp`): its body parsed and checked, its routing decision from its headers
(policy, session, SLO objectives, pin opt-in), and the hooks its answer calls (the first
byte trains the cost model; the end, reached exactly once, finishes the decision's
bookkeeping and counts the tokens)."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Callable, Mapping
from typing import Any

import xxhash

from gateway.control.pinning.session import PIN_HEADER, PIN_TOKEN_HEADER, session_pin_hook
from gateway.control.registry import PodState
from gateway.errors import BadRequest
from gateway.routing import RoutingProfile
from gateway.routing.routed import Routed
from gateway.routing.router import Kind
from gateway.state import GatewayState
from gateway.upstream.tokenizer import is_token_ids
from gateway.upstream.usage import UsageMeter

POLICY_HEADERS = ("x-kvgate-policy", "routing-strategy")
SLO_TTFT_HEADER = "x-slo-ttft-ms"
SLO_TPOT_HEADER = "x-slo-tpot-ms"
_POLICY_HEADERS = tuple(name.encode("latin-1") for name in POLICY_HEADERS)
_PIN_HEADER = PIN_HEADER.encode("latin-1")
_PIN_TOKEN_HEADER = PIN_TOKEN_HEADER.encode("latin-1")
SLO_HEADERS = {name: name.encode("latin-1") for name in (SLO_TTFT_HEADER, SLO_TPOT_HEADER)}

Headers = Mapping[bytes, bytes]
"""Each request header's first value by its lower-case name."""

# JSON may escape a UTF-16 surrogate (\ud800-\udfff); paired ones decode to one code point,
# a lone one stays a surrogate that no UTF-8 encoder (the tokenizer's, the engine's) accepts.
_ESCAPED_SURROGATE = re.compile(rb"\\u[dD][89abcdefABCDEF][0-9a-fA-F]{2}")


def parse_json(raw: bytes) -> dict[str, Any]:
    """A request body as a JSON object, or BadRequest."""
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadRequest(f"request body is not valid JSON: {exc}") from None
    except RecursionError:  # json's C decoder recurses per nesting level
        raise BadRequest("request body is nested too deeply") from None
    if not isinstance(body, dict):
        raise BadRequest("request body must be a JSON object")
    if _ESCAPED_SURROGATE.search(raw):
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise BadRequest(
                "request body contains a lone UTF-16 surrogate (\\ud800-\\udfff): not valid Unicode"
            ) from None
    return body


def validate(kind: Kind, body: dict[str, Any]) -> None:
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequest("`model` is required and must be a non-empty string", param="model")
    if "stream" in body and not isinstance(body["stream"], bool):
        raise BadRequest("`stream` must be a boolean", param="stream")
    if kind == "chat":
        messages = body.get("messages")
        if (
            not isinstance(messages, list)
            or not messages
            or not all(isinstance(message, dict) for message in messages)
        ):
            raise BadRequest("`messages` must be a non-empty list of objects", param="messages")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list) or (isinstance(prompt, list) and not prompt):
            raise BadRequest(
                "`prompt` must be a string, a list of strings or a list of token ids",
                param="prompt",
            )
        if isinstance(prompt, list):
            _check_prompt_list(prompt)


def _check_prompt_list(prompt: list[Any]) -> None:
    """A list prompt is strings, token ids, or lists of token ids."""
    if all(isinstance(item, str) for item in prompt) or is_token_ids(prompt):
        return
    if all(isinstance(item, list) and item and is_token_ids(item) for item in prompt):
        return
    raise BadRequest(
        "`prompt` must be a string, a list of strings, or token ids (integers in [0, 2**32), "
        "not booleans), or a list of lists of them",
        param="prompt",
    )


def header(headers: Headers, name: bytes) -> str | None:
    value = headers.get(name)
    return None if value is None else value.decode("latin-1")


def policy_named(headers: Headers) -> str | None:
    """The policy the request names (`x-kvgate-policy`, or AIBrix's `routing-strategy`)."""
    for name in _POLICY_HEADERS:
        value = headers.get(name)
        if value:
            return value.decode("latin-1")
    return None


def objective(headers: Headers, name: str) -> float | None:
    """The client's objective `name` (`x-slo-ttft-ms`, `x-slo-tpot-ms`) in seconds, or None."""
    raw = header(headers, SLO_HEADERS[name])
    if raw is None:
        return None
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise BadRequest(f"{name} must be a positive number of milliseconds", param=name)
    return value / 1e3


def client_key(headers: Headers, peer: str) -> str:
    """Who sent a request, for what is learned per client: its credentials (hashed, never
    kept) where it sends any, else its address."""
    credentials = headers.get(b"authorization")
    if credentials:
        return "key:" + xxhash.xxh64_hexdigest(credentials)
    return "addr:" + peer


class Turn:
    """One routed request: its decision (`routed`) and the hooks of its answer. `on_done`
    ends the decision's bookkeeping once, however often it is called."""

    def __init__(
        self,
        gateway: GatewayState,
        routed: Routed,
        profile: RoutingProfile,
        model: str,
        arrived: float,
        pin_turn: Callable[[PodState], None] | None,
    ) -> None:
        self.gateway = gateway
        self.routed = routed
        self.profile = profile
        self.model = model
        self.arrived = arrived
        self.meter = UsageMeter()
        self.served_status = 0
        self._pin_turn = pin_turn
        self._done = False

    @classmethod
    async def decide(
        cls,
        gateway: GatewayState,
        kind: Kind,
        raw: bytes,
        body: dict[str, Any],
        headers: Headers,
        *,
        peer: str,
        arrived: float,
        only: Callable[[PodState], bool] | None = None,
    ) -> Turn:
        """Validate `body` and route it (`only`: the pods it may go to)."""
        validate(kind, body)
        router = gateway.router
        profile = router.policy(policy_named(headers))
        session = header(headers, gateway.settings.session_header.encode("latin-1"))
        routed = await router.route(
            kind, body, profile, session=session, slo_ttft_s=objective(headers, SLO_TTFT_HEADER),
            slo_tpot_s=objective(headers, SLO_TPOT_HEADER), body_bytes=len(raw),
            client=client_key(headers, peer), only=only,
        )  # fmt: skip
        pin_turn = session_pin_hook(gateway, header(headers, _PIN_HEADER),
                                    header(headers, _PIN_TOKEN_HEADER), kind, body, routed,
                                    session)  # fmt: skip
        return cls(gateway, routed, profile, body["model"], arrived, pin_turn)

    @property
    def first(self) -> PodState:
        """The pod the decision chose."""
        return self.routed.decision.ranking[0]

    def on_attempt(self, state: PodState) -> None:
        if state is not self.first:  # a retry: the blocks and the prefill go to this pod
            self.gateway.router.dispatch(self.routed, state)

    def on_served(self, state: PodState, status: int) -> None:
        self.served_status = status
        self.gateway.router.record_served(self.routed, state)
        if self._pin_turn is not None and 200 <= status < 300:  # x-kvgate-pin: pin it there
            self._pin_turn(state)

    def on_first_byte(self, state: PodState) -> None:
        self.gateway.router.first_byte(self.routed, state)
        elapsed = time.perf_counter() - self.arrived
        self.gateway.metrics.http.model_ttft.labels(self.model).observe(elapsed)

    def on_done(self) -> None:
        if self._done:
            return
        self._done = True
        router, metrics, model = self.gateway.router, self.gateway.metrics.http, self.model
        metrics.model_duration.labels(model).observe(time.perf_counter() - self.arrived)
        if not 200 <= self.served_status < 300:
            router.finish(self.routed)
            return
        request = self.routed.request
        usage = self.meter.usage(request.prompt_tokens if request.prompt_tokenized else None)
        engine_prompt = usage.prompt_tokens if usage.source == "engine" else None
        router.finish(self.routed, usage.completion_tokens, engine_prompt)
        if usage.prompt_tokens is not None:
            metrics.prompt_tokens.labels(model, usage.source).inc(usage.prompt_tokens)
        metrics.completion_tokens.labels(model, usage.source).inc(usage.completion_tokens)
