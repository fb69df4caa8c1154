"""Who a request came from: the TCP peer, or the client a trusted proxy forwarded it for.

`KVGATE_TRUSTED_PROXIES` names the proxies in front of the gateway (addresses or CIDR
ranges: an ingress controller, a Gateway API implementation, an HTTP load balancer, a
mesh sidecar). Only when a request's TCP peer is one of them is its client read from
`X-Forwarded-For` (or, when the request carries none, from `Forwarded: for=`): the
right-most address that is not itself a trusted proxy. Each proxy appends the address it
received the request from, so the entries right of the client are trusted hops and those
left of it are whatever the client claimed. A request from any other peer keeps its
peer's address, whatever headers it sends: a client cannot spoof its way out of its
limits. Unset (the default), no proxy is trusted.

The resolved address replaces `scope["client"]` (port 0), so everything that asks who the
client is gets the same answer: the per-client body limit (`gateway/http/limits.py`) and the
per-client prompt sizes (`api.client_key`). uvicorn's own proxy-header handling (which
trusts 127.0.0.1 unless told otherwise) is turned off where the gateway runs uvicorn: this
is the only one.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_X_FORWARDED_FOR = b"x-forwarded-for"
_FORWARDED = b"forwarded"
_MAX_CACHED_PEERS = 4096


def _address(token: str) -> Address | None:
    """The IP address in a forwarded entry (`1.2.3.4`, `1.2.3.4:80`, `[::1]:80`, `::1`,
    quoted in `Forwarded`), IPv4-mapped IPv6 as IPv4; None for anything else (`unknown`,
    an obfuscated `_name`)."""
    token = token.strip().strip('"')
    if token.startswith("["):
        token = token[1 : token.find("]")] if "]" in token else ""
    elif token.count(":") == 1:  # IPv4 with a port
        token = token.partition(":")[0]
    try:
        address = ipaddress.ip_address(token)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class TrustedProxies:
    """The proxies whose forwarding headers are believed, and the client they name."""

    def __init__(self, networks: Iterable[str]) -> None:
        self.networks: tuple[Network, ...] = tuple(
            ipaddress.ip_network(network, strict=False) for network in networks
        )
        self._peers: dict[str, bool] = {}
        """Whether each peer seen is trusted (bounded: cleared when full)."""

    def __bool__(self) -> bool:
        return bool(self.networks)

    def trusts_peer(self, host: str) -> bool:
        trusted = self._peers.get(host)
        if trusted is None:
            address = _address(host)
            trusted = address is not None and self._trusts(address)
            if len(self._peers) >= _MAX_CACHED_PEERS:
                self._peers.clear()
            self._peers[host] = trusted
        return trusted

    def _trusts(self, address: Address) -> bool:
        return any(address in network for network in self.networks)

    def client(self, peer: str, headers: Iterable[tuple[bytes, bytes]]) -> str:
        """The client of a request received from the trusted `peer`: the right-most
        forwarded address that is not a trusted proxy; the nearest trusted hop when the
        entry left of it is no address (`unknown`); `peer` when nothing was forwarded."""
        forwarded_for: list[bytes] = []
        forwarded: list[bytes] = []
        for name, value in headers:
            if name == _X_FORWARDED_FOR:
                forwarded_for.append(value)
            elif name == _FORWARDED:
                forwarded.append(value)
        if forwarded_for:
            entries = b",".join(forwarded_for).decode("latin-1").split(",")
        else:
            entries = _forwarded_for(b",".join(forwarded).decode("latin-1"))
        client = peer
        for entry in reversed(entries):
            address = _address(entry)
            if address is None:
                break
            client = str(address)
            if not self._trusts(address):
                break
        return client


def _forwarded_for(value: str) -> list[str]:
    """The `for=` of each element of a `Forwarded` header (RFC 7239), in order."""
    entries = []
    for element in value.split(","):
        for pair in element.split(";"):
            name, _, given = pair.strip().partition("=")
            if name.lower() == "for":
                entries.append(given)
    return entries


class ForwardedClients:
    """ASGI middleware: a request from a trusted proxy gets the client it was forwarded
    for as `scope["client"]`; any other keeps its peer."""

    def __init__(self, app: ASGIApp, proxies: TrustedProxies) -> None:
        self.app = app
        self.proxies = proxies

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            peer = scope.get("client")
            if peer is not None and self.proxies.trusts_peer(peer[0]):
                scope["client"] = (self.proxies.client(peer[0], scope["headers"]), 0)
        await self.app(scope, receive, send)
