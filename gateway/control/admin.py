"""The admin API: what the gateway knows and why it routes where it does.

Only with `Authorization: Bearer <KVGATE_ADMIN_TOKEN>`; without a configured token the
whole API answers 404.
"""

from __future__ import annotations

import asyncio
import hmac
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.control.persistence import capture_pod
from gateway.control.registry import PodState
from gateway.errors import BadRequest, NotFound, Unauthorized, clip
from gateway.http.api import read_json, requested_policy
from gateway.http.turn import validate
from gateway.observability.logs import REQUEST_ID
from gateway.routing import FEATURES, Prediction, TpotPrediction
from gateway.routing.router import Kind
from gateway.routing.terms import cached_tokens
from gateway.state import GatewayState, state_of
from indexer import EngineHash, Tier, encode_snapshot


def authorized(request: Request) -> GatewayState:
    gateway = state_of(request)
    token = gateway.settings.admin_token
    if token is None:
        raise NotFound("the admin API is disabled: set KVGATE_ADMIN_TOKEN to enable it")
    given = request.headers.get("authorization", "")
    scheme, _, credentials = given.partition(" ")
    # Compared as bytes: compare_digest refuses non-ASCII str (a header can carry any byte).
    given_token = credentials.strip().encode()
    if scheme.lower() != "bearer" or not hmac.compare_digest(given_token, token.encode()):
        raise Unauthorized("admin API: missing or wrong bearer token")
    return gateway


def _wire_form(engine_hash: EngineHash) -> int | str:
    """As the engine published it: ints stay ints, raw digests become hex."""
    return engine_hash.hex() if isinstance(engine_hash, bytes) else engine_hash


def _pod_view(gateway: GatewayState, state: PodState) -> dict[str, Any]:
    pod = state.pod
    status = gateway.registry.subscriber_status(state.name)
    view: dict[str, Any] = {
        "name": pod.name,
        "url": pod.url,
        "model": pod.model,
        "engine": pod.engine,
        "loras": list(pod.loras),
        "ready": pod.ready,
        "healthy": state.healthy,
        "load": {
            "inflight": state.inflight,
            "running": state.running,
            "waiting": state.waiting,
            "kv_usage": state.kv_usage,
        },
        "index": gateway.registry.index_mode(state.name),
        "index_reason": gateway.registry.unindexable_reason(state.name),
        "events": pod.events,
        "subscriber": None,
    }
    if status is not None:
        view["subscriber"] = {
            "phase": status.phase.value,
            "connected": status.connected,
            "last_seq": status.last_seq,
            "whole": status.whole,
            "degraded_reason": status.degraded_reason,
            "replays": status.replays,
            "restarts": status.restarts,
            "gaps": status.gaps,
            "frames_rejected": status.frames_rejected,
            "batches_applied": status.batches_applied,
        }
    if gateway.table.has_pod(state.name):
        view["index_blocks"] = len(gateway.table.dump(state.name))
    return view


async def pods(request: Request) -> Response:
    gateway = authorized(request)
    sync = gateway.replica_sync
    return JSONResponse(
        {
            "pods": [_pod_view(gateway, s) for s in gateway.registry.all()],
            "replica_sync": sync.view() if sync is not None else None,
        }
    )


async def index(request: Request) -> Response:
    gateway = authorized(request)
    name = request.query_params.get("pod")
    if not name:
        raise BadRequest("query parameter `pod` is required", param="pod")
    if gateway.registry.get(name) is None or not gateway.table.has_pod(name):
        raise NotFound(f"no indexed pod named {clip(name)!r}", param="pod")
    status = gateway.registry.subscriber_status(name)
    tiers = gateway.table.dump_tiers(name)
    return JSONResponse(
        {
            "pod": name,
            "state": gateway.registry.index_mode(name),
            "last_seq": status.last_seq if status is not None else None,
            "engine_hashes": {
                tier.name: sorted(_wire_form(h) for h in tiers[tier])
                for tier in (Tier.GPU, Tier.CPU, Tier.STORAGE)
            },
        }
    )


async def match(request: Request) -> Response:
    """Exactly what a routing decision would see for this prompt, without sending it."""
    gateway = authorized(request)
    settings = gateway.settings
    raw, body = await read_json(request, settings.max_body_bytes, settings.body_timeout_s)
    kind: Kind = "chat" if "messages" in body else "completion"
    validate(kind, body)
    profile = gateway.router.policy(requested_policy(request))
    routed = await gateway.router.route(kind, body, profile, body_bytes=len(raw), dry_run=True)
    decision = routed.decision
    result = routed.request.match
    ranked = {state.name: rank for rank, state in enumerate(decision.ranking)}
    pods_view: dict[str, Any] = {}
    predictions = routed.request.state.predictions
    serving = gateway.registry.serving(body["model"])
    names = [state.name for state in serving]
    block_size = gateway.table.config.block_size
    cost = gateway.router.cost
    held = dict(zip(names, cached_tokens(cost, block_size, result, names),
                    strict=True))  # fmt: skip
    for state in serving:
        counts = result.tier_counts(state.name) if result is not None else {}
        prediction = predictions.get(state.name)
        tpot = None if prediction is None else cost.predict_tpot(prediction)
        pods_view[state.name] = {
            "matched_blocks": routed.matched_blocks(state.name),
            "tiers": {tier.name: n for tier, n in counts.items() if n},
            # a profile without scorers scores every eligible pod 0
            "score": decision.scores.get(state.name, 0.0 if state.name in ranked else None),
            "scores": decision.components.get(state.name, {}),
            "rank": ranked.get(state.name),
            "eligible": state.name in ranked,
            "predicted_ttft_ms": None if prediction is None else prediction.ttft_s * 1e3,
            "prediction": None
            if prediction is None
            else _prediction_view(prediction, routed.request.prompt_tokens - held[state.name]),
            # as if it were streamed: the time per output token after the first
            "predicted_tpot_ms": None if tpot is None else tpot.tpot_s * 1e3,
            "tpot_prediction": None if tpot is None else _tpot_view(tpot),
        }
    return JSONResponse(
        {
            "request_id": REQUEST_ID.get(),  # as in the log lines about this explanation
            "model": body["model"],
            "policy": decision.policy,
            "prompt_blocks": routed.request.prompt_blocks,
            "prompt_tokens": routed.request.prompt_tokens,
            # false: the tokenizer failed, and the prompt is costed from the body's size
            "prompt_tokenized": routed.request.prompt_tokenized,
            "body_bytes_per_token": gateway.router.prompt_sizes.bytes_per_token(body["model"]),
            "chosen": decision.ranking[0].name if decision.ranking else None,
            "pods": pods_view,
        }
    )


def _prediction_view(prediction: Prediction, uncached_tokens: float) -> dict[str, Any]:
    """The cost model's terms for one pod: inputs, learned coefficients, each term in ms.
    Token counts of prefill work include the attention over the cached context
    (`KVGATE_COST_CONTEXT_SHARE`): the request's own is also given as plain tokens."""
    return {
        "own_uncached_tokens": max(0.0, uncached_tokens),
        "own_work_tokens": prediction.own_tokens,
        "queued_prefill_tokens": prediction.queued_tokens,
        "queued_requests": prediction.queued_requests,
        "decoding_sequences": prediction.decoding,
        "busy": prediction.busy == 1.0,
        "step_remaining_ms": prediction.step_remaining_s * 1e3,
        "in_step_tokens": prediction.in_step_tokens,
        "speed": prediction.speed,
        # what sending it there adds to the TTFTs of those queued for the next step (the
        # picker charges it × delay_weight)
        "delay_to_queued_ms": prediction.delay_to_queued_s() * 1e3,
        "coefficients": dict(zip(FEATURES, prediction.pod_coefficients(), strict=True)),
        "terms_ms": {name: value * 1e3 for name, value in prediction.terms().items()},
    }


def _tpot_view(tpot: TpotPrediction) -> dict[str, Any]:
    """The TPOT model's terms for one pod."""
    return {
        "decoding_sequences": tpot.sequences,
        "prefill_tokens_per_s": tpot.prefill_rate,
        "requests_per_s": tpot.arrival_rate,
        "decode_speed": tpot.speed,
        "terms_ms": {name: value * 1e3 for name, value in tpot.terms().items()},
    }


async def cost_model(request: Request) -> Response:
    """The learned TTFT models (the fleet's and each answered pod's), for a new replica."""
    gateway = authorized(request)
    return JSONResponse(gateway.router.cost.export())


async def snapshot(request: Request) -> Response:
    """The pod's index snapshot now (the snapshot file format), for a new replica."""
    gateway = authorized(request)
    name = request.query_params.get("pod")
    if not name:
        raise BadRequest("query parameter `pod` is required", param="pod")
    subscribers = gateway.subscribers
    taken = None
    if gateway.registry.get(name) is not None and subscribers is not None:
        taken = capture_pod(gateway.table, subscribers, name)
    if taken is None:
        raise NotFound(
            f"no snapshot of pod {clip(name)!r} now (unknown, or being rebuilt)", param="pod"
        )
    data = await asyncio.to_thread(encode_snapshot, taken)
    headers = {"x-kvgate-snapshot-seq": str(taken.seq)}
    return Response(data, media_type="application/octet-stream", headers=headers)


routes = [
    Route("/admin/pods", pods, methods=["GET"]),
    Route("/admin/index", index, methods=["GET"]),
    Route("/admin/snapshot", snapshot, methods=["GET"]),
    Route("/admin/cost-model", cost_model, methods=["GET"]),
    Route("/admin/match", match, methods=["POST"]),
]
