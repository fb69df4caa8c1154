"""The request-level opt-in: a chat/completion request carrying `x-kvgate-pin: ttl=SECONDS`
has its conversation pinned on the pod that served it, once the prompt's blocks are stored;
each later turn renews the lease and extends it to the longer prompt (which includes the
previous answer)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from gateway.errors import BadRequest
from gateway.registry import PodState
from gateway.router import Kind, Routed

if TYPE_CHECKING:
    from gateway.state import GatewayState

PIN_HEADER = "x-kvgate-pin"


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
    raise BadRequest(f"{PIN_HEADER} must be `ttl=SECONDS`, got {value!r}", param=PIN_HEADER)


def session_pin_hook(
    gateway: GatewayState,
    header: str | None,
    kind: Kind,
    body: Mapping[str, Any],
    routed: Routed,
    session: str | None,
) -> Callable[[PodState], None] | None:
    """For a request carrying the pin header: what to do once a pod serves it (pin the
    conversation there when its blocks are stored). None when the request did not opt in."""
    pins = gateway.pins
    if header is None or pins is None:
        return None
    ttl = parse_pin_header(header)
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
