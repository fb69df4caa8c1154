"""Admin routes of pinning (bearer token, like the rest of the admin API):
`POST /admin/pin`, `POST /admin/unpin`, `GET /admin/pins`."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from gateway.control.admin import authorized
from gateway.errors import BadRequest, NotFound, UpstreamError, clip
from gateway.http.api import read_json
from gateway.http.turn import validate
from gateway.routing.router import Kind


def _ttl(body: Mapping[str, Any]) -> float | None:
    ttl = body.get("ttl_s")
    if ttl is None:
        return None
    if isinstance(ttl, bool) or not isinstance(ttl, int | float):
        raise BadRequest("`ttl_s` must be a number of seconds", param="ttl_s")
    return float(ttl)


async def pin(request: Request) -> Response:
    gateway = authorized(request)
    pins = gateway.pins
    _, body = await read_json(request, gateway.settings.max_body_bytes)
    kind: Kind = "chat" if "messages" in body else "completion"
    validate(kind, body)
    ttl = _ttl(body)
    model = body["model"]
    serving = gateway.registry.serving(model)
    if not serving:
        raise NotFound(f"The model `{clip(model)}` does not exist.", param="model")
    pod = body.get("pod")
    if pod is not None and not any(state.name == pod for state in serving):
        raise NotFound(f"no pod named {clip(str(pod))!r} serves `{clip(model)}`", param="pod")
    prompt = await gateway.router.prompt(kind, body)
    if prompt is None:
        raise UpstreamError("the prompt could not be tokenized, so its blocks are unknown")
    context, tokens = prompt
    if pod is None:
        # The pod holding most of the prompt; none holds any: where routing would send it.
        match = gateway.table.match(
            context, gateway.table.prefix_hashes(tokens), [s.name for s in serving]
        )
        best = match.best()
        if best is not None:
            pod = best[0]
        else:
            profile = gateway.router.policy(None)
            routed = await gateway.router.route(kind, body, profile, dry_run=True)
            pod = routed.decision.ranking[0].name
    lease = await pins.pin(model=model, context=context, tokens=tokens, pod=pod, ttl_s=ttl)
    return JSONResponse(lease.view(time.monotonic()))


async def unpin(request: Request) -> Response:
    gateway = authorized(request)
    pins = gateway.pins
    _, body = await read_json(request, gateway.settings.max_body_bytes)
    lease_id = body.get("id")
    if not isinstance(lease_id, str) or not lease_id:
        raise BadRequest("`id` (a pin id from POST /admin/pin) is required", param="id")
    blocks = len(lease.held) if (lease := pins.book.get(lease_id)) is not None else 0
    if await pins.unpin(lease_id) is None:
        raise NotFound(f"no pin with id {clip(lease_id)!r}", param="id")
    return JSONResponse({"id": lease_id, "unpinned": True, "blocks": blocks})


async def list_pins(request: Request) -> Response:
    gateway = authorized(request)
    pins = gateway.pins
    now = time.monotonic()
    return JSONResponse(
        {
            "pins": [lease.view(now) for lease in pins.leases()],
            "pods": pins.pod_views(),
        }
    )


routes = [
    Route("/admin/pin", pin, methods=["POST"]),
    Route("/admin/unpin", unpin, methods=["POST"]),
    Route("/admin/pins", list_pins, methods=["GET"]),
]
