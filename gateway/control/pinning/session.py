"""The request-level opt-in: a chat/completion request carrying `x-kvgate-pin: ttl=SECONDS`
has its conversation pinned on the pod that served it, once the prompt's blocks are stored;
each later turn renews the lease and extends it to the longer prompt (which includes the
previous answer)."""

from __future__ import annotations

import hmac
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.control.registry import PodState
from gateway.errors import BadRequest, Forbidden, clip
from gateway.routing.routed import Routed
from gateway.routing.router import Kind
from gateway.settings import Settings

if TYPE_CHECKING:
    from gateway.state import GatewayState

PIN_HEADER = "x-kvgate-pin"
PIN_TOKEN_HEADER = "x-kvgate-pin-token"
"""Carries the pin token (KVGATE_PIN_TOKEN) or the admin token; never sent upstream (the
client's `Authorization` goes to the engine, whose API key it may be)."""


class PinForbidden(Forbidden):
    """A pin asked for without the pin or admin token."""


def authorise_pin(settings: Settings, credential: str | None) -> None:
    """Pinning changes server state: only a caller holding the pin token or the admin token
    may ask for it (403 otherwise, also when neither token is configured)."""
    given = (credential or "").strip().encode()
    for token in (settings.pin_token, settings.admin_token):
        if token is not None and given and hmac.compare_digest(given, token.encode()):
            return
    raise PinForbidden(
        f"{PIN_HEADER} needs authority: send the pin token (KVGATE_PIN_TOKEN) or the admin "
        f"token in {PIN_TOKEN_HEADER}"
        + ("" if settings.pin_token or settings.admin_token else "; none is configured"),
        param=PIN_TOKEN_HEADER,
    )


def parse_pin_header(value: str) -> float | None:
    """`ttl=600` (or `ttl=600s`), `on`/`1`/`true` for the default TTL. Raises BadRequest."""
    value = value.strip().lower()
    if value in ("", "1", "on", "true", "yes"):
        return None
    key, sep, raw = value.partition("=")
    if sep and key.strip() == "ttl":
        try:
            ttl = float(raw.strip().removesuffix("s"))
        except ValueError:
            ttl = -1.0
        if ttl > 0:
            return ttl
    raise BadRequest(f"{PIN_HEADER} must be `ttl=SECONDS`, got {clip(value)!r}", param=PIN_HEADER)


def session_pin_hook(
    gateway: GatewayState,
    header: str | None,
    credential: str | None,
    kind: Kind,
    body: Mapping[str, Any],
    routed: Routed,
    session: str | None,
) -> Callable[[PodState], None] | None:
    """For a request carrying the pin header: what to do once a pod has answered it with a
    2xx (pin the conversation there when its blocks are stored). None when the request did
    not opt in; PinForbidden without the pin or admin token, BadRequest for a bad TTL."""
    pins = gateway.pins
    if header is None:
        return None
    authorise_pin(gateway.settings, credential)
    ttl = parse_pin_header(header)
    limit = gateway.settings.pin_max_ttl_s
    if ttl is not None and ttl > limit:
        raise BadRequest(
            f"{PIN_HEADER} ttl {ttl:g} s exceeds the gateway's maximum of {limit:g} s "
            "(KVGATE_PIN_MAX_TTL)",
            param=PIN_HEADER,
        )
    router = gateway.router
    context = routed.request.context

    def served(state: PodState) -> None:
        async def pin_turn() -> None:
            prompt = await router.prompt(kind, body)
            if prompt is not None:
                await pins.pin_session_turn(model=body["model"], context=context,
                                            tokens=prompt[1], pod=state.name, ttl_s=ttl,
                                            session=session)  # fmt: skip

        pins.schedule(pin_turn())

    return served
