"""A pick: the proxy's own routing decision (`gateway.http.turn.Turn`) for a request an
Envoy data plane holds, restricted to the pods it may name, booked in flight on the chosen
pod until its answer ends, as the proxy books a request it forwards."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from gateway.control.discovery import Pod
from gateway.control.registry import PodState
from gateway.errors import GatewayError, NotFound, PayloadTooLarge
from gateway.http.client_address import TrustedProxies
from gateway.http.turn import Turn, parse_json
from gateway.routing.router import Kind
from gateway.state import GatewayState

KINDS: dict[str, Kind] = {"/v1/chat/completions": "chat", "/v1/completions": "completion"}


def endpoint_of(pod: Pod) -> str:
    """The pod's `ip:port`, as the data plane connects to it (`[ip]:port` for IPv6)."""
    url = urlsplit(pod.url)
    host = url.hostname or ""
    port = url.port or (443 if url.scheme == "https" else 80)
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def within(subset: tuple[str, ...]) -> Callable[[PodState], bool]:
    """Whether a pod is in the data plane's subset: `ip:port` entries, or a bare `ip` (any
    port of it)."""
    allowed = frozenset(subset)

    def allows(state: PodState) -> bool:
        endpoint = endpoint_of(state.pod)
        return endpoint in allowed or endpoint.rpartition(":")[0].strip("[]") in allowed

    return allows


def kind_of(path: str) -> Kind:
    kind = KINDS.get(path.partition("?")[0])
    if kind is None:
        raise NotFound(
            "the endpoint picker routes POST /v1/chat/completions and /v1/completions only"
        )
    return kind


@dataclass(frozen=True, slots=True)
class Labels:
    """What the request's counters are labelled with (`Upstream.release`)."""

    model: str
    policy: str


class Booking:
    """A picked request in flight on its pod: what its answer tells (status, chunks) trains
    the cost model as the proxy's relay does; `release` ends it, once."""

    def __init__(self, gateway: GatewayState, turn: Turn, state: PodState) -> None:
        self._gateway = gateway
        self.turn = turn
        self.state = state
        self.endpoint = endpoint_of(state.pod)
        self.status = 0
        self._labels = Labels(turn.model, turn.profile.name)
        self._started = time.perf_counter()
        self._first = True
        self.released = False
        gateway.upstream.acquire(state)

    def answered(self, status: int) -> None:
        """The pod's response headers, with their status."""
        self.status = status
        self.turn.on_served(self.state, status)

    def chunk(self, data: bytes) -> None:
        """A piece of the pod's answer passed through the data plane."""
        if not data:
            return
        upstream = self._gateway.upstream
        if upstream.pulse is not None:
            upstream.pulse(self.state.name)
        if self._first:
            self._first = False
            upstream.first_byte(self.state, self._started)
            self.turn.on_first_byte(self.state)
        self.turn.meter.feed(data)

    def release(self, outcome: str | None = None) -> None:
        """The answer ended (`outcome`: its status by default; `client_disconnect` when the
        stream ended before it)."""
        if self.released:
            return
        self.released = True
        outcome = outcome or str(self.status)
        self._gateway.upstream.release(self.state, self._labels, outcome)
        self.turn.on_done()


class Picker:
    """Picks for one gateway (its router, registry, cost model and booking)."""

    def __init__(self, gateway: GatewayState) -> None:
        self.gateway = gateway
        self.max_body_bytes = gateway.settings.max_body_bytes
        self.proxies = TrustedProxies(gateway.settings.trusted_proxies)
        """The proxies in front of the data plane (`KVGATE_TRUSTED_PROXIES`): forwarded
        hops the client is looked for beyond."""

    def check_size(self, size: int) -> None:
        if size > self.max_body_bytes:
            raise PayloadTooLarge(f"request body exceeds the {self.max_body_bytes}-byte limit")

    async def pick(
        self,
        kind: Kind,
        raw: bytes,
        headers: Mapping[bytes, bytes],
        subset: tuple[str, ...] | None,
        peer: str,
    ) -> Booking:
        """Route the request (GatewayError when it cannot go anywhere) and book it."""
        arrived = time.perf_counter()
        body = parse_json(raw)
        only = within(subset) if subset is not None else None
        turn = await Turn.decide(
            self.gateway, kind, raw, body, headers, peer=peer, arrived=arrived, only=only
        )
        return Booking(self.gateway, turn, turn.first)

    def refused(self, error: GatewayError) -> None:
        self.gateway.metrics.http.rejected.labels(type(error).__name__).inc()
        self.gateway.metrics.epp.picks.labels("refused").inc()
